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
