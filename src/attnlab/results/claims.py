"""Evaluating a table's claims over the seeds: held, not held, inconclusive, or not run.

The rule (stated in every table and in results/CLAIMS.md, see :data:`RULE`): a claim says that the difference
``a - b`` of one metric (``b`` a row or a fixed number) lies in a range (``greater``: above the margin;
``at_least``: at or above minus the margin; ``less``/``at_most`` the mirror images; ``within``: between
minus and plus the margin). Over the seeds of each row we compute Welch's t interval of the difference
of means (the one-sample t interval when ``b`` is a number) at the per-look level for the two looks at the
data the seed rule takes (3 seeds, then 5 where inconclusive), a level calibrated by simulation
(:data:`attnlab.results.stats.CONFIDENCE`). The claim

- **held** when the whole interval lies inside the claimed range,
- **not held** when the whole interval lies outside it,
- **inconclusive** when the interval straddles an edge of the range (the difference is too small for the
  seeds we have), when a row has fewer than two seeds (no interval can be formed), or when the runs miss a
  precondition of the claim (``requires``: e.g. BigBird attending at most half of the keys); and, on a column
  with a trivial baseline (``trivial:``, :mod:`attnlab.tasks.trivial`), when the better of the compared rows (by
  mean; the row itself when ``b`` is a number) does not beat the baseline of its task by more than the margin in
  every run: a verdict between rows that learned nothing the task is about says nothing about the claim. Only
  the better row must: when one row learns the task and the other fails it (the UT paper's Transformer at 10x
  the training length), that difference is the result; and, for every kind of claim, when every seed of the
  compared rows gave the same number (a zero-width interval between constants is no evidence). The one
  exception: where every seed scored 100% and the claim gives ``items`` (independent test items per run), the
  exact Clopper-Pearson bound over the pooled items is the interval (:func:`_ceiling_interval`),
- **not run** when a row has no completed run with the metric (missing, failed, still running): a claim
  never passes on runs that are not there.

The paper's own numbers, where both are published, are checked against the same range (a point, no
interval): a claim the paper's table contradicts is an encoding error, which the tests catch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from attnlab.results.build import BuiltTable, RowResult, get_field, run_values
from attnlab.results.spec import ClaimSpec, Requirement, TableSpec
from attnlab.results.stats import (
    CONFIDENCE,
    LOOKS,
    OVERALL_ERROR,
    PREREGISTERED_CONFIDENCE,
    SEEDS_LIMIT,
    Interval,
    ceiling_bound,
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
        "margin in every run, or every seed of the compared rows gave the same number (a zero-width interval decides "
        "nothing; where they all scored 100%, an exact binomial bound over the claim's pooled test items may); not "
        "run = a row has no completed run."
    )


RULE = (
    f"{_verdict_rule(CONFIDENCE)} Seeds come in two looks (3 per row, then 4-5 where a claim is "
    f"inconclusive at 3): each look is read at {1 - CONFIDENCE:.0%}, a level calibrated by simulation so that the "
    f"procedure decides a true-zero difference at most {OVERALL_ERROR:.0%} of the time for Welch intervals whose "
    "rows' seed spreads differ up to 10x (Pocock's 2.94% for equal looks gives up to 6.1% there). There is no "
    "third look: a claim still inconclusive at its last look can only be decided by a new fixed-n experiment."
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
    # The smallest two-sided error level at which the interval would decide the claim (None where no interval was
    # read): decided at ``confidence`` exactly when p < 1 - confidence. Holm within the table is run on these.
    p_value: float | None = None
    survives_holm: bool | None = None  # a decided claim still decided after Holm within its table (None: undecided)


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

    def result(status, interval=None, estimate=None, reason="", at_floor=False, p_value=None):
        if left_out and status != NOT_RUN:
            reason = "; ".join([reason, *left_out] if reason else left_out)
        return ClaimResult(claim, status, len(a), n_b, interval, estimate, reason, paper_diff, paper_agrees, at_floor,
                           confidence, p_value)

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
    scale = built.spec.metrics[mi].scale

    def interval_at(level: float) -> tuple[Interval, str] | None:
        interval = welch_interval(a, b, level)
        if interval.df is not None:  # the seeds spread: Welch's interval (df is None only for a zero standard error)
            return interval, ""
        # Every seed gave one number: a zero-width interval is no evidence for any kind of claim ("a above b"
        # between two constants, or "a at least b" between two rows at 0%), unless each row is at the ceiling on
        # every one of its test items, where an exact bound over the pooled items says how close to it they are.
        return _ceiling_interval(scale, claim, a, b, level)

    read = interval_at(confidence)
    if read is None:
        return result(INCONCLUSIVE, welch_interval(a, b, confidence), estimate, reason="every seed gave the same "
                      "number: no spread to build an interval on, and constants are no evidence (a bound over test "
                      "items needs every item right and the claim's items)")
    interval, reason = read
    p_value = _decision_p(interval_at, claim)
    status = interval_status(interval, claim)
    if status == INCONCLUSIVE and prereg is not None:
        needed = seeds_to_decide(a, b, claim.claimed_range()[:2], confidence, fresh=True)
        plan = f"about {needed}" if needed is not None else f"more than {SEEDS_LIMIT}"
        reason = (f"the interval straddles an edge of the claimed range; read once as pre-registered: a new fixed-n "
                  f"experiment of {plan} seeds per row would decide it if the means and spreads stayed as observed")
    elif status == INCONCLUSIVE and max(len(a), n_b or 0) >= LOOKS[-1]:  # the last look is taken: no third one
        needed = seeds_to_decide(a, b, claim.claimed_range()[:2], fresh=True)
        plan = f"about {needed}" if needed is not None else f"more than {SEEDS_LIMIT}"
        reason = (f"the interval straddles an edge of the claimed range at the last look; a new fixed-n experiment "
                  f"of {plan} seeds per row would decide it if the means and spreads stayed as observed")
    elif status == INCONCLUSIVE:
        needed = seeds_to_decide(a, b, claim.claimed_range()[:2])
        plan = f"about {needed}" if needed is not None else f"more than {SEEDS_LIMIT}"
        reason = (f"the interval straddles an edge of the claimed range; {plan} seeds per row would decide it if "
                  f"the means and spreads stayed as observed")
    return result(status, interval, estimate, reason, p_value=p_value)


def _decision_p(interval_at, claim: ClaimSpec, steps: int = 60) -> float:
    """The smallest error level alpha at which the (1 - alpha) interval decides the claim (held or not held), by
    bisection: intervals narrow as alpha grows, so a claim decided at one alpha stays decided at every larger one.
    1.0 where no level decides it (the estimate on an edge)."""
    def decides(alpha: float) -> bool:
        read = interval_at(1 - alpha)
        return read is not None and interval_status(read[0], claim) != INCONCLUSIVE

    if not decides(1 - 1e-6):
        return 1.0
    low, high = 0.0, 1 - 1e-6  # decides(high) is true; search in log space below it
    for _ in range(steps):
        mid = (low + high) / 2 if low > 0 else high / 1e3
        if decides(mid):
            high = mid
        else:
            low = mid
        if low > 0 and high - low < 1e-12 + high * 1e-9:
            break
    return high


def holm(p_values: list[float], alpha: float) -> list[bool]:
    """Holm's step-down procedure: which of the hypotheses keep their rejection at family-wise level ``alpha``."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    keep = [False] * len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (len(p_values) - rank):
            break
        keep[i] = True
    return keep


