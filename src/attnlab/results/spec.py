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
        paper_part: 1                     # a paper cell printed as a pair "F1/acc": 1 takes F1, 2 takes acc
        digits: 2
        trivial: {baseline: constant_output, margin: 5}   # the task's trivial baseline (attnlab.tasks.trivial)
    rows:
      - label: Transformer
        paper_row: Transformer
        match: {model.attention: vanilla, model.recurrence: stacked}  # or {experiment: <preset>}
    preregistered:                        # fixed before any published run: read once, at n seeds, at 95%
      date: 2026-12-06                    # the day the spec was fixed (runs created before it do not count)
      seeds: 8                            # n (each row's n lowest seeds), or the list of seeds
      sizing: two pilot seeds (101, 102), never published, gave sd 0.4; n = 8 resolves a 1-point margin

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

import dataclasses
import datetime
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.errors import SpecError
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
    source: str = field(default="final", metadata={"key": "from"})  # which part of metrics: final | best
    match: dict[str, Any] = field(default_factory=dict)  # records of this column only (on top of the row's)
    mean_of: list[Any] | None = None  # labels of other metrics (nested lists averaged first)
    paper_part: int | None = None  # 1 or 2: which number of a paper cell printed as a pair ("F1/acc", "F1a/EM")
    trivial: TrivialSpec | None = None  # the task's trivial baseline on this column (see TrivialSpec)


@dataclass
class TrivialSpec:
    """The task's trivial baseline on one column and how far a row must beat it before claims count.

    ``baseline`` names a function of :mod:`attnlab.tasks.trivial` (e.g. ``story_free_answer``); ``attnlab-baselines``
    computes it for every run behind the table from the run's own task configuration and writes
    ``results/baselines/<paper>/<table>.json``. A ``mean_of`` column takes the mean of its columns' baselines and
    names none. ``margin`` is in the column's shown units: a row beats the baseline when every run of it is better
    by more than the margin.
    """

    margin: float
    baseline: str | None = None


@dataclass
class RowSpec:
    label: str
    match: dict[str, Any]
    paper_row: str | None = None


# claim test -> (low, high, low_open, high_open) of the difference a - b, as a function of the margin m.
CLAIM_TESTS: dict[str, Any] = {
    "greater": lambda m: (m, math.inf, True, True),  # a > b + m
    "at_least": lambda m: (-m, math.inf, False, True),  # a >= b - m
    "less": lambda m: (-math.inf, -m, True, True),  # a < b - m
    "at_most": lambda m: (-math.inf, m, True, False),  # a <= b + m
    "within": lambda m: (-m, m, False, False),  # |a - b| <= m
}


@dataclass
class Requirement:
    """What the runs of a row must show for a claim to be tested at all (e.g. BigBird really sparse).

    ``rows`` holds one row label, or several when it is enough that one of them meets the bound in every run
    (e.g. "UT above the Transformer" says something once either row does better than a context-free output).
    """

    rows: tuple[str, ...] = field(metadata={"key": "row"})
    field: str  # a dotted record field, e.g. extra.attention_coverage.attended_fraction_mean
    at_most: float | None = None
    at_least: float | None = None
    # another field of the same record subtracted from ``field`` before the bound: e.g. the order-free score
    # (bits on shuffled blocks) minus the score in order, so the bound says how much a row gains from word order
    minus: str | None = None

    def describe(self) -> str:
        bound = f"<= {self.at_most:g}" if self.at_most is not None else f">= {self.at_least:g}"
        what = self.field if self.minus is None else f"{self.field} − {self.minus}"
        return f"{' or '.join(self.rows)}: {what} {bound}"


