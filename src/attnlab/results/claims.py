"""Evaluating a table's claims over the seeds: held, not held, inconclusive, or not run.

The rule (stated in every table and in results/CLAIMS.md, see :data:`RULE`): a claim says that the difference
``a - b`` of one metric (``b`` a row or a fixed number) lies in a range (``greater``: above the margin;
``at_least``: at or above minus the margin; ``less``/``at_most`` the mirror images; ``within``: between
minus and plus the margin). Over the seeds of each row we compute Welch's t interval of the difference
of means (the one-sample t interval when ``b`` is a number) at Pocock's per-look level for the two looks at the
data the seed rule takes (3 seeds, then 5 where inconclusive; :data:`attnlab.results.stats.CONFIDENCE`). The claim

- **held** when the whole interval lies inside the claimed range,
- **not held** when the whole interval lies outside it,
- **inconclusive** when the interval straddles an edge of the range (the difference is too small for the
  seeds we have), when a row has fewer than two seeds (no interval can be formed), or when the runs miss a
  precondition of the claim (``requires``: e.g. BigBird attending at most half of the keys); and, on a column
  with a trivial baseline (``trivial:``, :mod:`attnlab.tasks.trivial`), when the better of the compared rows (by
  mean; the row itself when ``b`` is a number) does not beat the baseline of its task by more than the margin in
  every run: a verdict between rows that learned nothing the task is about says nothing about the claim. Only
  the better row must: when one row learns the task and the other fails it (the UT paper's Transformer at 10x
  the training length), that difference is the result; and for ``at_least``/``at_most``/``within`` when every
  seed of both rows gave the same number (a zero-width interval between two constants is no evidence),
- **not run** when a row has no completed run with the metric (missing, failed, still running): a claim
  never passes on runs that are not there.

The paper's own numbers, where both are published, are checked against the same range (a point, no
interval): a claim the paper's table contradicts is an encoding error, which the tests catch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnlab.results.build import BuiltTable, RowResult, get_field, run_values
from attnlab.results.spec import ClaimSpec, Requirement, TableSpec
from attnlab.results.stats import (
    CONFIDENCE,
    OVERALL_ERROR,
    PREREGISTERED_CONFIDENCE,
    SEEDS_LIMIT,
    Interval,
    seeds_to_decide,
    welch_interval,
)

HELD, NOT_HELD, INCONCLUSIVE, NOT_RUN = "held", "not held", "inconclusive", "not run"


def _verdict_rule(confidence: float) -> str:
    return (
        f"Claims: Welch {confidence:.2%} t interval of the difference of means over seeds (one-sample t against a "
        "fixed number); held = the whole interval inside the claimed range, not held = wholly outside, "
        "inconclusive = it straddles an edge, a row has < 2 seeds, the runs miss the claim's precondition or the "
        "better compared row does not beat the task's trivial baseline (computed from the data) by the column's "
        "margin in every run, or (at least / at most / within) every seed of both rows gave the same number (no "
        "interval); not run = a row has no completed run."
    )


RULE = (
    f"{_verdict_rule(CONFIDENCE)} Seeds come in two looks (3 per row, then 4-5 where a claim is "
    f"inconclusive at 3): each look is read at Pocock's level for two looks ({1 - CONFIDENCE:.2%}), so the "
    f"procedure decides a true-zero difference at most {OVERALL_ERROR:.0%} of the time."
)

PREREGISTERED_RULE = (
    "Pre-registered table: the spec fixed the seeds per row, the claims and their margins before any published run "
    "(pilot seeds that sized it are never published); it is read once, at that n, with the "
    f"{PREREGISTERED_CONFIDENCE:.0%} interval (one look, so no correction for looks); seeds beyond the n are never "
    "read, a claim waits (not run) "
    "until every row of it has all n, and a run created before the pre-registration date (no part of the fixed "
    "experiment) leaves its claims inconclusive. Where it is inconclusive, only a new fixed-n experiment "
    "(pre-registered anew) can decide it."
)


def rule_text(spec: TableSpec) -> str:
    """The rule a table's claims are read by: the two-look rule, or the one look of a pre-registered table."""
    if spec.preregistered is None:
        return RULE
    return f"{_verdict_rule(PREREGISTERED_CONFIDENCE)} {PREREGISTERED_RULE} {spec.preregistered.describe()}."


@dataclass
class ClaimResult:
    spec: ClaimSpec
    status: str  # held | not held | inconclusive | not run
    n_a: int
    n_b: int | None  # None when b is a number
    interval: Interval | None  # None when not run or fewer than two seeds
    estimate: float | None  # the difference of means (also with one seed)
    reason: str  # why inconclusive or not run; empty otherwise
    paper_difference: float | None  # the paper's a - b, where both cells are published numbers
    paper_agrees: bool | None  # whether the paper's own numbers satisfy the claim
    at_trivial_baseline: bool = False  # the better row does not beat the task's trivial baseline (or none computed)
    confidence: float = CONFIDENCE  # the level of ``interval`` (PREREGISTERED_CONFIDENCE for a pre-registered table)


