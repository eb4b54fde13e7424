"""Learning-rate schedules as multipliers of the peak learning rate ``optim.lr``."""

from __future__ import annotations

import math


def inverse_sqrt(step: int, warmup_steps: int) -> float:
    """Linear warmup to the peak, then decay with 1/sqrt(step) (fairseq ``inverse_sqrt``).

    T2T's ``rsqrt_decay * linear_warmup`` with ``learning_rate_constant`` c and ``d_model`` is the same
    curve with peak ``c * d_model**-0.5 * warmup**-0.5``; presets state the peak they imply.
    """
    step = max(step, 1)
    if warmup_steps <= 0:
        return 1.0 / math.sqrt(step)
    return min(step / warmup_steps, math.sqrt(warmup_steps / step))


def cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> float:
    """Linear warmup, then half-cosine decay from the peak to ``min_ratio`` x peak at ``total_steps``."""
    step = max(step, 1)
    if warmup_steps > 0 and step < warmup_steps:
        return step / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / span, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def constant(step: int, warmup_steps: int) -> float:
    return min(1.0, max(step, 1) / warmup_steps) if warmup_steps > 0 else 1.0


def lr_multiplier(name: str, *, warmup_steps: int, total_steps: int, min_ratio: float = 0.0):
    """A function step -> multiplier, for ``torch.optim.lr_scheduler.LambdaLR`` (stepped every update)."""
    if name == "inverse_sqrt":
        return lambda s: inverse_sqrt(s + 1, warmup_steps)
    if name == "cosine":
        return lambda s: cosine(s + 1, warmup_steps, total_steps, min_ratio)
    if name == "constant":
        return lambda s: constant(s + 1, warmup_steps)
    raise ValueError(f"optim.schedule={name!r}; valid: inverse_sqrt, cosine, constant")
