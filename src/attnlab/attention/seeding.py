"""Per-layer random draws: a module that must differ from layer to layer draws from its place in the model.

A module built alone does not know which layer it is; once a network is assembled,
``attention.base.number_attention_layers`` tells each attention module its layer index (``bind_layer``),
and a fixed random component redraws from ``layer_seed(base seed, "layer<i>/<component>")``: a stable hash,
so the draw depends on the run seed and the layer only: the same on every machine, the same when the model
is rebuilt, and different for every layer.
"""

from __future__ import annotations

import hashlib


def layer_seed(base_seed: int, path: str) -> int:
    """A 63-bit seed derived from (base_seed, path); stable across processes (no Python ``hash``)."""
    digest = hashlib.sha256(f"{int(base_seed)}/{path}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)
