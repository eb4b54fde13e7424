"""Table specs, the paper-vs-ours table builder, and its writers (.md, .csv, .tex, .png).

A spec (``experiments/<paper>/<table>.yaml``) says which run records make each row and which metrics
are columns; the builder groups records by row, averages over seeds, puts the published number beside
ours and lists the runs behind every number. Missing runs are "missing" cells and failed runs "failed
(reason)" cells: a table is never stopped by a run that is not there, and never shows a 0 for it.

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

import csv
import fnmatch
import io
import math
import os
import statistics
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from attnlab.results.paper import NOT_FOUND, PaperTable, PaperTables, PaperTablesError
from attnlab.results.record import RecordError, file_mode, find_records, load_json, validate_record

PAPER_TABLES_FILENAME = "paper_tables.yaml"
CONFIDENCE_MARK = {"double-checked": "(d)", "single-source": "(s)", "uncertain": "(u)"}
NOT_IN_PAPER = "—"
MISSING = "missing"


class SpecError(Exception):
    """A table spec that cannot be used; the message is one line naming the file."""


class TableError(Exception):
    """Anything that stops a table from being built; one line, meant for the user."""


# ----------------------------------------------------------------------------------------------------------
# Specs


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


# laptop: the scale=cpu protocol of the table ({protocol, per_run_s, runs}), read by make reproduce-list.
_SPEC_KEYS = {"title", "paper", "table", "data", "match", "notes", "metrics", "rows", "laptop"}
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
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from exc
    spec = spec_from_dict(data, name, where=str(path))
    spec.path = path
    return spec


# ----------------------------------------------------------------------------------------------------------
# Loading records


@dataclass
class Loaded:
    path: Path
    data: dict[str, Any]


@dataclass
class Corrupt:
    path: Path
    message: str  # one line, names the file
    data: dict[str, Any] | None  # parsed JSON when it parsed (so it can still land in its row)


def corrupt_hint(message: str) -> str:
    return (
        f"corrupt run record: {message}. Fix: re-run that job, delete the file, "
        "or pass skip_corrupt=true to show it as a corrupt cell"
    )


def load_records(
    roots: Iterable[str | os.PathLike], skip_corrupt: bool = False
) -> tuple[list[Loaded], list[Corrupt]]:
    """Read every record under ``roots``. A corrupt one raises TableError unless ``skip_corrupt``."""
    loaded: list[Loaded] = []
    corrupt: list[Corrupt] = []
    for path in find_records(list(roots)):
        try:
            data = load_json(path)
        except RecordError as exc:
            if not skip_corrupt:
                raise TableError(corrupt_hint(str(exc))) from exc
            corrupt.append(Corrupt(path, str(exc), None))
            continue
        problems = validate_record(data)
        if problems:
            msg = f"{path}: not a valid run record: {'; '.join(problems[:3])}"
            if not skip_corrupt:
                raise TableError(corrupt_hint(msg))
            corrupt.append(Corrupt(path, msg, data if isinstance(data, dict) else None))
            continue
        loaded.append(Loaded(path, data))
    return loaded, corrupt


# ----------------------------------------------------------------------------------------------------------
# Matching and statistics


def get_field(record: Mapping[str, Any], dotted: str) -> Any:
    node: Any = record
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _value_matches(actual: Any, wanted: Any) -> bool:
    if isinstance(wanted, list):
        return any(_value_matches(actual, w) for w in wanted)
    if isinstance(wanted, str) and isinstance(actual, str) and any(c in wanted for c in "*?"):
        return fnmatch.fnmatchcase(actual, wanted)
    return actual == wanted


def matches(record: Mapping[str, Any], filters: Mapping[str, Any]) -> bool:
    return all(_value_matches(get_field(record, k), v) for k, v in filters.items())


@dataclass
class Stat:
    mean: float
    std: float | None  # sample std (n - 1); None for one seed
    n: int


def summarize(values: Sequence[float]) -> Stat | None:
    if not values:
        return None
    std = statistics.stdev(values) if len(values) > 1 else None
    return Stat(statistics.fmean(values), std, len(values))


@dataclass
class Cell:
    kind: str  # ok | missing | failed | running | corrupt
    stat: Stat | None = None
    note: str = ""  # e.g. "+1 failed" beside a number, or the failure reason


@dataclass
class PaperCell:
    value: Any = None  # number or string as published (after paper_scale); None -> n/a
    confidence: str | None = None
    kind: str = "value"  # value | null | not_in_paper | not_found


@dataclass
class RowResult:
    spec: RowSpec
    used: list[Loaded]  # completed records behind the numbers, one per seed
    failed: list[Loaded]
    running: list[Loaded]
    superseded: list[Loaded]  # older or failed records of a seed that has a better one
    corrupt: list[Corrupt]
    cells: list[Cell]
    paper: list[PaperCell]
    params: Stat | None
    tokens_per_s: Stat | None
    peak_mem_mb: Stat | None
    wall_s: Stat | None


@dataclass
class BuiltTable:
    spec: TableSpec
    rows: list[RowResult]
    paper_table: PaperTable | None
    paper_found: bool
    caption: str
    footnotes: list[str]
    corrupt_unplaced: list[Corrupt]

    @property
    def has_paper(self) -> bool:
        return bool(self.spec.paper)


_STATUS_RANK = {"completed": 0, "running": 1, "failed": 2}


def _pick_per_seed(records: list[Loaded], also_by: Sequence[str] = ()) -> tuple[list[Loaded], list[Loaded]]:
    """One record per seed (completed before running before failed, then the newest); the rest superseded.

    ``also_by``: further fields that tell runs of one row apart (the columns' match keys, e.g. task).
    """
    by_seed: dict[Any, list[Loaded]] = {}
    for rec in records:
        key = (rec.data.get("seed"), *(str(get_field(rec.data, f)) for f in also_by))
        by_seed.setdefault(key, []).append(rec)
    chosen, superseded = [], []
    for seed in sorted(by_seed, key=lambda s: (s[0] is None, str(s))):
        group = sorted(
            by_seed[seed],
            key=lambda r: (
                _STATUS_RANK.get(r.data.get("status"), 3),
                _neg_time(r.data.get("created")),
                str(r.path),
            ),
        )
        chosen.append(group[0])
        superseded.extend(group[1:])
    return chosen, superseded


def _neg_time(created: Any) -> str:
    # Sort newest first with a string key: invert each character of the ISO time.
    return "".join(chr(0x10FFFF - ord(c)) for c in str(created or ""))


def _metric_value(rec: Loaded, m: MetricSpec) -> float | None:
    value = get_field(rec.data, f"metrics.{m.source}")
    if not isinstance(value, Mapping):
        return None
    v = value.get(m.ours)
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v) * m.scale


def _one_line(text: str, limit: int = 80) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cost_stat(records: list[Loaded], dotted: str) -> Stat | None:
    vals = [get_field(r.data, dotted) for r in records]
    return summarize([float(v) for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)])


def _paper_cell(
    spec: TableSpec, row: RowSpec, m: MetricSpec, papers: PaperTables, ptable: PaperTable | None
) -> PaperCell:
    if not spec.paper:
        return PaperCell(kind="not_in_paper")
    if not papers.found:
        return PaperCell(kind="not_found")
    if not row.paper_row or not m.paper_key or ptable is None:
        return PaperCell(kind="not_in_paper")
    value = ptable.value(row.paper_row, m.paper_key)
    conf = ptable.cell_confidence_level(row.paper_row, m.paper_key)
    if value is None:
        return PaperCell(kind="null", confidence=conf)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and m.paper_scale != 1:
        value = float(f"{value * m.paper_scale:.12g}")  # 0.07 x 100 is 7.000000000000001 in binary
    return PaperCell(value=value, confidence=conf)


def build_table(
    spec: TableSpec, records: list[Loaded], papers: PaperTables, corrupt: Sequence[Corrupt] = ()
) -> BuiltTable:
    """Group records into the spec's rows and compute every cell; never raises for missing data."""
    ptable = None
    if spec.paper and papers.found:
        try:
            ptable = papers.table(spec.paper, spec.table)
            # A spec naming a row or metric the YAML lacks is a typo to fix, not a missing number.
            for row in spec.rows:
                if row.paper_row is not None and not ptable.has_row(row.paper_row):
                    raise PaperTablesError(f"no row {row.paper_row!r} (rows: {', '.join(ptable.rows)})")
            for m in spec.metrics:
                if m.paper_key and m.paper_key not in ptable.metrics:
                    raise PaperTablesError(
                        f"no metric {m.paper_key!r} (metrics: {', '.join(ptable.metrics)})"
                    )
        except PaperTablesError as exc:
            raise TableError(
                f"table {spec.name} ({spec.path or 'spec'}): paper {spec.paper}.{spec.table}: {exc}"
            ) from exc

    placed: set[Path] = set()
    rows: list[RowResult] = []
    for row in spec.rows:
        filters = {**spec.match, **row.match}
        mine = [r for r in records if matches(r.data, filters)]
        bad = [c for c in corrupt if c.data is not None and matches(c.data, filters)]
        placed.update(c.path for c in bad)
        column_keys = sorted({k for m in spec.metrics for k in m.match})
        chosen, superseded = _pick_per_seed(mine, column_keys)
        row_used = [r for r in chosen if r.data.get("status") == "completed"]
        cells = []
        per_seed: dict[str, dict[Any, float]] = {}
        for m in spec.metrics:
            if m.mean_of is not None:
                cells.append(_mean_cell(m, per_seed))
                continue
            mine_m = [r for r in chosen if matches(r.data, m.match)]
            used = [r for r in mine_m if r.data.get("status") == "completed"]
            failed = [r for r in mine_m if r.data.get("status") == "failed"]
            running = [r for r in mine_m if r.data.get("status") == "running"]
            scored = [(r, _metric_value(r, m)) for r in used]
            per_seed[m.label] = {r.data.get("seed"): v for r, v in scored if v is not None}
            values = [v for _, v in scored if v is not None]
            extras = []
            if failed:
                extras.append(f"+{len(failed)} failed")
            if running:
                extras.append(f"+{len(running)} running")
            if bad:
                extras.append(f"+{len(bad)} corrupt")
            if len(values) < len(used):
                extras.append(f"{len(used) - len(values)} without {m.ours}")
            if values:
                cells.append(Cell("ok", summarize(values), ", ".join(extras)))
            elif failed:
                cells.append(
                    Cell("failed", note=_one_line(failed[0].data.get("error") or "no reason recorded"))
                )
            elif running:
                cells.append(Cell("running"))
            elif bad:
                cells.append(Cell("corrupt"))
            else:
                cells.append(Cell("missing", note=f"no {m.ours} in record" if used else ""))
        paper = [_paper_cell(spec, row, m, papers, ptable) for m in spec.metrics]
        used = row_used
        rows.append(
            RowResult(
                spec=row,
                used=used,
                failed=[r for r in chosen if r.data.get("status") == "failed"],
                running=[r for r in chosen if r.data.get("status") == "running"],
                superseded=superseded,
                corrupt=bad,
                cells=cells,
                paper=paper,
                params=_cost_stat(used, "params.total"),
                tokens_per_s=_cost_stat(used, "cost.tokens_per_s"),
                peak_mem_mb=_cost_stat(used, "cost.peak_mem_mb"),
                wall_s=_cost_stat(used, "cost.wall_s"),
            )
        )
    unplaced = [c for c in corrupt if c.path not in placed]
    return BuiltTable(
        spec=spec,
        rows=rows,
        paper_table=ptable,
        paper_found=papers.found,
        caption=_caption(spec, rows, ptable, papers),
        footnotes=_footnotes(spec, ptable, papers),
        corrupt_unplaced=unplaced,
    )


def _mean_cell(m: MetricSpec, per_seed: Mapping[str, Mapping[Any, float]]) -> Cell:
    """The mean of other columns, per seed, over the seeds that every component has."""
    groups = [item if isinstance(item, list) else [item] for item in m.mean_of or []]
    seeds = None
    for label in (lab for g in groups for lab in g):
        have = set(per_seed.get(label, {}))
        seeds = have if seeds is None else seeds & have
    if not seeds:
        labels = [lab for g in groups for lab in g]
        lacking = [lab for lab in labels if not per_seed.get(lab)]
        if len(lacking) == len(labels):
            return Cell("missing")
        note = f"needs every column; none for {', '.join(lacking)}" if lacking else "no seed common to all columns"
        return Cell("missing", note=note)
    values = [
        statistics.fmean(statistics.fmean(per_seed[lab][seed] for lab in g) for g in groups)
        for seed in sorted(seeds, key=str)
    ]
    return Cell("ok", summarize(values))


def _distinct(values: Iterable[Any]) -> list[str]:
    return sorted({str(v) for v in values if v is not None})


# Command-line keys that pick the row, the seed, the scale, the hardware or where things go: every table
# varies or states these already, so the caption lists only the other overrides (e.g. trainer.max_steps=800).
_ROW_KEYS_IN_COMMANDS = ("experiment", "seed", "scale", "hardware", "paths.", "hydra", "logger", "+logger")


def _extra_overrides(command: Any) -> list[str]:
    if not isinstance(command, str):
        return []
    out = []
    for token in command.split():
        key = token.split("=", 1)[0].lstrip("+~")
        if "=" in token and not token.startswith("-") and not key.startswith(_ROW_KEYS_IN_COMMANDS):
            out.append(token)
    return out


def _caption(spec: TableSpec, rows: list[RowResult], ptable: PaperTable | None, papers: PaperTables) -> str:
    used = [r for row in rows for r in row.used]
    parts = []
    if used:
        counts = sorted({len(row.used) for row in rows if row.used})
        seeds = str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
        parts.append(
            f"Ours: mean ± sample std over {seeds} seed(s) per row (n in each cell); "
            f"scale: {', '.join(_distinct(r.data.get('scale') for r in used))}."
        )
    else:
        parts.append("Ours: no completed runs yet.")
    data = spec.data or ", ".join(_distinct(r.data.get("task") for r in used))
    if data:
        parts.append(f"Data: {data}.")
    flavours: dict[str, set[str]] = {}
    for r in used:
        for k, v in (r.data.get("metric_flavours") or {}).items():
            flavours.setdefault(k, set()).add(str(v))
    if flavours:
        text = "; ".join(
            f"{k}: {' | '.join(sorted(v))}" + (" (MIXED across runs)" if len(v) > 1 else "")
            for k, v in sorted(flavours.items())
        )
        parts.append(f"Metric flavour: {text}.")
    else:
        parts.append("Metric flavour: none recorded.")
    commits = sorted(
        {
            f"{(get_field(r.data, 'git.commit') or 'unknown')[:12]}"
            + ("+dirty" if get_field(r.data, "git.dirty") else "")
            for r in used
        }
    )
    if commits:
        parts.append(f"Git: {', '.join(commits)}.")
    extra = _distinct(o for r in used for o in _extra_overrides(r.data.get("command")))
    if extra:
        parts.append(f"Overrides beyond the presets: {' '.join(extra)}.")
    hw = _distinct(get_field(r.data, "hardware.name") for r in used)
    if hw:
        parts.append(f"Hardware: {', '.join(hw)}.")
    if spec.paper:
        if ptable is not None:
            cite = f" ({_one_line(ptable.citation, 120)})" if ptable.citation else ""
            parts.append(f"Paper: {spec.paper} {spec.table}{cite}, from paper_tables.yaml.")
        elif not papers.found:
            parts.append(f"Paper: {NOT_FOUND}.")
    return " ".join(parts)


def _footnotes(spec: TableSpec, ptable: PaperTable | None, papers: PaperTables) -> list[str]:
    notes = []
    if spec.paper and ptable is not None:
        notes.append(
            "Paper confidence: (d) double-checked in two sources, (s) single source, (u) uncertain "
            f"(table: {ptable.confidence or 'not stated'}); n/a = not found in any source (never guessed); "
            f"{NOT_IN_PAPER} = not in the paper."
        )
        for key, text in ptable.conflicts.items():
            notes.append(f"Paper conflict, {key}: {_one_line(text, 300)}")
        for key, text in ptable.cell_confidence.items():
            notes.append(f"Paper cell confidence, {key}: {_one_line(text, 300)}")
    notes.extend(spec.notes)
    return notes


# ----------------------------------------------------------------------------------------------------------
# Formatting


def fmt_num(x: float, digits: int) -> str:
    return f"{x:.{digits}f}"


def fmt_count(n: float) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}K"
    return f"{n:.0f}"


