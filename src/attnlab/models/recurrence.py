"""Depth recurrences: how layers are applied. ``stacked`` is N distinct layers (Vaswani et al.).

Contract for every recurrence (the Universal Transformer registers ``ut`` and ``ut_act`` here):

- ``EncoderStack.forward(x, padding_mask) -> (h, aux)``
- ``DecoderStack.forward(x, memory=None, memory_padding_mask=None, padding_mask=None, cache=None)
  -> (h, aux)``; ``memory`` is None for a decoder-only LM; ``cache`` is a dict owned by the stack
  (empty at the first incremental step) and ``x`` then holds the next position(s).
- ``x`` is the scaled token embedding; a stack whose ``adds_positions`` is False gets positions added
  by the network first, a stack with ``adds_positions = True`` adds its own coordinate signals.
- ``aux`` is a dict; the training module adds every ``aux["loss/<name>"]`` to the loss and logs
  ``aux["log/<name>"]`` values (floats or 0-dim tensors). ``aux["steps"]`` (batch, length) may hold
  per-position step counts.
- Norm-first stacks end with a final layer norm.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnlab.models.blocks import LayerSpec

_RECURRENCES: dict[str, tuple[type, type, type]] = {}
_EMITS_PONDER_STEPS: set[str] = set()


def register_recurrence(name: str, *, options: type, encoder: type, decoder: type,
                        emits_ponder_steps: bool = False) -> None:
    """Register a depth scheme; ``emits_ponder_steps``: its stacks report per-position steps (ACT), which the
    ponder statistics callback records."""
    if name in _RECURRENCES:
        raise ValueError(f"recurrence {name!r} registered twice")
    _RECURRENCES[name] = (options, encoder, decoder)
    if emits_ponder_steps:
        _EMITS_PONDER_STEPS.add(name)


def emits_ponder_steps(name: str) -> bool:
    """Whether the recurrence ``name`` reports per-position ponder steps (as its registration declares)."""
    _load()
    return name in _EMITS_PONDER_STEPS


def _load() -> None:
    import attnlab.models.universal  # noqa: F401  (registers ut / ut_act when present)


def available_recurrences() -> list[str]:
    _load()
    return sorted(_RECURRENCES)


def recurrence_options(name: str) -> type:
    _load()
    if name not in _RECURRENCES:
        raise ValueError(f"unknown recurrence {name!r}; valid: {', '.join(sorted(_RECURRENCES))}")
    return _RECURRENCES[name][0]


def _options(cfg: dict[str, Any]):
    cfg = dict(cfg)
    name = cfg.pop("name")
    opts_cls = recurrence_options(name)
    known = {f.name for f in dataclasses.fields(opts_cls)}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(
            f"recurrence {name!r} has no option(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}"
        )
    return name, opts_cls(**cfg)


def build_encoder_stack(recurrence: dict[str, Any], spec: LayerSpec, num_layers: int) -> nn.Module:
    name, opts = _options(recurrence)
    return _RECURRENCES[name][1](spec, num_layers, opts)


def build_decoder_stack(recurrence: dict[str, Any], spec: LayerSpec, num_layers: int, *, cross: bool) -> nn.Module:
    name, opts = _options(recurrence)
    return _RECURRENCES[name][2](spec, num_layers, opts, cross=cross)


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
