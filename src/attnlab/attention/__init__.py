"""Attention registry: ``build_attention(name, ...)`` and ``available()``.

Each variant lives in its own module and registers itself on import; importing this package imports
them all. Add a variant by adding a file here and importing it below; the registry-parametrised tests
then cover it automatically.
"""

from attnlab.attention import vanilla  # noqa: F401  (registers)
from attnlab.attention.base import Attention, AttentionError, Capabilities, reorder_cache
from attnlab.attention.registry import available, build_attention, get_entry, register_attention

__all__ = [
    "Attention",
    "AttentionError",
    "Capabilities",
    "available",
    "build_attention",
    "get_entry",
    "register_attention",
    "reorder_cache",
]