def fmt_stat(stat: Stat | None, digits: int, with_n: bool = True) -> str:
    if stat is None:
        return MISSING
    text = fmt_num(stat.mean, digits)
    if stat.std is not None:
        text += f" ± {fmt_num(stat.std, digits)}"
    return text + (f" (n={stat.n})" if with_n else "")


def fmt_cell(cell: Cell, digits: int) -> str:
    if cell.kind == "ok":
        return fmt_stat(cell.stat, digits) + (f" [{cell.note}]" if cell.note else "")
    if cell.kind == "failed":
        return f"failed ({cell.note})"
    if cell.kind == "missing":
        return MISSING + (f" ({cell.note})" if cell.note else "")
    return cell.kind


def fmt_paper(cell: PaperCell, digits: int) -> str:
    mark = CONFIDENCE_MARK.get(cell.confidence or "", "")
    if cell.kind == "not_found":
        return NOT_FOUND
    if cell.kind == "not_in_paper":
        return NOT_IN_PAPER
    if cell.kind == "null":
        return "n/a"
    v = cell.value
    if isinstance(v, float):
        # Keep the published precision when it is finer than ours (27.675 stays 27.675, 27.3 -> 27.30).
        text = repr(v) if len(repr(v).rsplit(".", 1)[-1]) > digits else fmt_num(v, digits)
    else:
        text = str(v)
    return f"{text} {mark}".strip()


