"""Random synthesizers (Tay et al. 2020, eq. 3 and 7): input-independent attention per head."""

from __future__ import annotations

from attnlab.attention.registry import register_attention
from attnlab.attention.synthesizer import (
    FactorizedRandomOptions,
    FixedRandomOptions,
    SynthesizerAttention,
    SynthOptions,
)


@register_attention("synth_random", options=SynthOptions, summary="Random synthesizer: trainable R")
class SynthRandomAttention(SynthesizerAttention):
    """Random synthesizer: softmax(R) G(X) with R an ``nn.Parameter`` of shape (H, l_max, l_max).

    Only the value and output projections besides R (Table 1: l^2 per head). Decoding reads the row of
    the current absolute position. Shared decisions: ``SynthesizerAttention``.
    """

    component_names = ("random",)


@register_attention(
    "synth_fixed_random", options=FixedRandomOptions,
    summary="Fixed random synthesizer: seeded, frozen R",
)
class SynthFixedRandomAttention(SynthesizerAttention):
    """Fixed random synthesizer: R drawn from N(0, 1) and kept as a persistent buffer.

    R is saved in the state dict (a checkpoint restores the exact matrix) and never receives gradient.
    Every layer and head has its own draw: inside a network each layer draws from (``seed``, its module
    path), ``seed`` being the run seed unless set; the same seed gives the same R on every machine (CPU
    generator). Shared decisions: ``SynthesizerAttention``.
    """

    component_names = ("fixed_random",)


@register_attention(
    "synth_factorized_random", options=FactorizedRandomOptions,
    summary="Factorized random synthesizer: softmax(R1 R2^T)",
)
class SynthFactorizedRandomAttention(SynthesizerAttention):
    """Factorized random synthesizer (eq. 7): softmax(R1 R2^T) G(X), R1, R2 in R^{l_max x k} per head.

    Input independent (not a low-rank QK^T); k = ``rank`` = 8 as in the paper. Shared decisions:
    ``SynthesizerAttention``.
    """

    component_names = ("factorized_random",)
