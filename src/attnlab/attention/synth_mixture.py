"""Synthesizer mixtures (Tay et al. 2020, eq. 9): weighted sums of component logits before softmax."""

from __future__ import annotations

from dataclasses import dataclass, field

from attnlab.attention.base import AttentionError
from attnlab.attention.registry import register_attention
from attnlab.attention.synthesizer import (
    COMPONENTS,
    DenseFnOptions,
    FactorizedDenseOptions,
    FactorizedRandomOptions,
    FixedRandomOptions,
    MixtureWeightOptions,
    SynthesizerAttention,
    SynthOptions,
)


@dataclass
class SynthMixtureOptions(
    DenseFnOptions, FactorizedDenseOptions, FixedRandomOptions, FactorizedRandomOptions, MixtureWeightOptions
):
    components: list[str] = field(default_factory=lambda: ["random", "dense"])

    def __post_init__(self) -> None:
        if isinstance(self.components, str):
            raise AttentionError(
                f"synth_mixture: components must be a list of names among {', '.join(COMPONENTS)}"
            )
        self.components = [str(c) for c in self.components]


@register_attention(
    "synth_mixture", options=SynthMixtureOptions, summary="Synthesizer mixture over any subset of components"
)
class SynthMixtureAttention(SynthesizerAttention):
    """Mixture of any distinct subset of dense, factorized_dense, random, fixed_random,
    factorized_random and vanilla (dot product), logits weighted by softmax(alpha) and summed.

    Weights, masking and the vanilla-reproduction property: ``SynthesizerAttention`` (point 8).
    """


# The two-component presets: the options of the parametrised components, plus the mixture's weights.
@dataclass
class DenseMixtureOptions(DenseFnOptions, MixtureWeightOptions):
    """A preset mixture whose only component with options of its own is ``dense`` (random and vanilla have none)."""


@dataclass
class RandomMixtureOptions(SynthOptions, MixtureWeightOptions):
    """The ``random`` + ``vanilla`` preset: only the biases and the mixture weights."""


@register_attention(
    "synth_random_dense", options=DenseMixtureOptions, summary="Mixture: random + dense synthesizer"
)
class SynthRandomDenseAttention(SynthesizerAttention):
    """Preset mixture (random, dense), the paper's "Mixture (R+D)". Weights order follows the name."""

    component_names = ("random", "dense")


@register_attention(
    "synth_dense_vanilla", options=DenseMixtureOptions,
    summary="Mixture: dense synthesizer + dot product",
)
class SynthDenseVanillaAttention(SynthesizerAttention):
    """Preset mixture (dense, vanilla), the paper's "Dense + Vanilla". Weights order follows the name."""

    component_names = ("dense", "vanilla")


@register_attention(
    "synth_random_vanilla", options=RandomMixtureOptions,
    summary="Mixture: random synthesizer + dot product",
)
class SynthRandomVanillaAttention(SynthesizerAttention):
    """Preset mixture (random, vanilla), the paper's "Random + Vanilla". Weights order follows the name."""

    component_names = ("random", "vanilla")