def in_range(value: float, claim: ClaimSpec) -> bool:
    low, high, low_open, high_open = claim.claimed_range()
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    return above and below


def interval_status(interval: Interval, claim: ClaimSpec) -> str:
    """held / not held / inconclusive for an interval against the claim's range (closed or open edges)."""
    low, high, low_open, high_open = claim.claimed_range()
    if in_range(interval.low, claim) and in_range(interval.high, claim):
        return HELD
    below = interval.high < low or (interval.high == low and low_open)
    above = interval.low > high or (interval.low == high and high_open)
    return NOT_HELD if below or above else INCONCLUSIVE


def _row_values(built: BuiltTable, label: str, metric_index: int) -> tuple[RowResult, list[float]]:
    row = next(r for r in built.rows if r.spec.label == label)
    return row, list(row.cells[metric_index].values)


def _paper_value(row: RowResult, metric_index: int) -> float | None:
    cell = row.paper[metric_index]
    if cell.kind != "value" or isinstance(cell.value, bool) or not isinstance(cell.value, (int, float)):
        return None
    return float(cell.value)


def _why_missing(row: RowResult, metric_index: int) -> str:
    cell = row.cells[metric_index]
    what = cell.kind if cell.kind != "ok" else "no values"
    return f"{row.spec.label}: {what}" + (f" ({cell.note})" if cell.note and cell.kind != "ok" else "")


def evaluate_claim(built: BuiltTable, claim: ClaimSpec) -> ClaimResult:
    mi = next(i for i, m in enumerate(built.spec.metrics) if m.label == claim.metric)
    row_a, a = _row_values(built, claim.a, mi)
    if isinstance(claim.b, float):
        row_b, b, n_b = None, claim.b, None
    else:
        row_b, b = _row_values(built, claim.b, mi)
        n_b = len(b)
    paper_a = _paper_value(row_a, mi)
    paper_b = claim.b if row_b is None else _paper_value(row_b, mi)
    paper_diff = None if paper_a is None or paper_b is None else paper_a - paper_b
    paper_agrees = None if paper_diff is None else in_range(paper_diff, claim)

    # Seeds left out of a row's numbers (failed, running, corrupt) are said beside any result: never silent.
    left_out = [f"{r.spec.label}: {r.cells[mi].note}" for r in (row_a, row_b) if r is not None and r.cells[mi].note]

    prereg = built.spec.preregistered
    confidence = CONFIDENCE if prereg is None else PREREGISTERED_CONFIDENCE

    def result(status, interval=None, estimate=None, reason="", at_floor=False):
        if left_out and status != NOT_RUN:
            reason = "; ".join([reason, *left_out] if reason else left_out)
        return ClaimResult(claim, status, len(a), n_b, interval, estimate, reason, paper_diff, paper_agrees, at_floor,
                           confidence)

    missing = [_why_missing(r, mi) for r, v in ((row_a, a), (row_b, b)) if r is not None and not v]
    if missing:
        return result(NOT_RUN, reason="; ".join(missing))
    if prereg is not None:
        short = [f"{r.spec.label} has {len(v)}" + (f" ({r.cells[mi].note})" if r.cells[mi].note else "")
                 for r, v in ((row_a, a), (row_b, b)) if r is not None and len(v) < prereg.n]
        if short:  # reading the table before its fixed n would be a look the pre-registration does not allow
            return result(NOT_RUN, reason=f"pre-registered at {prereg.n} completed seeds per row, read only once all "
                          f"are in: {'; '.join(short)}")
    estimate = sum(a) / len(a) - (b if row_b is None else sum(b) / len(b))
    floor = _below_trivial_baseline(built, mi, row_a, a, row_b, b)
    early = "" if prereg is None else _before_preregistration(prereg.date, row_a, row_b)
    unmet = "; ".join(x for x in (_unmet_requirements(built, claim), floor, early) if x)
    if unmet:
        return result(INCONCLUSIVE, estimate=estimate, reason=f"the runs do not test the claim: {unmet}",
                      at_floor=bool(floor))
    if len(a) < 2 or (row_b is not None and len(b) < 2):
        return result(INCONCLUSIVE, estimate=estimate, reason="fewer than 2 seeds in a row: no interval")
    interval = welch_interval(a, b, confidence)
    if interval.df is None and claim.test in ("at_least", "at_most", "within"):
        # "a at least b" between two constants (both rows 0% in every seed) would read held with no evidence
        return result(INCONCLUSIVE, interval, estimate, reason="every seed of both rows gave the same number: no "
                      "spread to build an interval on, and equality of constants is not evidence of 'at least'")
    status = interval_status(interval, claim)
    reason = ""
    if status == INCONCLUSIVE and prereg is not None:
        needed = seeds_to_decide(a, b, claim.claimed_range()[:2], confidence, fresh=True)
        plan = f"about {needed}" if needed is not None else f"more than {SEEDS_LIMIT}"
        reason = (f"the interval straddles an edge of the claimed range; read once as pre-registered: a new fixed-n "
                  f"experiment of {plan} seeds per row would decide it if the means and spreads stayed as observed")
    elif status == INCONCLUSIVE:
        needed = seeds_to_decide(a, b, claim.claimed_range()[:2])
        plan = f"about {needed}" if needed is not None else f"more than {SEEDS_LIMIT}"
        reason = (f"the interval straddles an edge of the claimed range; {plan} seeds per row would decide it if "
                  f"the means and spreads stayed as observed")
    return result(status, interval, estimate, reason)