@dataclass
class ClaimSpec:
    """One qualitative claim of the paper, checkable over the rows: ``a - b`` of ``metric`` lies in a range.

    ``b`` is a row label or a number (a fixed level, e.g. chance). ``margin`` is in the column's shown units.
    """

    claim: str  # the claim in words, e.g. "Random Synthesizer within 1 BLEU of Transformer"
    source: str  # the paper's sentence it comes from (quoted), or where it is read from ("Table 4 rows")
    metric: str  # a metric label of this spec
    a: str  # a row label
    b: str | float  # a row label, or a number
    test: str  # greater | at_least | less | at_most | within
    margin: float = 0.0
    requires: list[Requirement] = field(default_factory=list)  # preconditions on the runs (else inconclusive)
    caveat: str = ""  # what else differs between the rows (a confound), printed beside the verdict
    # Independent test items behind one run's number (sequences, not the answers within one): where every seed of
    # the compared rows sits at the ceiling (100%), the exact binomial bound over the pooled items decides the claim
    # instead of a zero-width interval (attnlab.results.claims).
    items: int | None = None
    # the table that counts this claim (the same claim of the same paper table, read another way: Synthesizer
    # Tables 4-5 from scratch and through the T5 path); shown here, counted once there
    counted_in: str | None = None

    def claimed_range(self) -> tuple[float, float, bool, bool]:
        return CLAIM_TESTS[self.test](self.margin)

    def statement(self) -> str:
        """The claim as an inequality over the rows, e.g. ``|Random - Transformer| <= 1 on BLEU``."""
        m = f"{self.margin:g}"
        text = {
            "greater": f"{self.a} > {self.b}" + (f" + {m}" if self.margin else ""),
            "at_least": f"{self.a} ≥ {self.b}" + (f" − {m}" if self.margin else ""),
            "less": f"{self.a} < {self.b}" + (f" − {m}" if self.margin else ""),
            "at_most": f"{self.a} ≤ {self.b}" + (f" + {m}" if self.margin else ""),
            "within": f"|{self.a} − {self.b}| ≤ {m}",
        }[self.test]
        needs = "".join(f", if {r.describe()}" for r in self.requires)
        return f"{text} on {self.metric}{needs}"


@dataclass
class LaptopSpec:
    """The laptop protocol of a table: what its small version is and its measured cost per run."""

    protocol: str
    per_run_s: float | None = None  # measured wall seconds of one run on the 2-core CPU (None: not measured)
    runs: int | None = None  # the runs the protocol trains (rows x seeds)


@dataclass
class GpuSpec:
    """The one-GPU protocol of a table (``scale=gpu``): what it is, and its cost per run once measured on a GPU.

    A protocol starting with "None" says why the table has none (its data is not local). Without a measured
    ``per_run_s`` the time is estimated from FLOPs (``attnlab.results.gpu_estimate``)."""

    protocol: str
    per_run_s: float | None = None  # measured seconds of one run on ``device`` (None: not measured on a GPU)
    device: str | None = None  # the GPU, torch and CUDA versions behind per_run_s


@dataclass
class PreregisteredSpec:
    """A table fixed before any of its published seeds ran: it is read once, at a fixed n, at 95%.

    ``seeds``: the listed seeds (n = how many), or None when the spec gives only n: then each row's n lowest seeds
    are read, whatever their status (a failed low seed is never swapped for a later completed one). Seeds beyond
    them are never read; a claim waits ("not run") until every one of its rows has all n completed. ``date``: the
    day the spec was fixed; a run created before it is not part of the pre-registered experiment. ``sizing``: how
    n and the margins were chosen (pilot seeds that are never published).
    """

    date: str  # YYYY-MM-DD
    n: int = field(metadata={"key": None})  # how many seeds: given by ``seeds``
    seeds: tuple[int, ...] | None
    sizing: str

    def describe(self) -> str:
        which = f"seeds {', '.join(map(str, self.seeds))}" if self.seeds else f"the {self.n} lowest seeds"
        return f"Pre-registered {self.date}: {self.n} seeds per row ({which}), read once; sizing: {self.sizing}"


@dataclass
class TableSpec:
    name: str = field(metadata={"key": None})  # <paper>/<table>, from the file's place
    title: str
    metrics: list[MetricSpec]
    rows: list[RowSpec]
    paper: str | None = None
    table: str | None = None
    data: str | None = None
    match: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    claims: list[ClaimSpec] = field(default_factory=list)
    laptop: LaptopSpec | None = None
    gpu: GpuSpec | None = None
    path: Path | None = field(default=None, metadata={"key": None})
    # paper: a table of a paper, built from preset runs of that paper's table | probe: a mechanism probe
    # (experiments/probes/), built only from runs of probe presets (experiment names under PROBE_PREFIX) and
    # never from a paper table's runs, nor the reverse; probe_of names the experiments folder it probes.
    kind: str = "paper"
    probe_of: str | None = None
    preregistered: PreregisteredSpec | None = None  # fixed before its runs: one look at n seeds, 95%

    @property
    def claims_group(self) -> str | None:
        """Whose "what held" block lists this table's claims: its paper, or ``probes`` for a probe."""
        return "probes" if self.kind == "probe" else self.paper

    def metric(self, label: str) -> MetricSpec:
        return next(m for m in self.metrics if m.label == label)


