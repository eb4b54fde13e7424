"""Scaled dot-product attention (Vaswani et al. 2017), through ``torch.nn.functional.scaled_dot_product_attention``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.attention._cache import append_padding, append_to_cache
from attnlab.attention.base import Attention, Cache, Capabilities
from attnlab.attention.capture import emit_dense
from attnlab.attention.masks import build_allowed_mask, mask_logits
from attnlab.attention.registry import register_attention


@dataclass
class VanillaOptions:
    bias: bool = True


class DotProductAttention(Attention):
    """Shared machinery of dot-product attention: projections, caches, masking and SDPA.

    Subclasses change how q and k are prepared (``prepare_qk``) and the softmax scale (``scale``).
    """

    def __init__(self, d_model, num_heads, *, options, **kw) -> None:
        super().__init__(d_model, num_heads, **kw)
        bias = getattr(options, "bias", True)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.options = options

    def prepare_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    def scale(self) -> float | torch.Tensor | None:
        return None  # SDPA's default 1/sqrt(head_dim)

    def attend(self, q, k, v, allowed, *, is_causal: bool = False) -> torch.Tensor:
        scale = self.scale()
        if isinstance(scale, torch.Tensor):
            # A learnable scale (QKNorm's g) must stay in the graph: fold it into q.
            q = q * scale.to(q.dtype)
            scale = 1.0
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, dropout_p=self.dropout if self.training else 0.0, scale=scale,
            is_causal=is_causal,
        )

    def attend_recorded(self, q, k, v, allowed, key_padding_mask) -> torch.Tensor:
        """``attend`` with the softmax written out, so its weights can be recorded (recording only: SDPA's
        fused kernel never materialises them). Same scale, masking and dropout as ``attend``."""
        scale = self.scale()
        if isinstance(scale, torch.Tensor):
            q = q * scale.to(q.dtype)
            scale = 1.0
        elif scale is None:
            scale = self.head_dim**-0.5
        logits = (q.float() @ k.float().transpose(-1, -2)) * scale
        probs = torch.softmax(mask_logits(logits, allowed), dim=-1)
        emit_dense(self, probs, allowed, key_padding_mask)
        probs = F.dropout(probs, p=self.dropout, training=self.training)
        return (probs @ v.float()).to(v.dtype)

    def forward(self, x, *args, **kwargs):
        if self.is_cross:
            return self._cross(x, *args, **kwargs)
        return self._self(x, *args, **kwargs)

    def _self(self, x: torch.Tensor, key_padding_mask=None, cache: Cache | None = None) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.split_heads(self.q_proj(x))
        k = self.split_heads(self.k_proj(x))
        v = self.split_heads(self.v_proj(x))
        offset = 0
        if cache is not None:
            offset = int(cache.get("length", 0))
            k = append_to_cache(cache, "k", k, dim=2)
            v = append_to_cache(cache, "v", v, dim=2)
            # Every key's padding so far: a mask given on some steps only keeps covering its keys, and a
            # step without one counts as real tokens.
            key_padding_mask = append_padding(cache, key_padding_mask, offset, b, n, x.device)
            cache["length"] = offset + n
        q, k = self.prepare_qk(q, k)
        if self.causal and key_padding_mask is None and cache is None and not self.capturing_weights:
            # Causality alone, queries and keys aligned: SDPA's is_causal instead of a mask tensor lets it
            # take the flash kernel (a boolean mask rules flash out); the same allowed entries.
            return self.out_proj(self.merge_heads(self.attend(q, k, v, None, is_causal=True)))
        allowed = build_allowed_mask(
            b, n, k.shape[2], key_padding_mask=key_padding_mask, causal=self.causal,
            query_offset=offset, device=x.device,
        )
        if self.capturing_weights and cache is None:
            return self.out_proj(self.merge_heads(self.attend_recorded(q, k, v, allowed, key_padding_mask)))
        return self.out_proj(self.merge_heads(self.attend(q, k, v, allowed)))

    def _cross(self, x, memory, memory_padding_mask=None, cache: Cache | None = None) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.split_heads(self.q_proj(x))
        if cache is not None and "k" in cache:
            k, v = cache["k"], cache["v"]
        else:
            k = self.split_heads(self.k_proj(memory))
            v = self.split_heads(self.v_proj(memory))
            if cache is not None:
                cache["k"], cache["v"] = k, v
        q, k = self.prepare_qk(q, k)
        allowed = build_allowed_mask(b, n, k.shape[2], key_padding_mask=memory_padding_mask, device=x.device)
        return self.out_proj(self.merge_heads(self.attend(q, k, v, allowed)))


@register_attention("vanilla", options=VanillaOptions, summary="Scaled dot-product attention (SDPA)")
class VanillaAttention(DotProductAttention):
    """Scaled dot-product attention softmax(QK^T / sqrt(d_h)) V (Vaswani et al. 2017, eq. 1)."""

    capabilities = Capabilities(causal=True, cross=True, incremental=True, bounded_length=False)