def _ceiling_interval(scale: float, claim: ClaimSpec, a: list[float], b: list[float] | float,
                      confidence: float) -> tuple[Interval, str] | None:
    """The interval of ``a - b`` from exact binomial bounds when every seed of the compared rows scored 100% and
    the claim says how many independent test items one run has (None otherwise): each row's accuracy is at least
    the Clopper-Pearson bound over its pooled items, so the difference lies between minus and plus the shortfall."""
    rows = [a] if isinstance(b, float) else [a, b]
    if claim.items is None or any(v != scale for row in rows for v in row):
        return None
    shortfall = [scale * (1 - ceiling_bound(claim.items * len(row), confidence, len(rows))) for row in rows]
    if isinstance(b, float):
        low, high = scale - shortfall[0] - b, scale - b
    else:
        low, high = -shortfall[0], shortfall[1]
    pooled = " and ".join(str(claim.items * len(row)) for row in rows)
    return Interval((low + high) / 2 if isinstance(b, float) else 0.0, low, high, None), (
        f"every one of the {pooled} pooled test items right: the {confidence:.0%} interval is the exact "
        f"(Clopper-Pearson) binomial bound over them, not Welch's")


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
    fields = [req.field] if req.minus is None else [req.field, req.minus]
    per_run = [[get_field(r.data, f) for f in fields] for r in row.used]
    if not per_run or not all(_is_real(v) for run in per_run for v in run):
        return f"{label} runs do not record {' and '.join(fields)}"
    numbers = [run[0] - (run[1] if req.minus is not None else 0.0) for run in per_run]
    worst = max(numbers) if req.at_most is not None else min(numbers)
    if (req.at_most is not None and worst > req.at_most) or (req.at_least is not None and worst < req.at_least):
        short = f"a run has {worst:.3g}"
        return f"{req.describe()} needed, {short}" if len(req.rows) == 1 else f"{label}: {short}"
    return ""


def counted(results: Sequence[ClaimResult]) -> list[ClaimResult]:
    """The claims that count in tallies: a claim that another table counts (``counted_in``) is shown, not counted."""
    return [r for r in results if r.spec.counted_in is None]


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def evaluate_claims(built: BuiltTable) -> list[ClaimResult]:
    """Every claim of the table, the decided ones marked by whether they survive Holm within the table (the
    family: the claims read with an interval, at the table's per-look error level)."""
    results = [evaluate_claim(built, c) for c in built.spec.claims]
    family = [r for r in results if r.p_value is not None]
    if family:
        alpha = 1 - family[0].confidence
        for r, keep in zip(family, holm([r.p_value for r in family], alpha)):
            if r.status in (HELD, NOT_HELD):
                r.survives_holm = keep
    return results


def claims_of(built: BuiltTable) -> list[ClaimResult]:
    """The results of the table's claims (``evaluate_claims``), evaluated once per built table and kept on it:
    the table's page, its LaTeX, results/CLAIMS.md, the results index and the README blocks read the same list."""
    if built.claims is None:
        built.claims = evaluate_claims(built)
    return built.claims


def fmt_interval(result: ClaimResult, digits: int) -> str:
    if result.interval is None:
        return "—"
    return f"[{result.interval.low:+.{digits}f}, {result.interval.high:+.{digits}f}]"


def fmt_estimate(value: float | None, digits: int) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:+.{digits}f}"
