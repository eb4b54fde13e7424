"""The table builder: group run records into a spec's rows, average over seeds, put the paper beside ours.

Missing runs are "missing" cells and failed runs "failed (reason)" cells: a table is never stopped by a run
that is not there, and never shows a 0 for it. Rendering is elsewhere (``attnlab.results.render``).
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.errors import TableError
from attnlab.results.baselines import TableBaselines
from attnlab.results.configs import config_groups, differing_keys, get_field
from attnlab.results.loading import Corrupt, Loaded
from attnlab.results.paper import NOT_FOUND, PaperTable, PaperTables, PaperTablesError
from attnlab.results.record import UNFINISHED
from attnlab.results.spec import PROBE_PREFIX, MetricSpec, PreregisteredSpec, RowSpec, TableSpec
from attnlab.results.stats import Stat, summarize

NOT_IN_PAPER = "—"


def _value_matches(actual: Any, wanted: Any) -> bool:
    if isinstance(wanted, list):
        return any(_value_matches(actual, w) for w in wanted)
    if isinstance(wanted, str) and isinstance(actual, str) and any(c in wanted for c in "*?"):
        return fnmatch.fnmatchcase(actual, wanted)
    return actual == wanted


def matches(record: Mapping[str, Any], filters: Mapping[str, Any]) -> bool:
    return all(_value_matches(get_field(record, k), v) for k, v in filters.items())


@dataclass
class Cell:
    kind: str  # ok | missing | failed | running | interrupted | corrupt
    stat: Stat | None = None
    note: str = ""  # e.g. "+1 failed" beside a number, or the failure reason
    values: list[float] = field(default_factory=list)  # one per seed behind ``stat`` (what claims test)
    at_paper_scale: bool = False  # every run behind it is at the paper's scale: only then is a Δ meaningful


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
    unfinished: list[Loaded]  # running, or interrupted and resumable
    superseded: list[Loaded]  # older or failed records of a seed that has a better one
    corrupt: list[Corrupt]
    cells: list[Cell]
    paper: list[PaperCell]
    params: Stat | None
    tokens_per_s: Stat | None
    peak_mem_mb: Stat | None
    wall_s: Stat | None
    not_read: list[Loaded] = field(default_factory=list)  # seeds beyond a pre-registered table's n: never read


@dataclass
class BuiltTable:
    spec: TableSpec
    rows: list[RowResult]
    paper_table: PaperTable | None
    paper_found: bool
    caption_lines: list[tuple[str, str]]  # (label, text): Ours, Scale, Data, Metric flavour, Paper, Provenance, ...
    footnotes: list[str]
    corrupt_unplaced: list[Corrupt]
    baselines: TableBaselines | None = None  # the trivial baselines of the runs (results/baselines/<table>.json)
    # The results of the spec's claims, evaluated once per built table by ``claims.claims_of`` and read from here by
    # every page that shows them (the table's page and LaTeX, results/CLAIMS.md, the results index, README blocks).
    claims: list[Any] | None = field(default=None, repr=False, compare=False)

    @property
    def caption(self) -> str:
        return caption_text(self.caption_lines)

    @property
    def has_paper(self) -> bool:
        return bool(self.spec.paper)

    @property
    def show_diff(self) -> bool:
        """A Δ column only where some cell of ours is at the paper's scale (see :func:`diff_value`)."""
        return self.has_paper and any(c.at_paper_scale for r in self.rows for c in r.cells)


_STATUS_RANK = {"completed": 0, "running": 1, "interrupted": 1, "failed": 2}


