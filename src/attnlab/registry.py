"""The one shape of attnlab's registries: the names a config chooses from (attention variants, depth recurrences,
task families), each mapped to what its registration declares.

A registry lives in a module of its own that the registering files import; the package that owns it imports its
built-in members, never the registry module, so registering and looking up import nothing back. Every registry
refuses a second registration of a name and an unknown name the same way, in one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

from attnlab.errors import ConfigError, UserError

Entry = TypeVar("Entry")


def check_option(kind: str, name: object, valid: Iterable[str], error: type[UserError] = ConfigError) -> None:
    """The one refusal of a name outside its options, registered or fixed: ``unknown <kind> 'x'; valid: a, b``
    (``valid`` in the order given), raised as ``error``, the user error of the floor that asks."""
    valid = list(valid)
    if name not in valid:
        raise error(f"unknown {kind} {name!r}; valid: {', '.join(valid)}")


class Registry(Generic[Entry]):
    """Names -> entries of one ``kind`` (its name in messages: "attention variant"); ``error`` is the exception an
    unknown name raises, a ``UserError`` of the floor that owns the registry (a config's choice by default)."""

    def __init__(self, kind: str, error: type[UserError] = ConfigError) -> None:
        self.kind = kind
        self.error = error
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, entry: Entry) -> Entry:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice ({self._entries[name]!r} and {entry!r})")
        self._entries[name] = entry
        return entry

    def get(self, name: str) -> Entry:
        check_option(self.kind, name, self.names(), self.error)
        return self._entries[name]

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self._entries)

    def items(self) -> Iterator[tuple[str, Entry]]:
        """(name, entry) of every registration, by name."""
        return ((name, self._entries[name]) for name in self.names())

    def __contains__(self, name: object) -> bool:
        return name in self._entries
