"""The stacked Transformer: ``num_layers`` distinct layers applied once each (Vaswani et al.), registered as the
recurrence ``stacked``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attnlab.models.blocks import LayerSpec
from attnlab.models.recurrence import register_recurrence


@dataclass
class StackedOptions:
    """The stacked Transformer has no options beyond the model's ``num_layers``."""


class StackedEncoder(nn.Module):
    adds_positions = False

    def __init__(self, spec: LayerSpec, num_layers: int, options: StackedOptions) -> None:
        super().__init__()
        self.layers = nn.ModuleList(spec.encoder_layer() for _ in range(num_layers))
        self.final_norm = nn.LayerNorm(spec.d_model) if spec.norm_first else nn.Identity()

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None):
        for layer in self.layers:
            x = layer(x, padding_mask)
        return self.final_norm(x), {}


class StackedDecoder(nn.Module):
    adds_positions = False

    def __init__(self, spec: LayerSpec, num_layers: int, options: StackedOptions, *, cross: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(spec.decoder_layer(cross=cross) for _ in range(num_layers))
        self.final_norm = nn.LayerNorm(spec.d_model) if spec.norm_first else nn.Identity()

    def forward(self, x, memory=None, memory_padding_mask=None, padding_mask=None, cache=None):
        for i, layer in enumerate(self.layers):
            layer_cache = cache.setdefault(i, {}) if cache is not None else None
            x = layer(x, memory, memory_padding_mask, padding_mask, cache=layer_cache)
        return self.final_norm(x), {}


register_recurrence("stacked", options=StackedOptions, encoder=StackedEncoder, decoder=StackedDecoder)