def _pick_per_seed(records: list[Loaded], also_by: Sequence[str] = ()) -> tuple[list[Loaded], list[Loaded]]:
    """One record per seed (completed before unfinished before failed, then the newest); the rest superseded.

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


def preregistered_seeds(chosen: list[Loaded], prereg: PreregisteredSpec) -> tuple[list[Loaded], list[Loaded]]:
    """(the records of the pre-registered seeds, the rest): the listed seeds, or else the n lowest seeds of the row
    whatever their status, so a failed or unfinished low seed is never replaced by a later one that went well."""
    seeds = sorted({r.data.get("seed") for r in chosen if _is_seed(r.data.get("seed"))})
    wanted = set(prereg.seeds) if prereg.seeds is not None else set(seeds[: prereg.n])
    kept = [r for r in chosen if _is_seed(r.data.get("seed")) and r.data.get("seed") in wanted]
    return kept, [r for r in chosen if r not in kept]


def _is_seed(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _neg_time(created: Any) -> str:
    # Sort newest first with a string key: invert each character of the ISO time.
    return "".join(chr(0x10FFFF - ord(c)) for c in str(created or ""))


def metric_value(rec: Loaded, m: MetricSpec) -> float | None:
    """The record's value of a plain column, in the column's shown units (None when absent or not finite).
    ``ours`` names a metric of ``metrics.<from>``, or a dotted record field under ``extra.`` (e.g.
    ``extra.attention_coverage.attended_fraction_mean``)."""
    if m.ours.startswith("extra."):
        v = get_field(rec.data, m.ours)
    else:
        value = get_field(rec.data, f"metrics.{m.source}")
        if not isinstance(value, Mapping):
            return None
        v = value.get(m.ours)
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v) * m.scale


def one_line(text: str, limit: int = 80) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cost_stat(records: list[Loaded], dotted: str) -> Stat | None:
    """Mean and spread of a cost field over ``records``; a non-finite value (a NaN or Infinity written by hand
    or by a clock gone wrong) counts as not recorded: cost describes a run, it is not its result."""
    vals = [get_field(r.data, dotted) for r in records]
    return summarize([float(v) for v in vals
                      if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)])


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
    pair = isinstance(value, str) and len(value.split("/")) == 2
    if pair and m.paper_part is None:
        raise TableError(
            f"table {spec.name}: paper cell {row.paper_row}.{m.paper_key} holds two numbers ({value}); give the "
            f"column {m.label!r} paper_part: 1 or 2 and the other number a column of its own"
        )
    if m.paper_part is not None:
        if not pair:  # a single number is the first of the pair; the paper printed no second one
            return PaperCell(value=value, confidence=conf) if m.paper_part == 1 else PaperCell(kind="not_in_paper")
        try:
            value = float(value.split("/")[m.paper_part - 1])
        except ValueError:
            return PaperCell(value=value.split("/")[m.paper_part - 1].strip(), confidence=conf)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and m.paper_scale != 1:
        value = float(f"{value * m.paper_scale:.12g}")  # 0.07 x 100 is 7.000000000000001 in binary
    return PaperCell(value=value, confidence=conf)


def build_table(
    spec: TableSpec, records: list[Loaded], papers: PaperTables, corrupt: Sequence[Corrupt] = (),
    baselines: TableBaselines | None = None,
) -> BuiltTable:
    """Group records into the spec's rows and compute every cell; never raises for missing data.

    ``baselines``: the trivial baselines of the runs (columns with ``trivial:``), shown in the caption and required
    by the claims; without them those claims read inconclusive ("not computed")."""
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
                    raise PaperTablesError(f"no metric {m.paper_key!r} (metrics: {', '.join(ptable.metrics)})")
        except PaperTablesError as exc:
            raise TableError(
                f"table {spec.name} ({spec.path or 'spec'}): paper {spec.paper}.{spec.table}: {exc}"
            ) from exc

    placed: set[Path] = set()
    rows: list[RowResult] = []
    for row in spec.rows:
        filters = {**spec.match, **row.match}
        mine = [r for r in records if matches(r.data, filters)]
        if not mine:
            _refuse_unknown_experiment(spec, row, filters.get("experiment"))
        _refuse_other_kind(spec, row, mine)
        bad = [c for c in corrupt if c.data is not None and matches(c.data, filters)]
        placed.update(c.path for c in bad)
        column_keys = sorted({k for m in spec.metrics for k in m.match})
        chosen, superseded = _pick_per_seed(mine, column_keys)
        not_read: list[Loaded] = []
        if spec.preregistered is not None:
            chosen, not_read = preregistered_seeds(chosen, spec.preregistered)
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
            unfinished = [r for r in mine_m if r.data.get("status") in UNFINISHED]
            _refuse_mixed_configs(spec, row, m, used)
            scored = [(r, metric_value(r, m)) for r in used]
            per_seed[m.label] = {r.data.get("seed"): v for r, v in scored if v is not None}
            values = [v for _, v in scored if v is not None]
            extras = []
            if failed:
                extras.append(f"+{len(failed)} failed")
            for status in UNFINISHED:
                if count := sum(r.data.get("status") == status for r in unfinished):
                    extras.append(f"+{count} {status}")
            if bad:
                extras.append(f"+{len(bad)} corrupt")
            if len(values) < len(used):
                extras.append(f"{len(used) - len(values)} without {m.ours}")
            if values:
                at_paper = all(r.data.get("scale") == "paper" for r, v in scored if v is not None)
                cells.append(Cell("ok", summarize(values), ", ".join(extras), values, at_paper))
            elif failed:
                cells.append(Cell("failed", note=one_line(failed[0].data.get("error") or "no reason recorded")))
            elif unfinished:
                cells.append(Cell(unfinished[0].data["status"]))
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
                unfinished=[r for r in chosen if r.data.get("status") in UNFINISHED],
                superseded=superseded,
                corrupt=bad,
                cells=cells,
                paper=paper,
                params=_cost_stat(used, "params.total"),
                tokens_per_s=_cost_stat(used, "cost.tokens_per_s"),
                peak_mem_mb=_cost_stat(used, "cost.peak_mem_mb"),
                wall_s=_cost_stat(used, "cost.wall_s"),
                not_read=not_read,
            )
        )
    unplaced = [c for c in corrupt if c.path not in placed]
    return BuiltTable(
        spec=spec,
        rows=rows,
        paper_table=ptable,
        paper_found=papers.found,
        caption_lines=_caption(spec, rows, ptable, papers) + _trivial_caption(spec, rows, baselines),
        footnotes=_footnotes(spec, ptable, papers),
        corrupt_unplaced=unplaced,
        baselines=baselines,
    )


def run_values(row: RowResult, metrics: Sequence[MetricSpec], index: int,
               baselines: TableBaselines | None) -> list[tuple[float, float | None]]:
    """(our value, the run's trivial baseline) per seed of one cell, in shown units; the baseline is None where it
    was not computed. A mean_of column averages both the way its cell does (per seed, over common seeds)."""
    m = metrics[index]
    if m.mean_of is None:
        out = []
        for rec in row.used:
            if not matches(rec.data, m.match):
                continue
            value = metric_value(rec, m)
            if value is not None:
                base = None if baselines is None else baselines.value(rec.data, m.ours)
                out.append((value, None if base is None else base * m.scale))
        return out
    by_label = {x.label: x for x in metrics}
    groups = [item if isinstance(item, list) else [item] for item in m.mean_of]
    per_seed: dict[str, dict[Any, tuple[float, float | None]]] = {}
    for label in (lab for g in groups for lab in g):
        component = by_label[label]
        per_seed[label] = {}
        for rec in row.used:
            if matches(rec.data, component.match) and (value := metric_value(rec, component)) is not None:
                base = None if baselines is None else baselines.value(rec.data, component.ours)
                per_seed[label][rec.data.get("seed")] = (value, None if base is None else base * component.scale)
    seeds = set.intersection(*(set(v) for v in per_seed.values())) if per_seed else set()
    out = []
    for seed in sorted(seeds, key=str):
        value = group_mean(groups, lambda lab, s=seed: per_seed[lab][s][0])
        known = all(per_seed[lab][seed][1] is not None for g in groups for lab in g)
        out.append((value, group_mean(groups, lambda lab, s=seed: per_seed[lab][s][1]) if known else None))
    return out


def _trivial_caption(spec: TableSpec, rows: list[RowResult],
                     baselines: TableBaselines | None) -> list[tuple[str, str]]:
    """The caption's baseline line: per column with a trivial baseline its value(s) over the runs, what it is,
    the margin."""
    parts = []
    for i, m in enumerate(spec.metrics):
        if m.trivial is None:
            continue
        pairs = [p for row in rows for p in run_values(row, spec.metrics, i, baselines)]
        values = sorted({round(b, m.digits) for _, b in pairs if b is not None})
        if not pairs:
            continue
        if not values:
            parts.append(f"{m.label} not computed (make baselines)")
            continue
        shown = "-".join(dict.fromkeys(f"{v:.{m.digits}f}" for v in (values[0], values[-1])))
        missing = sum(b is None for _, b in pairs)
        parts.append(f"{m.label} {shown}" + (f" ({missing} runs not computed)" if missing else ""))
    if not parts:
        return []
    whats = sorted({e["what"] for e in (baselines.entries.values() if baselines else [])})
    margins = sorted({f"{m.label} {m.trivial.margin:g}" for m in spec.metrics if m.trivial is not None
                      and m.trivial.margin})
    return [("Trivial baseline", f"{', '.join(parts)} ({'; '.join(whats) or 'not computed'}; computed from the data "
             f"by make baselines); a claim is decided only when the better of its rows beats it in every run"
             + (f" by more than {', '.join(margins)}" if margins else ""))]


def _refuse_other_kind(spec: TableSpec, row: RowSpec, mine: list[Loaded]) -> None:
    """TableError when a probe's row picks a run of a paper preset, or a paper table's row a probe's run: the
    two are never mixed (a probe's runs test a mechanism on generated data, not a paper's table)."""
    for r in mine:
        is_probe = str(r.data.get("experiment") or "").startswith(PROBE_PREFIX)
        if is_probe != (spec.kind == "probe"):
            what = "a probe's run" if is_probe else "a run that is not a probe's"
            raise TableError(f"table {spec.name} ({spec.kind}), row {row.label!r} matches {what} ({r.path}); "
                             f"probe tables read experiments under {PROBE_PREFIX} only and paper tables never do: "
                             "narrow the row's match")


# The presets a spec row may name (conf/ ships inside the package, so this holds for an installed attnlab too).
PRESETS_DIR = Path(__file__).resolve().parents[1] / "conf" / "experiment"


def _refuse_unknown_experiment(spec: TableSpec, row: RowSpec, wanted: Any) -> None:
    """TableError for a row that names an experiment which is neither a preset nor any record's: a typo in
    the spec would otherwise show as a row of "missing" cells forever."""
    for name in wanted if isinstance(wanted, list) else [wanted]:
        if not isinstance(name, str) or any(c in name for c in "*?") or (PRESETS_DIR / f"{name}.yaml").is_file():
            continue
        presets = [p.relative_to(PRESETS_DIR).with_suffix("").as_posix() for p in PRESETS_DIR.rglob("*.yaml")]
        close = difflib.get_close_matches(name, presets, n=1)
        raise TableError(f"table {spec.name} ({spec.path or 'spec'}): row {row.label!r} matches experiment "
                         f"{name!r}, which is no preset under conf/experiment and no record's experiment"
                         + (f"; did you mean {close[0]!r}?" if close else ""))


def _refuse_mixed_configs(spec: TableSpec, row: RowSpec, m: MetricSpec, used: list[Loaded]) -> None:
    """TableError when the runs of one cell differ in anything but the seed (they are not seeds of one run)."""
    groups = config_groups([r.config for r in used])
    if len(groups) < 2:
        return
    first, other = used[groups[0][0]], used[groups[1][0]]
    keys = differing_keys(first.config, other.config)
    shown = "; ".join(f"{k}: {first.config[k]!r} vs {other.config[k]!r}" for k in keys[:3])
    raise TableError(
        f"table {spec.name}, row {row.label!r}, {m.label}: its runs are {len(groups)} different configurations, "
        f"not seeds of one ({shown}{'; ...' if len(keys) > 3 else ''}; e.g. {first.path} and {other.path}); "
        "a cell pools one configuration: remove the other runs from runs=, or give each its own row"
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
    values = [group_mean(groups, lambda lab, s=seed: per_seed[lab][s]) for seed in sorted(seeds, key=str)]
    return Cell("ok", summarize(values), values=values)  # no Δ: the paper's average is over other tasks


def group_mean(groups: Sequence[Sequence[str]], value_of) -> float:
    """A mean_of column's value: the mean over its groups of each group's mean (T5 counts a two-number task once)."""
    return statistics.fmean(statistics.fmean(value_of(lab) for lab in g) for g in groups)


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


def _caption(spec: TableSpec, rows: list[RowResult], ptable: PaperTable | None,
             papers: PaperTables) -> list[tuple[str, str]]:
    """The caption as short labelled lines (what a reader looks up: scale, data, metric, paper, provenance)."""
    used = [r for row in rows for r in row.used]
    lines: list[tuple[str, str]] = []
    if used:
        counts = sorted({len(row.used) for row in rows if row.used})
        seeds = str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
        lines.append(("Ours", f"mean ± sample std over {seeds} seed(s) per row (n in each cell)"))
        scale = ", ".join(_distinct(r.data.get("scale") for r in used))
        if spec.paper and not any(c.at_paper_scale for row in rows for c in row.cells):
            scale += (" (no Δ column: our runs are at laptop scale, not the paper's (model, data and steps are "
                      "smaller), so ours and the paper's numbers stand side by side for orientation, not as a "
                      "difference)")
        lines.append(("Scale", scale))
    else:
        lines.append(("Ours", "no completed runs yet"))
    data = spec.data or ", ".join(_distinct(r.data.get("task") for r in used))
    if data:
        lines.append(("Data", data.rstrip(".")))
    flavours: dict[str, set[str]] = {}
    for r in used:
        for k, v in (r.data.get("metric_flavours") or {}).items():
            flavours.setdefault(k, set()).add(str(v))
    text = "; ".join(
        f"{k}: {' | '.join(sorted(v))}" + (" (MIXED across runs)" if len(v) > 1 else "")
        for k, v in sorted(flavours.items())
    )
    lines.append(("Metric flavour", text or "none recorded"))
    if spec.paper:
        if ptable is not None:
            cite = f" ({one_line(ptable.citation, 120)})" if ptable.citation else ""
            lines.append(("Paper", f"{spec.paper} {spec.table}{cite}, from paper_tables.yaml"))
        elif not papers.found:
            lines.append(("Paper", NOT_FOUND))
    provenance = []
    commits = sorted(
        {
            f"{(get_field(r.data, 'git.commit') or 'unknown')[:12]}"
            + ("+dirty" if get_field(r.data, "git.dirty") else "")
            for r in used
        }
    )
    if commits:
        provenance.append(f"git {', '.join(commits)}")
    hw = _distinct(get_field(r.data, "hardware.name") for r in used)
    if hw:
        provenance.append(f"hardware {', '.join(hw)}")
    extra = _distinct(o for r in used for o in _extra_overrides(r.data.get("command")))
    if extra:
        provenance.append(f"overrides beyond the presets: {' '.join(extra)}")
    if provenance:
        lines.append(("Provenance", "; ".join(provenance)))
    return lines


def caption_text(lines: list[tuple[str, str]]) -> str:
    """The labelled lines as one paragraph (a LaTeX caption)."""
    return " ".join(f"{label}: {text.rstrip('.')}." for label, text in lines)


def _footnotes(spec: TableSpec, ptable: PaperTable | None, papers: PaperTables) -> list[str]:
    notes = []
    if spec.paper and ptable is not None:
        notes.append(
            "Paper confidence: (d) double-checked in two sources, (s) single source, (u) uncertain "
            f"(table: {ptable.confidence or 'not stated'}); n/a = not found in any source (never guessed); "
            f"{NOT_IN_PAPER} = not in the paper."
        )
        for key, text in ptable.conflicts.items():
            notes.append(f"Paper conflict, {key}: {one_line(text, 300)}")
        for key, text in ptable.cell_confidence.items():
            notes.append(f"Paper cell confidence, {key}: {one_line(text, 300)}")
    notes.extend(spec.notes)
    return notes


def diff_value(cell: Cell, paper: PaperCell) -> float | None:
    """Ours minus the paper's, only where our runs are at the paper's scale (a laptop run is no replica)."""
    if cell.kind != "ok" or paper.kind != "value" or not cell.at_paper_scale:
        return None
    if isinstance(paper.value, bool) or not isinstance(paper.value, (int, float)):
        return None
    return cell.stat.mean - float(paper.value)
