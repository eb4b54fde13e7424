"""The registry shape every name a config chooses goes through (attention variants, recurrences, task families)."""

import pytest

from attnlab.errors import UserError
from attnlab.registry import Registry


class UnknownThing(UserError):
    pass


def test_names_are_sorted_and_an_unknown_name_is_one_line_listing_them():
    things = Registry("thing", UnknownThing)
    things.register("b", 2)
    things.register("a", 1)
    assert things.names() == ["a", "b"] and things.get("b") == 2 and "a" in things and "c" not in things
    with pytest.raises(UnknownThing, match=r"^unknown thing 'c'; valid: a, b$"):
        things.get("c")


def test_a_name_registered_twice_is_refused_and_the_first_entry_stays():
    things = Registry("thing")
    things.register("a", 1)
    with pytest.raises(ValueError, match="thing 'a' is registered twice"):
        things.register("a", 2)
    assert things.get("a") == 1


@pytest.mark.parametrize(("module", "registry", "error"), [
    ("attnlab.attention.registry", "ATTENTION_VARIANTS", "AttentionError"),
    ("attnlab.models.recurrence", "RECURRENCES", "ConfigError"),
    ("attnlab.tasks.registry", "TASK_FAMILIES", "DataError"),
])
def test_each_registry_refuses_an_unknown_name_with_its_floors_error(module, registry, error):
    import importlib

    found = getattr(importlib.import_module(module), registry)
    with pytest.raises(Exception) as info:
        found.get("nope")
    assert type(info.value).__name__ == error and str(info.value).startswith(f"unknown {found.kind} 'nope'; valid: ")
