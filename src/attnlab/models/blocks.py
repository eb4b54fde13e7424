"""Transformer building blocks shared by every architecture and recurrence."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.attention import build_attention, get_entry


def sinusoid_table(length: int, dim: int, *, offset: int = 0) -> torch.Tensor:
    """Sinusoidal signal of Vaswani et al. (sin on even, cos on odd channels), (length, dim)."""
    pos = torch.arange(offset, offset + length, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(pos * div)
    table[:, 1::2] = torch.cos(pos * div[: dim // 2])
    return table


@dataclass
class LayerSpec:
    """Everything needed to build one encoder or decoder layer."""

    d_model: int
    num_heads: int
    d_ff: int
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"
    norm_first: bool = False
    max_len: int | None = None
    self_attention: dict[str, Any] = field(default_factory=lambda: {"name": "vanilla"})
    cross_attention: dict[str, Any] | str = "auto"

    def attention(self, *, causal: bool, cross: bool) -> nn.Module:
        cfg = dict(self.self_attention)
        if cross:
            cfg = self.resolved_cross_attention()
        name = cfg.pop("name")
        return build_attention(
            name, d_model=self.d_model, num_heads=self.num_heads, max_len=self.max_len,
            causal=causal and not cross, dropout=self.attention_dropout, cross=cross, **cfg,
        )

    def resolved_cross_attention(self) -> dict[str, Any]:
        """``auto`` keeps the self-attention variant where it can attend a memory, else dot-product.

        Synthesizers synthesize weights from the query side only, so every reference keeps
        cross-attention dot-product (design decision 4, docs/design_decisions.md#synthesizer); asking for one
        explicitly is refused by the builder.
        """
        if self.cross_attention != "auto":
            return dict(self.cross_attention)
        name = self.self_attention["name"]
        if get_entry(name).cls.capabilities.cross:
            return dict(self.self_attention)
        return {"name": "vanilla"}

    def encoder_layer(self) -> EncoderLayer:
        return EncoderLayer(self)

    def decoder_layer(self, *, cross: bool = True) -> DecoderLayer:
        return DecoderLayer(self, cross=cross)


class FeedForward(nn.Module):
    """Position-wise feed-forward transition: Linear -> activation -> dropout -> Linear."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.act = {"relu": F.relu, "gelu": F.gelu}[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.fc2(self.dropout(self.act(self.fc1(x))))


class Residual(nn.Module):
    """Sublayer with residual, dropout and layer norm, pre- or post-norm (Vaswani: post-norm)."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, fn) -> torch.Tensor:
        if self.norm_first:
            return x + self.dropout(fn(self.norm(x)))
        return self.norm(x + self.dropout(fn(x)))


class EncoderLayer(nn.Module):
    """Self-attention + transition, each wrapped in ``Residual``."""

    def __init__(self, spec: LayerSpec, transition: nn.Module | None = None) -> None:
        super().__init__()
        self.self_attn = spec.attention(causal=False, cross=False)
        self.transition = transition or FeedForward(spec.d_model, spec.d_ff, spec.activation, spec.activation_dropout)
        self.attn_block = Residual(spec.d_model, spec.dropout, spec.norm_first)
        self.ffn_block = Residual(spec.d_model, spec.dropout, spec.norm_first)

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.attn_block(x, lambda h: self.self_attn(h, key_padding_mask=padding_mask))
        return self.ffn_block(x, lambda h: self.transition(h, padding_mask))


class DecoderLayer(nn.Module):
    """Causal self-attention, optional cross-attention to a memory, then transition."""

    def __init__(self, spec: LayerSpec, *, cross: bool = True, transition: nn.Module | None = None) -> None:
        super().__init__()
        self.self_attn = spec.attention(causal=True, cross=False)
        self.cross_attn = spec.attention(causal=False, cross=True) if cross else None
        self.transition = transition or FeedForward(spec.d_model, spec.d_ff, spec.activation, spec.activation_dropout)
        self.attn_block = Residual(spec.d_model, spec.dropout, spec.norm_first)
        self.cross_block = Residual(spec.d_model, spec.dropout, spec.norm_first) if cross else None
        self.ffn_block = Residual(spec.d_model, spec.dropout, spec.norm_first)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        memory_padding_mask: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        cache: dict | None = None,
    ) -> torch.Tensor:
        self_cache = cross_cache = None
        if cache is not None:
            self_cache = cache.setdefault("self", {})
            cross_cache = cache.setdefault("cross", {})
        x = self.attn_block(x, lambda h: self.self_attn(h, key_padding_mask=padding_mask, cache=self_cache))
        if self.cross_attn is not None:
            x = self.cross_block(
                x, lambda h: self.cross_attn(h, memory, memory_padding_mask=memory_padding_mask, cache=cross_cache)
            )
        if cache is not None and getattr(self.transition, "uses_cache", False):
            # A causal convolutional transition (UT sepconv) needs the previous positions' inputs.
            transition_cache = cache.setdefault("transition", {})
            return self.ffn_block(x, lambda h: self.transition(h, padding_mask, cache=transition_cache))
        return self.ffn_block(x, lambda h: self.transition(h, padding_mask))
