"""Shared builders for the attention tests: tiny dimensions so the whole suite runs in seconds on CPU."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import build_attention

D_MODEL, HEADS, MAX_LEN = 32, 4, 64

# Per-variant options that make a small test meaningful: BigBird with blocks of 4 and the fallback off,
# so sequences of ~30 positions take the sparse path with blocks outside every row's plan.
SMALL_OPTIONS = {"bigbird": {"block_size": 4, "num_random_blocks": 1, "dense_fallback_len": 0}}


@pytest.fixture
def make():
    def _make(name: str, *, causal: bool = False, cross: bool = False, torch_seed: int = 0, **options):
        torch.manual_seed(torch_seed)
        opts = {**SMALL_OPTIONS.get(name, {}), **options}
        module = build_attention(
            name, d_model=D_MODEL, num_heads=HEADS, max_len=MAX_LEN, causal=causal, dropout=0.0,
            cross=cross, **opts,
        )
        return module.eval()

    return _make
