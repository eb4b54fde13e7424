"""The spec's keys are read from its dataclasses (issue 51 point 5), as the record schema is."""

from __future__ import annotations

import dataclasses

import pytest

from attnlab.errors import SpecError
from attnlab.results import spec as specs


@pytest.mark.parametrize("cls", [specs.TableSpec, specs.MetricSpec, specs.RowSpec, specs.ClaimSpec,
                                 specs.Requirement, specs.TrivialSpec, specs.LaptopSpec, specs.GpuSpec,
                                 specs.PreregisteredSpec])
def test_every_field_is_a_spec_key_under_its_written_name(cls):
    keys = specs.spec_keys(cls)
    for f in dataclasses.fields(cls):
        written = f.metadata.get("key", f.name)
        assert (written in keys) == (written is not None), (cls.__name__, f.name)


def test_the_written_names_that_differ_from_the_fields():
    assert "from" in specs.spec_keys(specs.MetricSpec) and "source" not in specs.spec_keys(specs.MetricSpec)
    assert "row" in specs.spec_keys(specs.Requirement) and "rows" not in specs.spec_keys(specs.Requirement)
    assert not {"name", "path"} & specs.spec_keys(specs.TableSpec)
    assert specs.required_keys(specs.TableSpec) == ("title", "metrics", "rows")


def test_an_unknown_key_lists_the_keys_the_dataclass_gives():
    data = {"title": "t", "metrics": [{"ours": "test/acc", "colour": "red"}],
            "rows": [{"label": "a", "match": {"x": 1}}]}
    with pytest.raises(SpecError, match=r"metrics\[0\]: unknown key\(s\) colour \(valid: digits, direction, from, "):
        specs.spec_from_dict(data, "p/t")