KINDS = ("paper", "probe")
PROBE_PREFIX = "probes/"  # experiment names of probe presets start with it


def spec_keys(cls: type) -> frozenset[str]:
    """The keys a spec block may hold, read from its dataclass (as ``record.py`` reads the record schema): every
    field under the name a spec writes (``metadata["key"]``, e.g. ``from`` for ``source``), less the fields a
    spec never writes (``metadata["key"] = None``: derived, or filled in by the loader)."""
    keys = (f.metadata.get("key", f.name) for f in dataclasses.fields(cls))
    return frozenset(k for k in keys if k is not None)


def required_keys(cls: type) -> tuple[str, ...]:
    """The keys of ``cls`` a spec must give: its fields without a default, in their order."""
    return tuple(f.metadata.get("key", f.name) for f in dataclasses.fields(cls)
                 if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                 and f.metadata.get("key", f.name) is not None)


_SPEC_KEYS = spec_keys(TableSpec)
_CLAIM_KEYS = spec_keys(ClaimSpec)
_REQUIRE_KEYS = spec_keys(Requirement)
_LAPTOP_KEYS = spec_keys(LaptopSpec)
_GPU_KEYS = spec_keys(GpuSpec)
_METRIC_KEYS = spec_keys(MetricSpec)
_TRIVIAL_KEYS = spec_keys(TrivialSpec)
_PREREGISTERED_KEYS = spec_keys(PreregisteredSpec)
_ROW_KEYS = spec_keys(RowSpec)


def _unknown(where: str, got: Mapping, allowed: frozenset[str]) -> None:
    extra = sorted(set(got) - allowed)
    if extra:
        raise SpecError(f"{where}: unknown key(s) {', '.join(extra)} (valid: {', '.join(sorted(allowed))})")