def diff_value(cell: Cell, paper: PaperCell) -> float | None:
    if cell.kind != "ok" or paper.kind != "value":
        return None
    if isinstance(paper.value, bool) or not isinstance(paper.value, (int, float)):
        return None
    return cell.stat.mean - float(paper.value)


def fmt_diff(d: float | None, digits: int) -> str:
    return "" if d is None else f"{d:+.{digits}f}"


def header_and_rows(built: BuiltTable) -> tuple[list[str], list[list[str]]]:
    """The table as display strings (shared by the md and tex writers)."""
    header = ["Row"]
    for m in built.spec.metrics:
        arrow = "↑" if m.direction == "higher" else "↓"
        if built.has_paper:
            header += [f"{m.label} {arrow} paper", f"{m.label} ours", "Δ"]
        else:
            header += [f"{m.label} {arrow}"]
    header += ["Params", "Tokens/s", "Peak mem (MB)", "Wall (s)"]
    body = []
    for row in built.rows:
        cells = [row.spec.label]
        for m, cell, paper in zip(built.spec.metrics, row.cells, row.paper):
            if built.has_paper:
                cells += [
                    fmt_paper(paper, m.digits),
                    fmt_cell(cell, m.digits),
                    fmt_diff(diff_value(cell, paper), m.digits),
                ]
            else:
                cells.append(fmt_cell(cell, m.digits))
        have = bool(row.used)
        cells += [
            fmt_count(row.params.mean) if row.params else (MISSING if not have else "n/a"),
            fmt_num(row.tokens_per_s.mean, 0) if row.tokens_per_s else (MISSING if not have else "n/a"),
            fmt_num(row.peak_mem_mb.mean, 0) if row.peak_mem_mb else (MISSING if not have else "n/a"),
            fmt_num(row.wall_s.mean, 1) if row.wall_s else (MISSING if not have else "n/a"),
        ]
        body.append(cells)
    return header, body


