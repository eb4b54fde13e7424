"""Registry of attention variants: one file per variant registers its class and its options dataclass.

Registering stores the options dataclass beside the class (as fairseq's registry does), so the config
validator can check ``model.attention.*`` keys and types per variant, and a duplicate name fails loudly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from attnlab.attention.base import Attention, AttentionError


@dataclass
class NoOptions:
    """A variant without options of its own."""


@dataclass(frozen=True)
class Entry:
    name: str
    cls: type[Attention]
    options: type
    summary: str


_REGISTRY: dict[str, Entry] = {}


def register_attention(name: str, *, options: type = NoOptions, summary: str = ""):
    """Class decorator: ``@register_attention("vanilla", options=VanillaOptions, summary=...)``."""

    def wrap(cls: type[Attention]) -> type[Attention]:
        if name in _REGISTRY:
            raise ValueError(f"attention variant {name!r} is registered twice ({_REGISTRY[name].cls} and {cls})")
        if not dataclasses.is_dataclass(options):
            raise TypeError(f"options of {name!r} must be a dataclass")
        cls.name = name
        _REGISTRY[name] = Entry(name, cls, options, summary or (cls.__doc__ or "").strip().split("\n")[0])
        return cls

    return wrap


def _ensure_loaded() -> None:
    # Importing the package imports every variant file, which registers them.
    import attnlab.attention  # noqa: F401


def available() -> list[str]:
    """Names of every registered variant, sorted."""
    _ensure_loaded()
    return sorted(_REGISTRY)


def get_entry(name: str) -> Entry:
    _ensure_loaded()
    if name not in _REGISTRY:
        raise AttentionError(f"unknown attention variant {name!r}; valid: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def build_attention(
    name: str,
    *,
    d_model: int,
    num_heads: int,
    max_len: int | None = None,
    causal: bool = False,
    dropout: float = 0.0,
    cross: bool = False,
    **variant_options: Any,
) -> Attention:
    """Build one attention module, refusing with one clear line what the variant cannot do."""
    entry = get_entry(name)
    caps = entry.cls.capabilities
    if cross and not caps.cross:
        raise AttentionError(
            f"attention {name!r} cannot be used for cross-attention (it synthesizes weights from the "
            f"query side only); cross-attention stays dot-product: set model.cross_attention=vanilla"
        )
    if causal and not caps.causal:
        raise AttentionError(f"attention {name!r} has no causal form; use it in an encoder only")
    if caps.bounded_length and not max_len:
        raise AttentionError(f"attention {name!r} needs max_len (its weights are sized by sequence length)")
    field_names = {f.name for f in dataclasses.fields(entry.options)}
    unknown = sorted(set(variant_options) - field_names)
    if unknown:
        raise AttentionError(
            f"attention {name!r} has no option(s) {', '.join(unknown)}; "
            f"valid: {', '.join(sorted(field_names)) or 'none'}"
        )
    opts = entry.options(**variant_options)
    return entry.cls(
        d_model, num_heads, max_len=max_len, causal=causal, dropout=dropout, cross=cross, options=opts
    )