def _before_preregistration(date: str, *rows: RowResult | None) -> str:
    """Which rows have a run created before the pre-registration date ('' when none): such a run was not part of
    the experiment the spec fixed (a pilot, or a run that saw the result)."""
    early = []
    for row in rows:
        if row is None:
            continue
        days = sorted(str(r.data.get("created") or "")[:10] for r in row.used)
        if days and days[0] < date:  # ISO dates compare as text; a record without one ("") counts as early
            early.append(f"{row.spec.label} has a run created {days[0] or 'at an unrecorded time'}")
    return f"{'; '.join(early)}, before the pre-registration date {date}" if early else ""


def _below_trivial_baseline(built: BuiltTable, mi: int, row_a: RowResult, a: list[float], row_b: RowResult | None,
                            b: list[float] | float) -> str:
    """Why the better compared row does not beat its task's trivial baseline ('' when it does, or the column has
    none): the row, its worst run and that run's baseline."""
    m = built.spec.metrics[mi]
    if m.trivial is None:
        return ""
    sign = 1.0 if m.direction == "higher" else -1.0
    better = row_a
    if row_b is not None and sign * (sum(b) / len(b)) > sign * (sum(a) / len(a)):
        better = row_b
    pairs = run_values(better, built.spec.metrics, mi, built.baselines)
    label, d = better.spec.label, m.digits
    if not pairs or any(base is None for _, base in pairs):
        return f"{label}: trivial baseline of {m.label} not computed for its runs (make baselines)"
    value, base = min(pairs, key=lambda p: sign * (p[0] - p[1]))
    if sign * (value - base) > m.trivial.margin:
        return ""
    by = f" by more than {m.trivial.margin:g}" if m.trivial.margin else ""
    what = "a run" if len(pairs) > 1 else "its run"
    return (f"{label}, the better row, at {value:.{d}f} in {what}, trivial baseline {base:.{d}f} "
            f"(it must beat it{by} in every run)")


def _unmet_requirements(built: BuiltTable, claim: ClaimSpec) -> str:
    """Why the completed runs do not meet the claim's preconditions ('' when they do)."""
    problems = []
    for req in claim.requires:
        shortfalls = [_row_shortfall(built, label, req) for label in req.rows]
        if not all(shortfalls):  # met when one of the listed rows meets it in every run
            continue
        if len(shortfalls) == 1:
            problems.append(shortfalls[0])
        else:
            problems.append(f"{req.describe()} needed, no row meets it ({', '.join(shortfalls)})")
    return "; ".join(problems)


def _row_shortfall(built: BuiltTable, label: str, req: Requirement) -> str:
    """How the runs of one row miss a requirement ('' when every run meets it)."""
    row = next(r for r in built.rows if r.spec.label == label)
    values = [get_field(r.data, req.field) for r in row.used]
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(numbers) < len(values) or not values:
        return f"{label} runs do not record {req.field}"
    worst = max(numbers) if req.at_most is not None else min(numbers)
    if (req.at_most is not None and worst > req.at_most) or (req.at_least is not None and worst < req.at_least):
        short = f"a run has {worst:.3g}"
        return f"{req.describe()} needed, {short}" if len(req.rows) == 1 else f"{label}: {short}"
    return ""


def evaluate_claims(built: BuiltTable) -> list[ClaimResult]:
    return [evaluate_claim(built, c) for c in built.spec.claims]


def fmt_interval(result: ClaimResult, digits: int) -> str:
    if result.interval is None:
        return "—"
    return f"[{result.interval.low:+.{digits}f}, {result.interval.high:+.{digits}f}]"


def fmt_estimate(value: float | None, digits: int) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:+.{digits}f}"
