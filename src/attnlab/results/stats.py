"""Statistics over seeds: the mean and sample standard deviation of one cell."""

from __future__ import annotations

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


CONFIDENCE = 0.95


@dataclass
class Interval:
    """A 95% interval of a difference of means: the estimate, its bounds, and how it was computed."""

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
        estimate, var_b, df_b = statistics.fmean(a) - float(b), 0.0, 0.0
    else:
        estimate, var_b = statistics.fmean(a) - statistics.fmean(b), statistics.variance(b) / len(b)
        df_b = var_b**2 / (len(b) - 1)
    se2 = var_a + var_b
    if se2 == 0:
        return Interval(estimate, estimate, estimate, None)
    df = se2**2 / (var_a**2 / (len(a) - 1) + df_b)  # Welch-Satterthwaite
    half = float(student_t.ppf(0.5 + confidence / 2, df)) * se2**0.5
    return Interval(estimate, estimate - half, estimate + half, df)
