"""The registry of depth recurrences (how layers are applied) and the contract of their stacks.

``models/stacked.py`` registers ``stacked`` (N distinct layers, Vaswani et al.), ``models/universal.py`` the
Universal Transformer's ``ut`` and ``ut_act``; the package ``attnlab.models`` imports both, so importing this
module (which imports the package first) finds them registered. Contract for every recurrence:

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

from torch import nn

from attnlab.models.blocks import LayerSpec
from attnlab.registry import Registry


@dataclass(frozen=True)
class Recurrence:
    """What a depth scheme declares when it registers: its options dataclass (checked by the config validator),
    its encoder and decoder stack classes, and whether its stacks report per-position steps (ACT), which the
    ponder statistics callback records."""

    options: type
    encoder: type
    decoder: type
    emits_ponder_steps: bool = False


RECURRENCES: Registry[Recurrence] = Registry("recurrence")


def register_recurrence(name: str, *, options: type, encoder: type, decoder: type,
                        emits_ponder_steps: bool = False) -> None:
    RECURRENCES.register(name, Recurrence(options, encoder, decoder, emits_ponder_steps))


def emits_ponder_steps(name: str) -> bool:
    """Whether the recurrence ``name`` reports per-position ponder steps (as its registration declares)."""
    return name in RECURRENCES and RECURRENCES.get(name).emits_ponder_steps


def available_recurrences() -> list[str]:
    return RECURRENCES.names()


def recurrence_options(name: str) -> type:
    return RECURRENCES.get(name).options


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
    return RECURRENCES.get(name).encoder(spec, num_layers, opts)


def build_decoder_stack(recurrence: dict[str, Any], spec: LayerSpec, num_layers: int, *, cross: bool) -> nn.Module:
    name, opts = _options(recurrence)
    return RECURRENCES.get(name).decoder(spec, num_layers, opts, cross=cross)