def _source_lines(built: BuiltTable) -> list[tuple[str, list[str]]]:
    out = []
    for row in built.rows:
        lines = []
        for tag, recs in (
            ("", row.used),
            ("failed", row.failed),
            ("running", row.running),
            ("superseded", row.superseded),
        ):
            for r in recs:
                d = r.data
                what = f"seed {d.get('seed')}, {d.get('status')}, config {str(d.get('config_hash'))[:12]}"
                if tag == "superseded":
                    what += ", superseded by a newer or better record of the same seed"
                lines.append(f"`{_rel(r.path)}` ({what}): `{d.get('command')}`")
        for c in row.corrupt:
            lines.append(f"`{c.path}` (corrupt): {c.message}")
        out.append((row.spec.label, lines))
    return out


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|")


def render_markdown(built: BuiltTable) -> str:
    header, body = header_and_rows(built)
    lines = [f"# {built.spec.title}", "", f"Table `{built.spec.name}`. {built.caption}", ""]
    lines.append("| " + " | ".join(_md_escape(h) for h in header) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    for cells in body:
        lines.append("| " + " | ".join(_md_escape(c) for c in cells) + " |")
    lines.append("")
    if built.footnotes:
        lines += [f"- {_md_escape(n)}" for n in built.footnotes] + [""]
    lines += ["## Sources", ""]
    for label, srcs in _source_lines(built):
        lines.append(f"- **{_md_escape(label)}**" + (": no run records" if not srcs else ""))
        lines += [f"  - {s}" for s in srcs]
    if built.corrupt_unplaced:
        lines += ["", "## Corrupt run records (not placed in any row)", ""]
        lines += [f"- {c.message}" for c in built.corrupt_unplaced]
    return "\n".join(lines) + "\n"


def render_csv(built: BuiltTable) -> str:
    """Tidy CSV: one line per (row, metric), numbers unformatted, for notebooks and diffs."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        [
            "row", "metric", "label", "direction", "paper", "paper_confidence", "paper_status",
            "ours_mean", "ours_std", "n", "diff", "status", "note",
            "params_total", "tokens_per_s", "peak_mem_mb", "wall_s", "run_dirs",
        ]
    )  # fmt: skip
    for row in built.rows:
        for m, cell, paper in zip(built.spec.metrics, row.cells, row.paper):
            d = diff_value(cell, paper)
            w.writerow(
                [
                    row.spec.label,
                    m.ours,
                    m.label,
                    m.direction,
                    "" if paper.kind != "value" else paper.value,
                    paper.confidence or "",
                    {"value": "ok", "null": "n/a", "not_in_paper": "not_in_paper", "not_found": "not_found"}[
                        paper.kind
                    ],
                    "" if cell.stat is None else repr(cell.stat.mean),
                    "" if cell.stat is None or cell.stat.std is None else repr(cell.stat.std),
                    0 if cell.stat is None else cell.stat.n,
                    "" if d is None else repr(d),
                    cell.kind,
                    cell.note,
                    "" if row.params is None else repr(row.params.mean),
                    "" if row.tokens_per_s is None else repr(row.tokens_per_s.mean),
                    "" if row.peak_mem_mb is None else repr(row.peak_mem_mb.mean),
                    "" if row.wall_s is None else repr(row.wall_s.mean),
                    ";".join(_rel(r.path) for r in row.used),
                ]
            )
    return buf.getvalue()


_TEX = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
    "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$", "Δ": r"$\Delta$",
    "↑": r"$\uparrow$", "↓": r"$\downarrow$", "†": r"\dag{}", "‡": r"\ddag{}", "—": "---", "…": r"\dots{}",
}  # fmt: skip


def tex_escape(text: str) -> str:
    return "".join(_TEX.get(c, c) for c in str(text))


def render_tex(built: BuiltTable) -> str:
    header, body = header_and_rows(built)
    lines = [
        f"% Generated by attnlab-table from run records; table {built.spec.name}. Do not edit by hand.",
        "% Needs \\usepackage{booktabs}.",
        "\\begin{table}[t]",
        "\\centering",
        "\\small",
        f"\\caption{{{tex_escape(built.spec.title + '. ' + built.caption)}}}",
        f"\\label{{tab:{built.spec.name.replace('/', ':')}}}",
        "\\begin{tabular}{l" + "r" * (len(header) - 1) + "}",
        "\\toprule",
        " & ".join(tex_escape(h) for h in header) + " \\\\",
        "\\midrule",
    ]
    lines += [" & ".join(tex_escape(c) for c in cells) + " \\\\" for cells in body]
    lines += ["\\bottomrule", "\\end{tabular}"]
    for note in built.footnotes:
        lines.append(f"\\par\\footnotesize {tex_escape(note)}")
    lines.append("\\end{table}")
    for label, srcs in _source_lines(built):
        lines.append(
            f"% source {label}: " + (" | ".join(srcs) if srcs else "no run records").replace("\n", " ")
        )
    return "\n".join(lines) + "\n"


def render_png(built: BuiltTable) -> bytes:
    """Ours vs paper per row (one panel per metric), and quality vs cost; deterministic bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = built.spec.metrics[:6]
    labels = [r.spec.label for r in built.rows]
    ncols = len(metrics) + 1
    fig, axes = plt.subplots(1, ncols, figsize=(4.2 * ncols, 0.45 * len(labels) + 2.2), squeeze=False)
    axes = axes[0]
    ys = list(range(len(labels)))
    for ax, (mi, m) in zip(axes, enumerate(metrics)):
        means = [r.cells[mi].stat.mean if r.cells[mi].kind == "ok" else math.nan for r in built.rows]
        stds = [(r.cells[mi].stat.std or 0.0) if r.cells[mi].kind == "ok" else 0.0 for r in built.rows]
        ax.barh(ys, [0 if math.isnan(v) else v for v in means], xerr=stds, color="tab:blue", alpha=0.8,
                label="ours (mean ± std)")  # fmt: skip
        for y, v, r in zip(ys, means, built.rows):
            if math.isnan(v):
                ax.text(0, y, f" {r.cells[mi].kind}", va="center", fontsize=7, color="tab:red")
        paper_x = [
            float(p.value) if p.kind == "value" and isinstance(p.value, (int, float)) else math.nan
            for p in (r.paper[mi] for r in built.rows)
        ]
        if any(not math.isnan(v) for v in paper_x):
            ax.plot(paper_x, ys, "D", color="black", label="paper")
        ax.set_yticks(ys)
        ax.set_yticklabels(labels if mi == 0 else [""] * len(labels), fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{m.label} ({'higher' if m.direction == 'higher' else 'lower'} is better)", fontsize=9)
        ax.legend(fontsize=7, loc="best")
    ax = axes[-1]
    m0 = built.spec.metrics[0]
    use_tps = any(r.tokens_per_s for r in built.rows)
    plotted = False
    for r in built.rows:
        cost = r.tokens_per_s if use_tps else r.wall_s
        if r.cells[0].kind == "ok" and cost is not None:
            ax.plot([cost.mean], [r.cells[0].stat.mean], "o", color="tab:blue")
            ax.annotate(r.spec.label, (cost.mean, r.cells[0].stat.mean), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")  # fmt: skip
            plotted = True
    if not plotted:
        ax.text(
            0.5, 0.5, "no completed runs with cost data", ha="center", va="center", transform=ax.transAxes
        )
    ax.set_xlabel("tokens/s (higher is cheaper)" if use_tps else "wall time (s)", fontsize=8)
    ax.set_ylabel(m0.label, fontsize=8)
    ax.set_title("quality vs cost", fontsize=9)
    ax.margins(0.25)  # room for the row labels beside the points
    fig.suptitle(built.spec.title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    # No Software/date metadata so `make tables` regenerates the file byte for byte.
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def render_all(built: BuiltTable, out_dir: str | os.PathLike, plot: bool = True) -> dict[Path, bytes]:
    """File path -> content for one table: ``<out>/<paper>/<table>.{md,csv,tex,png}``."""
    base = Path(out_dir) / built.spec.name
    files = {
        base.with_suffix(".md"): render_markdown(built).encode("utf-8"),
        base.with_suffix(".csv"): render_csv(built).encode("utf-8"),
        base.with_suffix(".tex"): render_tex(built).encode("utf-8"),
    }
    if plot:
        files[base.with_suffix(".png")] = render_png(built)
    return files


def write_files_atomically(files: Mapping[Path, bytes]) -> list[Path]:
    """Write every file to a temp name beside it, then rename all; on any error remove the temps."""
    temps: list[tuple[str, Path]] = []
    mode = file_mode()
    try:
        for path, content in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            temps.append((tmp, path))
            os.chmod(tmp, mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(content)
        for tmp, path in temps:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in temps:
            Path(tmp).unlink(missing_ok=True)
        raise
    return [p for _, p in temps]


# ----------------------------------------------------------------------------------------------------------
# Summary of any run folders (``make demo``)


def _rel(path: Path) -> str:
    try:
        return str(path.parent.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.parent)


def render_summary(records: list[Loaded], corrupt: Sequence[Corrupt] = ()) -> str:
    """A markdown table of every record found with its key metrics (test/* if any, else val/*)."""
    finals = [r.data["metrics"]["final"] for r in records]
    names = sorted({k for f in finals for k in f if k.startswith("test/")}) or sorted(
        {k for f in finals for k in f if k.startswith("val/")}
    )
    header = ["run", "status", "experiment", "task", "attention", "recurrence", "seed", "scale", *names,
              "params", "tokens/s", "wall (s)"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in sorted(records, key=lambda r: str(r.path)):
        d = r.data
        final = d["metrics"]["final"]
        status = d["status"] + (
            f" ({_one_line(d.get('error') or '', 60)})" if d["status"] == "failed" else ""
        )
        params, tps, wall = (get_field(d, k) for k in ("params.total", "cost.tokens_per_s", "cost.wall_s"))
        cells = [
            _rel(r.path), status, d.get("experiment"), d.get("task"), get_field(d, "model.attention"),
            get_field(d, "model.recurrence"), d.get("seed"), d.get("scale"),
            *[MISSING if final.get(n) is None else f"{final[n]:.4g}" for n in names],
            "n/a" if params is None else fmt_count(params),
            "n/a" if tps is None else f"{tps:.0f}",
            "n/a" if wall is None else f"{wall:.1f}",
        ]  # fmt: skip
        cells = ["" if c is None else str(c) for c in cells]
        lines.append("| " + " | ".join(_md_escape(c) for c in cells) + " |")
    for c in corrupt:
        lines.append(f"\ncorrupt: {c.message}")
    if not records and not corrupt:
        return "no run records found\n"
    return "\n".join(lines) + "\n"