def spec_from_dict(data: Any, name: str, where: str = "spec") -> TableSpec:
    """Validate a spec mapping; SpecError (one line) on the first problem."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: a table spec must be a mapping")
    _unknown(where, data, _SPEC_KEYS)
    for key in required_keys(TableSpec):
        if key not in data:
            raise SpecError(f"{where}: missing key {key!r}")
    if bool(data.get("paper")) != bool(data.get("table")):
        raise SpecError(f"{where}: 'paper' and 'table' go together (keys into paper_tables.yaml)")
    kind = data.get("kind", "paper")
    if kind not in KINDS:
        raise SpecError(f"{where}: kind={kind!r}; valid: {', '.join(KINDS)}")
    if kind == "probe" and (data.get("paper") or not data.get("probe_of")):
        raise SpecError(f"{where}: a probe names the experiments folder it probes (probe_of: <paper folder>) and "
                        "has no paper/table keys: it has no paper numbers")
    if kind == "paper" and data.get("probe_of"):
        raise SpecError(f"{where}: probe_of belongs to a probe; add kind: probe or remove probe_of")
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
        paper_part = m.get("paper_part")
        if paper_part is not None and (
            paper_part not in (1, 2) or isinstance(paper_part, bool) or not m.get("paper_key")
        ):
            raise SpecError(
                f"{w}: paper_part must be 1 or 2 (the first or second number of a paper cell 'a/b'), with a paper_key"
            )
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
                paper_part=paper_part,
                trivial=_trivial(m.get("trivial"), mean_of is not None, w),
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
    notes = [notes] if isinstance(notes, str) else notes
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise SpecError(
            f"{where}: notes must be a list of text lines; quote a note that holds ': ' (unquoted YAML reads it "
            "as a mapping)"
        )
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
        claims=_claims(data.get("claims"), metrics, labels, where),
        laptop=_laptop(data.get("laptop"), where),
        gpu=_gpu(data.get("gpu"), where),
        kind=kind,
        probe_of=data.get("probe_of"),
        preregistered=_preregistered(data.get("preregistered"), where),
    )


def _claims(items: Any, metrics: list[MetricSpec], rows: list[str], where: str) -> list[ClaimSpec]:
    if items is None:
        return []
    if not isinstance(items, list):
        raise SpecError(f"{where}: 'claims' must be a list")
    out = []
    metric_labels = [m.label for m in metrics]
    for i, c in enumerate(items):
        w = f"{where}: claims[{i}]"
        if not isinstance(c, Mapping):
            raise SpecError(f"{w}: a claim must be a mapping with keys {', '.join(sorted(_CLAIM_KEYS))}")
        _unknown(w, c, _CLAIM_KEYS)
        for key in required_keys(ClaimSpec):
            if c.get(key) in (None, ""):
                raise SpecError(f"{w}: missing key {key!r} (a claim says what, from which sentence, on which rows)")
        if c["test"] not in CLAIM_TESTS:
            raise SpecError(f"{w}: test must be one of {', '.join(CLAIM_TESTS)}, got {c['test']!r}")
        if c["metric"] not in metric_labels:
            raise SpecError(f"{w}: metric {c['metric']!r} is not a metric label (labels: {', '.join(metric_labels)})")
        b = c["b"]
        is_number = _is_number(b)
        for key, row in (("a", c["a"]), ("b", b)):
            if not (key == "b" and is_number) and row not in rows:
                raise SpecError(f"{w}: {key}={row!r} is not a row label (rows: {', '.join(rows)})")
        if c["a"] == b:
            raise SpecError(f"{w}: a and b name the same row")
        margin = c.get("margin", 0)
        if not _is_number(margin) or margin < 0:
            raise SpecError(f"{w}: margin must be a number >= 0 (in the column's shown units)")
        if c["test"] == "within" and margin == 0:
            raise SpecError(f"{w}: a 'within' claim needs a margin > 0")
        requires = _requirements(c.get("requires"), rows, w)
        items = c.get("items")
        if items is not None and (not _is_number(items, int) or items < 1):
            raise SpecError(f"{w}: items must be the whole number of independent test items behind one run (>= 1)")
        out.append(
            ClaimSpec(
                requires=requires,
                claim=str(c["claim"]),
                source=str(c["source"]),
                metric=str(c["metric"]),
                a=str(c["a"]),
                b=float(b) if is_number else str(b),
                test=str(c["test"]),
                margin=float(margin),
                caveat=str(c.get("caveat") or ""),
                items=items,
                counted_in=_table_name(c.get("counted_in"), w),
            )
        )
    return out


def _table_name(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value.split("/")) != 2 or not all(value.split("/")):
        raise SpecError(f"{where}: counted_in must name a table, <paper>/<table> (got {value!r})")
    return value


def _is_number(value: Any, kinds: type | tuple[type, ...] = (int, float)) -> bool:
    """A YAML number of ``kinds``; Python counts a bool as an int, a spec never does."""
    return isinstance(value, kinds) and not isinstance(value, bool)


def _requirements(items: Any, rows: list[str], where: str) -> list[Requirement]:
    if items is None:
        return []
    items = [items] if isinstance(items, Mapping) else items
    if not isinstance(items, list):
        raise SpecError(f"{where}: requires must be a mapping or a list of them")
    out = []
    for i, r in enumerate(items):
        w = f"{where}: requires[{i}]"
        if not isinstance(r, Mapping) or not r.get("row") or not r.get("field"):
            raise SpecError(f"{w}: needs row (a row label, or a list of them), field and at_most or at_least")
        _unknown(w, r, _REQUIRE_KEYS)
        labels = r["row"] if isinstance(r["row"], list) else [r["row"]]
        for label in labels:
            if not isinstance(label, str) or label not in rows:
                raise SpecError(f"{w}: row {label!r} is not a row label (rows: {', '.join(rows)})")
        if len(set(labels)) != len(labels):
            raise SpecError(f"{w}: row lists a label twice")
        bounds = [r.get(k) for k in ("at_most", "at_least")]
        if sum(b is not None for b in bounds) != 1 or any(
            b is not None and not _is_number(b) for b in bounds
        ):
            raise SpecError(f"{w}: give exactly one of at_most or at_least, a number")
        minus = r.get("minus")
        if minus is not None and (not isinstance(minus, str) or not minus):
            raise SpecError(f"{w}: minus must name a dotted record field (subtracted from field)")
        out.append(Requirement(tuple(labels), str(r["field"]), *(None if b is None else float(b) for b in bounds),
                               minus=minus))
    return out


def _mapping_block(data: Any, where: str, block: str, keys: frozenset[str], needs: str) -> str:
    """Check that a spec block is a mapping with only ``keys``; where its messages point."""
    w = f"{where}: {block}"
    if not isinstance(data, Mapping):
        raise SpecError(f"{w}: needs a mapping with {needs}")
    _unknown(w, data, keys)
    return w


def _preregistered(data: Any, where: str) -> PreregisteredSpec | None:
    if data is None:
        return None
    w = _mapping_block(data, where, "preregistered", _PREREGISTERED_KEYS,
                       "date (YYYY-MM-DD), seeds (a list, or n) and sizing (text)")
    day = data.get("date")
    # The safe loader reads an unquoted 2026-12-06 as a date; a quoted one stays text and must parse the same.
    text = day.isoformat() if isinstance(day, datetime.date) and not isinstance(day, datetime.datetime) else day
    try:
        if not isinstance(text, str) or datetime.date.fromisoformat(text).isoformat() != text:
            raise ValueError
    except ValueError as exc:
        raise SpecError(f"{w}: date must be the day the spec was fixed, YYYY-MM-DD (got {day!r})") from exc
    seeds = data.get("seeds")
    if _is_number(seeds, int):
        listed, n = None, int(seeds)
    elif isinstance(seeds, list) and all(_is_number(s, int) for s in seeds):
        if len(set(seeds)) != len(seeds):
            raise SpecError(f"{w}: seeds lists a seed twice")
        listed, n = tuple(sorted(seeds)), len(seeds)
    else:
        raise SpecError(f"{w}: seeds must be a list of whole numbers or a whole number n (got {seeds!r})")
    if n < 2:
        raise SpecError(f"{w}: seeds must give at least 2 seeds per row (an interval needs two)")
    sizing = data.get("sizing")
    if not isinstance(sizing, str) or not sizing.strip():
        raise SpecError(f"{w}: sizing must say how n and the margins were chosen (pilot seeds never published)")
    return PreregisteredSpec(date=text, n=n, seeds=listed, sizing=" ".join(sizing.split()))


def _trivial(data: Any, is_mean: bool, where: str) -> TrivialSpec | None:
    if data is None:
        return None
    w = _mapping_block(data, where, "trivial", _TRIVIAL_KEYS, "baseline (a name in attnlab.tasks.trivial) and margin")
    margin = data.get("margin")
    if not _is_number(margin) or margin < 0:
        raise SpecError(f"{w}: margin must be a number >= 0 in the column's shown units")
    name = data.get("baseline")
    if is_mean and name is not None:
        raise SpecError(f"{w}: a mean_of column takes the mean of its columns' baselines; give only margin")
    if not is_mean and not (isinstance(name, str) and name):
        raise SpecError(f"{w}: needs baseline, the name of a trivial baseline (attnlab.tasks.trivial.BASELINES)")
    return TrivialSpec(margin=float(margin), baseline=name)


def _protocol_block(data: Any, where: str, block: str, keys: frozenset[str], later: str) -> tuple[str, float | None]:
    """Check a ``laptop:`` / ``gpu:`` block (a mapping with ``protocol`` and only ``keys``); where its messages
    point, and its ``per_run_s``."""
    w = f"{where}: {block}"
    if not isinstance(data, Mapping) or not data.get("protocol"):
        raise SpecError(f"{w}: needs a mapping with 'protocol' ({later})")
    _unknown(w, data, keys)
    per_run = data.get("per_run_s")
    if per_run is not None and (not _is_number(per_run) or per_run <= 0):
        raise SpecError(f"{w}: per_run_s must be a measured number of seconds > 0, or absent")
    return w, None if per_run is None else float(per_run)


def _laptop(data: Any, where: str) -> LaptopSpec | None:
    if data is None:
        return None
    w, per_run = _protocol_block(data, where, "laptop", _LAPTOP_KEYS, "and per_run_s, runs once measured")
    runs = data.get("runs")
    if runs is not None and (not _is_number(runs, int) or runs <= 0):
        raise SpecError(f"{w}: runs must be a whole number > 0, or absent")
    return LaptopSpec(protocol=str(data["protocol"]), per_run_s=per_run, runs=runs)


def _gpu(data: Any, where: str) -> GpuSpec | None:
    if data is None:
        return None
    w, per_run = _protocol_block(data, where, "gpu", _GPU_KEYS, "and per_run_s with device once measured on a GPU")
    device = data.get("device")
    if (per_run is None) != (device is None):
        raise SpecError(f"{w}: per_run_s and device go together (the seconds, and the GPU, torch and CUDA behind them)")
    return GpuSpec(protocol=str(data["protocol"]), per_run_s=per_run, device=None if device is None else str(device))


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
                if m.trivial is not None and next(x for x in metrics if x.label == label).trivial is None:
                    raise SpecError(f"{where}: metrics[{i}]: a mean_of column with trivial needs a trivial baseline on "
                                    f"each of its columns; {label!r} has none")


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
