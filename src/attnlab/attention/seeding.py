"""Per-layer random draws: a module that must differ from layer to layer draws from its place in the model.

A module built alone does not know which layer it is; once a network is assembled, ``draw_per_layer``
walks it and calls ``draw_for_layer(path)`` on every module that defines it, with ``path`` its qualified
name (``decoder.layers.2.self_attn.components.fixed_random``). The seed of a draw is a stable hash of
(base seed, path), so it depends on the run seed and the layer only: the same on every machine, the same
when the model is rebuilt, and different for every layer, stack and role.
"""

from __future__ import annotations

import hashlib

from torch import nn


def layer_seed(base_seed: int, path: str) -> int:
    """A 63-bit seed derived from (base_seed, path); stable across processes (no Python ``hash``)."""
    digest = hashlib.sha256(f"{int(base_seed)}/{path}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def draw_per_layer(model: nn.Module) -> nn.Module:
    """Let every module with ``draw_for_layer(path)`` draw its per-layer randomness; returns ``model``."""
    for path, module in model.named_modules():
        draw = getattr(module, "draw_for_layer", None)
        if callable(draw):
            draw(path)
    return model
