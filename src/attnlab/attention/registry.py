"""Registry of attention variants: one file per variant registers its class and its options dataclass.

Registering stores the options dataclass beside the class (as fairseq's registry does), so the config
validator can check ``model.attention.*`` keys and types per variant, and a duplicate name fails loudly. The
class declares the rest of what the floors above need: ``capabilities``, ``resolve_options`` (what only the run
knows) and ``allowed_pairs`` (its sparsity pattern). The package ``attnlab.attention`` imports every built-in
variant, so importing this module (which imports the package first) finds them registered.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from attnlab.attention.base import Attention, AttentionError
from attnlab.registry import Registry


@dataclass
class NoOptions:
    """A variant without options of its own."""


@dataclass(frozen=True)
class Entry:
    name: str
    cls: type[Attention]
    options: type
    summary: str


ATTENTION_VARIANTS: Registry[Entry] = Registry("attention variant", AttentionError)


def register_attention(name: str, *, options: type = NoOptions, summary: str = ""):
    """Class decorator: ``@register_attention("vanilla", options=VanillaOptions, summary=...)``."""

    def wrap(cls: type[Attention]) -> type[Attention]:
        if not dataclasses.is_dataclass(options):
            raise TypeError(f"options of {name!r} must be a dataclass")
        first_doc_line = (cls.__doc__ or "").strip().split("\n")[0]
        ATTENTION_VARIANTS.register(name, Entry(name, cls, options, summary or first_doc_line))
        cls.name = name
        return cls

    return wrap


def available() -> list[str]:
    """Names of every registered variant, sorted."""
    return ATTENTION_VARIANTS.names()


def get_entry(name: str) -> Entry:
    return ATTENTION_VARIANTS.get(name)


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
    """Build one attention module, refusing with one clear line what the variant cannot do.

    The keywords are ``Attention.__init__``'s, spelled out rather than passed on blindly: the checks read them."""
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
