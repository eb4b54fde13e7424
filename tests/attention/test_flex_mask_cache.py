"""FlexAttention's block tables are built once per plan, padded batches included (issue 50.2): the cache held
16 masks and skipped padded calls, so a 12+12-layer model rebuilt its plans' masks in every layer of every
padded batch."""

from __future__ import annotations

import torch

from attnlab.attention.bigbird import build_bigbird_plan, draw_random_blocks
from attnlab.attention.kernels import blocksparse_flex
from attnlab.attention.kernels.blocksparse_reference import BlockSparsePlan, blocksparse_attention


def test_padded_calls_of_24_layers_build_each_plans_tables_once(monkeypatch):
    built = []
    original = BlockSparsePlan.block_mask
    monkeypatch.setattr(BlockSparsePlan, "block_mask", lambda self: built.append(self) or original(self))
    plans = [build_bigbird_plan(draw_random_blocks(8, heads=2, window_blocks=3, num_global_blocks=2,
                                                   num_random_blocks=1, causal=False,
                                                   generator=torch.Generator().manual_seed(layer)),
                                8, block_size=4, window_blocks=3, num_global_blocks=2, causal=False)
             for layer in range(24)]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 32, 8, generator=g) for _ in range(3))
    for lengths in ([32, 27], [30, 25]):  # two batches, different padding
        pad = torch.arange(32)[None] >= torch.tensor(lengths)[:, None]
        for plan in plans:
            out = blocksparse_flex.flex_blocksparse_attention(q, k, v, plan, key_padding_mask=pad, compiled=False)
            real = ~pad[:, None, :, None]
            torch.testing.assert_close(out * real, blocksparse_attention(q, k, v, plan, key_padding_mask=pad) * real,
                                       atol=1e-5, rtol=1e-5)
    ids = {id(p) for p in plans}
    flex_built = [p for p in built if id(p) in ids]
    # the reference builds no block mask; flex built each plan's tables once, not once per call
    assert len(flex_built) == 24 and {id(p) for p in flex_built} == ids
