"""Table specs: the YAML that says which run records make each row and which metrics are columns.

Spec format (all keys but ``title``, ``metrics`` and ``rows`` optional)::

    title: Copy task
    paper: universal_transformer          # keys into paper_tables.yaml
    table: table4_algorithmic
    data: generated copy task, train lengths <= 40, test lengths <= 400   # for the caption
    match: {task: algo/copy}              # filter applied to every row
    notes: [free text footnotes]
    metrics:
      - ours: test/seq_acc                # name in results.json metrics.final (metrics.best with from: best)
        label: Seq. acc. (%)
        paper_key: copy_seq_acc
        direction: higher                 # higher | lower
        scale: 100                        # ours x scale is shown (fractions as percent)
        paper_scale: 100                  # paper x paper_scale is shown (default 1)
        digits: 2
    rows:
      - label: Transformer
        paper_row: Transformer
        match: {model.attention: vanilla, model.recurrence: stacked}  # or {experiment: <preset>}

Match values compare equal to the record field named by a dotted path; a list means any of; a string with
``*`` or ``?`` is a glob.

A table whose columns come from different runs (GLUE: one run per task) gives each metric its own
``match`` and each row the list of its runs; a column can be the mean of others, computed per seed over the
seeds every component has (a nested list is averaged first: a task reported with two metrics counts once,
as T5 averages GLUE)::

    metrics:
      - {ours: test/mcc, label: CoLA, match: {task: glue/cola}}
      - {ours: test/f1, label: MRPC F1, match: {task: glue/mrpc}}
      - {ours: test/acc, label: MRPC acc, match: {task: glue/mrpc}}
      - {label: Average, mean_of: [CoLA, [MRPC F1, MRPC acc]]}
    rows:
      - {label: Dense, match: {experiment: [syn/t4/dense_cola, syn/t4/dense_mrpc]}}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.results.errors import SpecError
from attnlab.results.safe_yaml import UnsafeYamlError, load_yaml


@dataclass
class MetricSpec:
    ours: str
    label: str
    direction: str = "higher"
    scale: float = 1.0
    paper_key: str | None = None
    paper_scale: float = 1.0
    digits: int = 2
    source: str = "final"  # which part of metrics: final | best
    match: dict[str, Any] = field(default_factory=dict)  # records of this column only (on top of the row's)
    mean_of: list[Any] | None = None  # labels of other metrics (nested lists averaged first)


@dataclass
class RowSpec:
    label: str
    match: dict[str, Any]
    paper_row: str | None = None


@dataclass
class TableSpec:
    name: str
    title: str
    metrics: list[MetricSpec]
    rows: list[RowSpec]
    paper: str | None = None
    table: str | None = None
    data: str | None = None
    match: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    path: Path | None = None


_SPEC_KEYS = {"title", "paper", "table", "data", "match", "notes", "metrics", "rows"}
_METRIC_KEYS = {"ours", "label", "direction", "scale", "paper_key", "paper_scale", "digits", "from", "match", "mean_of"}
_ROW_KEYS = {"label", "match", "paper_row"}


def _unknown(where: str, got: Mapping, allowed: set[str]) -> None:
    extra = sorted(set(got) - allowed)
    if extra:
        raise SpecError(f"{where}: unknown key(s) {', '.join(extra)} (valid: {', '.join(sorted(allowed))})")


def spec_from_dict(data: Any, name: str, where: str = "spec") -> TableSpec:
    """Validate a spec mapping; SpecError (one line) on the first problem."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: a table spec must be a mapping")
    _unknown(where, data, _SPEC_KEYS)
    for key in ("title", "metrics", "rows"):
        if key not in data:
            raise SpecError(f"{where}: missing key {key!r}")
    if bool(data.get("paper")) != bool(data.get("table")):
        raise SpecError(f"{where}: 'paper' and 'table' go together (keys into paper_tables.yaml)")
    metrics = []
    if not isinstance(data["metrics"], list) or not data["metrics"]:
        raise SpecError(f"{where}: 'metrics' must be a non-empty list")
    for i, m in enumerate(data["metrics"]):
        w = f"{where}: metrics[{i}]"
        if not isinstance(m, Mapping) or ("ours" in m) == ("mean_of" in m):
            raise SpecError(f"{w}: needs 'ours' (a metric name in results.json) or 'mean_of' (other columns)")
        _unknown(w, m, _METRIC_KEYS)
        if "mean_of" in m and ("label" not in m or "match" in m or "from" in m or "scale" in m):
            raise SpecError(f"{w}: a mean_of column needs a label and takes no match, from or scale")
        metric_match = m.get("match") or {}
        if not isinstance(metric_match, Mapping):
            raise SpecError(f"{w}: 'match' must be a mapping")
        direction = m.get("direction", "higher")
        if direction not in ("higher", "lower"):
            raise SpecError(f"{w}: direction must be higher or lower, got {direction!r}")
        source = m.get("from", "final")
        if source not in ("final", "best"):
            raise SpecError(f"{w}: from must be final or best, got {source!r}")
        try:
            scale, paper_scale = float(m.get("scale", 1)), float(m.get("paper_scale", 1))
            digits = int(m.get("digits", 2))
        except (TypeError, ValueError) as exc:
            raise SpecError(f"{w}: scale, paper_scale and digits must be numbers") from exc
        mean_of = m.get("mean_of")
        metrics.append(
            MetricSpec(
                ours=str(m["ours"]) if mean_of is None else f"mean of {_flat_labels(mean_of)}",
                label=str(m.get("label", m.get("ours"))),
                direction=direction,
                scale=scale,
                paper_key=m.get("paper_key"),
                paper_scale=paper_scale,
                digits=digits,
                source=source,
                match=dict(metric_match),
                mean_of=None if mean_of is None else list(mean_of),
            )
        )
    _check_means(metrics, where)
    rows = []
    if not isinstance(data["rows"], list) or not data["rows"]:
        raise SpecError(f"{where}: 'rows' must be a non-empty list")
    for i, r in enumerate(data["rows"]):
        w = f"{where}: rows[{i}]"
        if not isinstance(r, Mapping) or "label" not in r:
            raise SpecError(f"{w}: needs a 'label'")
        _unknown(w, r, _ROW_KEYS)
        match = r.get("match") or {}
        if not isinstance(match, Mapping) or not match:
            raise SpecError(f"{w}: needs a non-empty 'match' mapping (e.g. experiment: <preset name>)")
        rows.append(RowSpec(label=str(r["label"]), match=dict(match), paper_row=r.get("paper_row")))
    labels = [r.label for r in rows]
    if len(set(labels)) != len(labels):
        raise SpecError(f"{where}: row labels must be unique")
    match = data.get("match") or {}
    if not isinstance(match, Mapping):
        raise SpecError(f"{where}: 'match' must be a mapping")
    notes = data.get("notes") or []
    notes = [notes] if isinstance(notes, str) else [str(n) for n in notes]
    return TableSpec(
        name=name,
        title=str(data["title"]),
        metrics=metrics,
        rows=rows,
        paper=data.get("paper"),
        table=data.get("table"),
        data=data.get("data"),
        match=dict(match),
        notes=notes,
    )


