"""Mask helpers shared by every attention variant.

Conventions used across attnlab:
- ``key_padding_mask`` is boolean of shape (batch, key_len), True at padding (PyTorch's convention).
- "allowed" masks are boolean, True where a query may attend a key, broadcastable to
  (batch, heads, query_len, key_len).
- Padding is on the right only; the position of a token is its index.
"""

from __future__ import annotations

import torch


def causal_allowed(query_len: int, key_len: int, query_offset: int = 0, device=None) -> torch.Tensor:
    """(query_len, key_len) bool: query i (absolute position query_offset + i) may see keys <= its position."""
    q_pos = torch.arange(query_len, device=device).unsqueeze(1) + query_offset
    k_pos = torch.arange(key_len, device=device).unsqueeze(0)
    return k_pos <= q_pos


def build_allowed_mask(
    batch: int,
    query_len: int,
    key_len: int,
    *,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool = False,
    query_offset: int = 0,
    device=None,
) -> torch.Tensor | None:
    """Combine key padding and causality into one boolean (batch, 1, query_len, key_len) mask, or None.

    Rows with no allowed key (a padding query of an all-padding sequence) are opened fully so that
    softmax stays finite; their outputs are padding and are ignored by every loss and metric.
    """
    # Empty rows are opened without asking the device whether there are any (``if empty.any()`` waits for
    # the accelerator at every layer of every step): the opening is applied unconditionally, on the smallest
    # tensor that decides it, so a padding-only mask stays an expanded (batch, key_len) view.
    if key_padding_mask is not None:
        keys = ~key_padding_mask.bool()
        if not causal:
            return _open_empty_rows(keys)[:, None, None, :].expand(batch, 1, query_len, key_len)
        allowed = keys[:, None, None, :] & causal_allowed(query_len, key_len, query_offset, device=device)
        return _open_empty_rows(allowed)
    if causal:
        c = _open_empty_rows(causal_allowed(query_len, key_len, query_offset, device=device))
        return c[None, None].expand(batch, 1, query_len, key_len)
    return None


def _open_empty_rows(allowed: torch.Tensor) -> torch.Tensor:
    """``allowed`` with every row (last dim) that allows no key opened fully; other rows unchanged."""
    return allowed | ~allowed.any(dim=-1, keepdim=True)


def mask_logits(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Set disallowed logits to the dtype's most negative value (not -inf: keeps fully-masked rows finite)."""
    if allowed is None:
        return logits
    return logits.masked_fill(~allowed, torch.finfo(logits.dtype).min)
