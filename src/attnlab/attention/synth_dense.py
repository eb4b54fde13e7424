"""Dense synthesizers (Tay et al. 2020, eq. 1-2 and 5-6): attention logits synthesized from each token."""

from __future__ import annotations

from attnlab.attention.registry import register_attention
from attnlab.attention.synthesizer import DenseFnOptions, FactorizedDenseOptions, SynthesizerAttention


@register_attention("synth_dense", options=DenseFnOptions, summary="Dense synthesizer: B_i = F(X_i)")
class SynthDenseAttention(SynthesizerAttention):
    """Dense synthesizer: softmax(F(X)) G(X), F: d -> l_max two-layer ReLU by default (eq. 1-2).

    ``synthesizer_fn`` selects Table 7's F (dense, linear, conv3, conv5, bottleneck, glu); causal conv
    pads on the left only. Shared decisions: ``SynthesizerAttention``; F's forms: ``DenseLogits``.
    """

    component_names = ("dense",)


@register_attention(
    "synth_factorized_dense", options=FactorizedDenseOptions,
    summary="Factorized dense synthesizer: H_A(F_A(X_i)) * H_B(F_B(X_i))",
)
class SynthFactorizedDenseAttention(SynthesizerAttention):
    """Factorized dense synthesizer (eq. 5-6): C_j = A_{j mod a} * B_{j // a}, a * b >= l_max.

    Tiling and defaults: ``FactorizedDenseLogits``; shared decisions: ``SynthesizerAttention``.
    """

    component_names = ("factorized_dense",)