def _flat_labels(items: Any) -> str:
    if not isinstance(items, list):
        return str(items)
    return "(" + ", ".join(_flat_labels(i) for i in items) + ")"


def _check_means(metrics: list[MetricSpec], where: str) -> None:
    labels = [m.label for m in metrics]
    if len(set(labels)) != len(labels):
        raise SpecError(f"{where}: metric labels must be unique")
    plain = {m.label for m in metrics if m.mean_of is None}
    for i, m in enumerate(metrics):
        if m.mean_of is None:
            continue
        if not m.mean_of:
            raise SpecError(f"{where}: metrics[{i}]: mean_of must be a non-empty list of metric labels")
        for item in m.mean_of:
            for label in item if isinstance(item, list) else [item]:
                if label not in plain:
                    raise SpecError(
                        f"{where}: metrics[{i}]: mean_of names {label!r}, which is not the label of an 'ours' "
                        f"column (labels: {', '.join(sorted(plain))})"
                    )


def list_specs(experiments_dir: str | os.PathLike) -> dict[str, Path]:
    """Spec name (``<paper>/<table>``) -> file, for every ``experiments/<paper>/<table>.yaml``."""
    root = Path(experiments_dir)
    if not root.is_dir():
        return {}
    return {f"{p.parent.name}/{p.stem}": p for p in sorted(root.glob("*/*.yaml")) if p.is_file()}


def load_spec(name: str, experiments_dir: str | os.PathLike) -> TableSpec:
    specs = list_specs(experiments_dir)
    if name not in specs:
        valid = ", ".join(specs) if specs else f"none found under {experiments_dir}"
        raise SpecError(f"unknown table {name!r}; valid: {valid}, all, summary")
    path = specs[name]
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read ({exc})") from exc
    except UnsafeYamlError as exc:
        raise SpecError(f"{path}: {exc}") from exc
    spec = spec_from_dict(data, name, where=str(path))
    spec.path = path
    return spec
