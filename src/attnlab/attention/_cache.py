"""Cache helpers shared by the variants that keep their own incremental-decoding state."""

from __future__ import annotations

import torch

from attnlab.attention.base import Cache


def append_to_cache(cache: Cache, key: str, new: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Concatenate ``new`` after the cached tensor under ``key`` (along ``dim``), store and return it."""
    if key in cache:
        new = torch.cat([cache[key], new], dim=dim)
    cache[key] = new
    return new


def append_padding(cache: Cache, key_padding_mask: torch.Tensor | None, offset: int, batch: int, new: int,
                   device) -> torch.Tensor | None:
    """Padding mask of every position so far (batch, offset + new), or None if none was ever given.

    A step given without a mask counts as real tokens, so masks may start at any step.
    """
    if key_padding_mask is None and "pad" not in cache:
        return None
    if key_padding_mask is None:
        key_padding_mask = torch.zeros(batch, new, dtype=torch.bool, device=device)
    prev = cache.get("pad")
    if prev is None:
        prev = torch.zeros(batch, offset, dtype=torch.bool, device=device)
    full = torch.cat([prev, key_padding_mask.bool()], dim=1)
    cache["pad"] = full
    return full
