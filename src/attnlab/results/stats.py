"""Statistics over seeds: the mean and sample standard deviation of one cell."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


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


# Seeds are added in two looks: 3 per row, then seeds 4-5 where a claim is inconclusive at 3 (issue 14's rule).
# Reading both looks at 95% decides a true-zero difference 6.8% of the time (optional stopping). Pocock's constant
# for two equal looks with z statistics (2.94% per look) is not enough for Welch intervals at 2-8 degrees of
# freedom once the rows' seed spreads differ (the common case: a learned row beside a row near its floor): 5.5-6.1%
# false decisions at spread ratios 3-10 (issue 53), and Bonferroni's 2.5% per look still gives 5.3% at a ratio of 5.
# The per-look level is therefore calibrated by simulation (tests/results/test_claims.py,
# _two_look_false_decisions): 2% per look keeps the two-look procedure at or below 4.7% for every spread ratio from
# 1 to 10 (the worst, about 4.5%, near a ratio of 5-7; a fixed b is the ratio's limit), under the 5% it promises.
OVERALL_ERROR = 0.05
PER_LOOK_ERROR = 0.02  # the two-sided nominal level of every look, calibrated as above
LOOKS = (3, 5)  # the seed counts at which claims are read
CONFIDENCE = 1 - PER_LOOK_ERROR
# A pre-registered table (spec ``preregistered:``) fixes n before its runs and is read once: no optional stopping,
# so its single look is at the plain two-sided 95%.
PREREGISTERED_CONFIDENCE = 1 - OVERALL_ERROR


@dataclass
class Interval:
    """A CONFIDENCE interval of a difference of means: the estimate, its bounds, and how it was computed."""

    estimate: float
    low: float
    high: float
    df: float | None  # degrees of freedom of the t quantile; None when the standard error is 0


def welch_interval(a: Sequence[float], b: Sequence[float] | float, confidence: float = CONFIDENCE) -> Interval:
    """Welch's t interval for ``mean(a) - mean(b)``; ``b`` a number gives the one-sample t interval.

    Needs at least two values on each side that has values (a sample variance). When both variances are 0 the
    standard error is 0 and the interval is the point itself (every seed gave the same number).
    """
    from scipy.stats import t as student_t  # scipy only when claims are evaluated

    if len(a) < 2 or (not isinstance(b, (int, float)) and len(b) < 2):
        raise ValueError("a Welch interval needs at least two values per side")
    var_a = statistics.variance(a) / len(a)
    if isinstance(b, (int, float)):
        estimate, var_b, n_b = statistics.fmean(a) - float(b), 0.0, 2  # a fixed b adds no variance term
    else:
        estimate, var_b = statistics.fmean(a) - statistics.fmean(b), statistics.variance(b) / len(b)
        n_b = len(b)
    se2 = var_a + var_b
    if se2 == 0:
        return Interval(estimate, estimate, estimate, None)
    df = _welch_df(var_a, len(a), var_b, n_b)
    half = float(student_t.ppf(0.5 + confidence / 2, df)) * se2**0.5
    return Interval(estimate, estimate - half, estimate + half, df)


def _welch_df(var_a: float, n_a: int, var_b: float, n_b: int) -> float:
    """Welch-Satterthwaite degrees of freedom from the squared standard errors ``var_x`` (variance / n)."""
    return (var_a + var_b) ** 2 / (var_a**2 / (n_a - 1) + var_b**2 / (n_b - 1))


SEEDS_LIMIT = 50  # beyond this a laptop table does not plan seeds: "more than 50"


def seeds_to_decide(a: Sequence[float], b: Sequence[float] | float, edges: Sequence[float],
                    confidence: float = CONFIDENCE, limit: int = SEEDS_LIMIT, fresh: bool = False) -> int | None:
    """Seeds per row at which the Welch interval of ``mean(a) - mean(b)`` would be narrower than the distance from
    the estimate to the nearest finite edge of a claim's range, if the means and sample variances stayed as
    observed: a planning estimate for an inconclusive claim, not a result. ``None`` when no number of seeds up to
    ``limit`` would (or the estimate sits on an edge). ``fresh``: the n of a new fixed-n experiment (from 2 up),
    not more seeds added to these (from one beyond the seeds there are)."""
    from scipy.stats import t as student_t

    one_sample = isinstance(b, (int, float))
    estimate = statistics.fmean(a) - (float(b) if one_sample else statistics.fmean(b))
    finite = [e for e in edges if math.isfinite(e)]
    distance = min(abs(estimate - e) for e in finite) if finite else math.inf
    if distance == 0:
        return None
    var_a, var_b = statistics.variance(a), 0.0 if one_sample else statistics.variance(b)
    start = 2 if fresh else max(len(a), 1 if one_sample else len(b)) + 1
    for n in range(start, limit + 1):
        se2 = (var_a + var_b) / n
        if se2 == 0:
            return n
        df = _welch_df(var_a / n, n, var_b / n, n)
        if float(student_t.ppf(0.5 + confidence / 2, df)) * se2**0.5 < distance:
            return n
    return None


def ceiling_bound(items: int, confidence: float = CONFIDENCE, rows: int = 2) -> float:
    """The exact (Clopper-Pearson) lower bound of a proportion when every one of ``items`` independent test items
    was right: ``(alpha / 2) ** (1 / items)``, the one-sided bound at ``1 - alpha / 2``, with ``alpha`` split over
    the ``rows`` bounded at once (Bonferroni) so that they hold together at ``confidence``."""
    if items < 1:
        raise ValueError("a binomial bound needs at least one item")
    alpha = (1 - confidence) / rows
    return (alpha / 2) ** (1 / items)
