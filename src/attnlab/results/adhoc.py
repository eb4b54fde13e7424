"""``attnlab-table runs=<folder> by=<key,...> [claim="A > B on M"]``: a table of any runs folder without a spec.

A sweep (``attnlab-train -m model/attention=vanilla,qknorm seed=1,2,3``) varies a few config keys; ``by`` names
them. Each distinct value (or combination) is a row, named ``key=value``; its cell is the mean ± std over the
row's seeds, with the rules of the paper tables: runs whose configurations differ in anything but the seed are
refused within one row, debug runs never count. The columns are the runs' test metrics (every split), or
``metrics=``. Where one trivial baseline of :mod:`attnlab.tasks.trivial` applies to the runs' task, the command
computes it from the task's data (``training.trivial_baselines.adhoc_baseline``) and it is shown, as the paper
tables show theirs. ``claim="ut > stacked on test/seq_acc"`` (also ``<``, ``>=``, ``<=``) is decided like a spec's
claim: Welch's t interval over the seeds, held / not held / inconclusive; a row is named by its label or value.
"""

from __future__ import annotations

import re
from typing import Any

from attnlab.errors import TableError
from attnlab.results.baselines import TableBaselines
from attnlab.results.build import BuiltTable, build_table, get_field
from attnlab.results.loading import Loaded
from attnlab.results.paper import load_paper_tables
from attnlab.results.spec import spec_from_dict

ROW_FIELD = "adhoc_row"  # the field each record gets here: the label of its row
_CLAIM = re.compile(r"^\s*(?P<a>.+?)\s*(?P<op>>=|<=|>|<)\s*(?P<b>.+?)\s+on\s+(?P<metric>\S+)\s*$")
_TESTS = {">": "greater", "<": "less", ">=": "at_least", "<=": "at_most"}
_LOWER_IS_BETTER = ("loss", "ppl", "nll", "bpc", "bits", "error", "wer")


def _value(record: Loaded, key: str) -> Any:
    """The record's value of ``key``: a header field (``model.attention``), else its saved config."""
    missing = object()
    found = get_field(record.data, key, missing) if hasattr(record.data, "get") else missing
    if found is not missing and not isinstance(found, dict):
        return found
    config = record.config
    for name in (key, f"{key}.name", f"override:{key}"):
        if name in config:
            return config[name]
    return missing


def _label(keys: list[str], values: tuple) -> str:
    return ", ".join(f"{k}={v}" for k, v in zip(keys, values))


def group_rows(records: list[Loaded], by: list[str]) -> list[str]:
    """Label every record with its row (``ROW_FIELD``); the labels in order. TableError when a key is absent."""
    labels: dict[str, None] = {}
    for record in records:
        values = []
        for key in by:
            value = _value(record, key)
            if not isinstance(value, (str, int, float, bool, type(None))):
                raise TableError(f"by={key}: {record.path} has no value for {key} (a record field or a key of the "
                                 f"config saved beside it, e.g. model.attention or optim.lr)")
            values.append(value)
        label = _label(by, tuple(values))
        record.data[ROW_FIELD] = label
        labels[label] = None
    return sorted(labels)


def _metrics(records: list[Loaded], wanted: list[str]) -> list[str]:
    found = sorted({k for r in records for k, v in (get_field(r.data, "metrics.final") or {}).items()
                    if k.split("/", 1)[0].startswith("test") and "/" in k and isinstance(v, (int, float))})
    if not wanted:
        if not found:
            raise TableError("the runs have no numeric test metric; name the columns with metrics=")
        return found
    return wanted


def _source(records: list[Loaded], metric: str) -> str:
    """Where the runs keep ``metric``: ``final``, else ``best`` where only that has it (the validation metrics: a
    record's final metrics are its test splits'; ``val/loss`` there is what attnlab-train returned to a sweeper)."""
    for part in ("final", "best"):
        if any(isinstance((get_field(r.data, f"metrics.{part}") or {}).get(metric), (int, float)) for r in records):
            return part
    return "final"


def _row_named(name: str, labels: list[str]) -> str:
    if name in labels:
        return name
    by_value = [label for label in labels if label.split("=", 1)[-1] == name]
    if len(by_value) == 1:
        return by_value[0]
    raise TableError(f"claim names row {name!r}; rows: {', '.join(labels)} (a label, or the value of a one-key row)")


def parse_claim(text: str, labels: list[str], metrics: list[str]) -> dict[str, Any]:
    """A spec claim from ``"A > B on M"``."""
    m = _CLAIM.match(text or "")
    if not m:
        raise TableError(f"claim={text!r}: write it as \"A > B on METRIC\" (also <, >=, <=), e.g. "
                         f"\"{labels[0] if labels else 'ut'} > {labels[-1] if labels else 'stacked'} on "
                         f"{metrics[0] if metrics else 'test/seq_acc'}\"")
    if m["metric"] not in metrics:
        raise TableError(f"claim names metric {m['metric']!r}; the columns are {', '.join(metrics)}")
    return {"claim": text.strip(), "source": "given on the command line", "metric": m["metric"],
            "a": _row_named(m["a"], labels), "b": _row_named(m["b"], labels), "test": _TESTS[m["op"]]}


def adhoc_records(records: list[Loaded], runs: list[str]) -> list[Loaded]:
    """The records an ad-hoc table counts: completed, not debug runs; TableError where there are none."""
    completed = [r for r in records if r.data.get("status") == "completed" and not get_field(r.data, "extra.debug")]
    if not completed:
        raise TableError(f"no completed (non-debug) run records under {', '.join(runs)}")
    return completed


def build_adhoc_table(completed: list[Loaded], runs: list[str], by: list[str], metrics: list[str],
                      claim: str | None, baseline: tuple[str, TableBaselines] | None) -> BuiltTable:
    """The table of ``adhoc_records`` by the keys ``by``; ``baseline``: the trivial baseline that applies to their
    task (``training.trivial_baselines.adhoc_baseline``), or None."""
    labels = group_rows(completed, by)
    columns = _metrics(completed, metrics)
    sources = {m: _source(completed, m) for m in columns}
    label = {m: m if sources[m] == "final" else f"{m} (best)" for m in columns}
    with_baseline = set()
    if baseline is not None:
        with_baseline = {k for e in baseline[1].entries.values() for k in e["values"]}
    spec = {
        "title": f"Runs under {', '.join(runs)} by {', '.join(by)}",
        "data": ", ".join(sorted({str(r.data.get('task')) for r in completed})),
        "match": {"extra.debug": None},
        "metrics": [
            {"ours": m, "label": label[m], "from": sources[m], "digits": 4,
             "direction": "lower" if any(w in m.split("/")[-1] for w in _LOWER_IS_BETTER) else "higher",
             **({"trivial": {"baseline": baseline[0], "margin": 0}} if m in with_baseline else {})}
            for m in columns
        ],
        "rows": [{"label": label, "match": {ROW_FIELD: label}} for label in labels],
    }
    if claim:
        parsed = parse_claim(claim, labels, columns)
        spec["claims"] = [{**parsed, "metric": label[parsed["metric"]]}]
    built_spec = spec_from_dict(spec, "adhoc", where="attnlab-table by=")
    return build_table(built_spec, completed, load_paper_tables(None), [], baseline[1] if baseline else None)
