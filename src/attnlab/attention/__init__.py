"""Attention registry: ``build_attention(name, ...)`` and ``available()``.

Each variant lives in its own module and registers itself on import; importing this package imports
them all. Add a variant by adding a file here and importing it below; the registry-parametrised tests
then cover it automatically.
"""

from attnlab.attention import (  # noqa: F401  (each import registers its variants)
    bigbird,
    qknorm,
    synth_dense,
    synth_mixture,
    synth_random,
    vanilla,
)
from attnlab.attention.base import (
    Attention,
    AttentionError,
    Capabilities,
    countable_kernels,
    number_attention_layers,
    reorder_cache,
)
from attnlab.attention.bigbird import bigbird_reference_allowed, build_bigbird_plan, draw_random_blocks
from attnlab.attention.qknorm import qknorm_g0
from attnlab.attention.registry import available, build_attention, get_entry, register_attention

__all__ = [
    "Attention",
    "AttentionError",
    "Capabilities",
    "available",
    "bigbird_reference_allowed",
    "build_bigbird_plan",
    "build_attention",
    "draw_random_blocks",
    "get_entry",
    "countable_kernels",
    "number_attention_layers",
    "qknorm_g0",
    "register_attention",
    "reorder_cache",
]
