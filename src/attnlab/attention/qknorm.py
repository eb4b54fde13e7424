"""QKNorm (Henry et al. 2020, "Query-Key Normalization for Transformers")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.attention.base import AttentionError, Capabilities
from attnlab.attention.registry import register_attention
from attnlab.attention.vanilla import DotProductAttention


def g0_from_length(length: float) -> float:
    """g0 = log2(L^2 - L) (QKNorm eq. 4 discussion): the initial scale for sequences of length L."""
    if length <= 1:
        raise AttentionError(f"qknorm: g0 = log2(L^2 - L) needs L > 1, got L={length}")
    return math.log2(length * length - length)


def length_p975(lengths: Sequence[int | float]) -> float:
    """L of QKNorm's g0: the 97.5th percentile of training lengths (numpy's linear interpolation)."""
    if len(lengths) == 0:
        raise AttentionError("qknorm: cannot compute g0 from an empty list of training lengths")
    return float(np.percentile(np.asarray(lengths, dtype=np.float64), 97.5))


def qknorm_g0(lengths: Sequence[int | float]) -> float:
    """g0 from training sequence lengths: log2(L^2 - L), L their 97.5th percentile (``length_p975``)."""
    return g0_from_length(length_p975(lengths))


@dataclass
class QKNormOptions:
    g0: float | None = None
    train_length_p975: float | None = None
    bias: bool = True


@register_attention("qknorm", options=QKNormOptions, summary="QK-normalised attention, learnable scale g")
class QKNormAttention(DotProductAttention):
    """softmax(g * q_hat k_hat^T) V with q_hat, k_hat unit vectors per head (Henry et al. 2020).

    Design decisions 23-26 (docs/design_decisions.md#qknorm): normalisation per head (cached keys at use), one
    learnable g shared by heads, g0 from the 97.5th percentile of training lengths, g folded into q for SDPA.
    """

    @classmethod
    def resolve_options(cls, options, *, run_seed, train_lengths):
        options = super().resolve_options(options, run_seed=run_seed, train_lengths=train_lengths)
        if options.get("train_length_p975") is None and train_lengths:  # the L of g0, from the run's data
            options = {**options, "train_length_p975": length_p975(train_lengths)}
        return options

    capabilities = Capabilities(causal=True, cross=True, incremental=True, bounded_length=False)

    def __init__(self, d_model, num_heads, *, options: QKNormOptions, **kw) -> None:
        super().__init__(d_model, num_heads, options=options, **kw)
        if options.g0 is not None:
            g0 = float(options.g0)
        else:
            length = options.train_length_p975 if options.train_length_p975 is not None else self.max_len
            if length is None:
                raise AttentionError(
                    "qknorm needs g0, train_length_p975 or max_len to initialise g = log2(L^2 - L)"
                )
            g0 = g0_from_length(float(length))
        self.g = nn.Parameter(torch.tensor(g0))

    def prepare_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.normalize(q, dim=-1), F.normalize(k, dim=-1)

    def scale(self) -> torch.Tensor:
        return self.g
