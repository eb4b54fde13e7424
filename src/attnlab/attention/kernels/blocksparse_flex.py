"""FlexAttention path for block-sparse plans: the fused kernel on GPU (Triton), compiled C++ on CPU.

``torch.nn.attention.flex_attention`` takes a ``BlockMask`` built here from the same plan tables as the
reference (``blocksparse_reference``): for query block i, the listed key blocks are the BlockMask's kv
blocks; blocks that need an element mask (the diagonal block of a causal plan, every block when there is
key padding) are "partial" blocks evaluated with ``mask_mod``, the others "full" blocks.

Per-head plans (``plan.key_blocks`` of shape (P, R, K)) become a BlockMask with P heads (P = 1 broadcasts).

Compilation: ``torch.compile(flex_attention, fullgraph=True)`` (automatic dynamic shapes on CUDA, static
on CPU: ``_compiled_for``), fed lengths bucketed by the caller (``flex_bucket``: powers of two of blocks,
capped at the plan frame), so a run compiles a handful of graphs. Should dynamo still hit its recompile
limit, it would silently run the unfused eager version, which materialises L x L scores; with
``fullgraph=True`` it raises instead, and this module logs once and serves the call (and later ones) with
the blocked kernel, which keeps memory linear.

Differences from the reference, both outside its contract: a query row whose keys are all masked (a
padded position that sees only padding) gets 0 instead of the reference's uniform average, and ETC extra
keys are not supported. In torch 2.13 FlexAttention has no backward on CPU: ``flex_available(device,
need_grad)`` tells the caller when this path can serve.
"""

from __future__ import annotations

import functools
import logging

import torch

from attnlab.attention.kernels.blocksparse_blocked import blocked_blocksparse_attention
from attnlab.attention.kernels.blocksparse_reference import BlockSparsePlan, check_plan_heads

log = logging.getLogger(__name__)

try:  # pragma: no cover - import guard for old torch
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # pragma: no cover
    BlockMask = flex_attention = None


def flex_available(device: torch.device, need_grad: bool) -> bool:
    if flex_attention is None:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and not need_grad


_MASKS: dict = {}
_FALLEN_BACK: set = set()  # devices where the compiled kernel hit dynamo's recompile limit


def flex_bucket(num_blocks: int, max_blocks: int) -> int:
    """The block count a sequence of ``num_blocks`` blocks is padded to for the compiled kernel: the next
    power of two, capped at ``max_blocks`` (the plan frame). At most log2(max_blocks) + 2 lengths."""
    bucket = 1
    while bucket < num_blocks:
        bucket *= 2
    return max(num_blocks, min(bucket, max_blocks))


@functools.lru_cache(maxsize=2)
def _compiled(dynamic: bool | None):
    return torch.compile(flex_attention, fullgraph=True, dynamic=dynamic)


def _compiled_for(device: torch.device):
    """CUDA: dynamo's automatic dynamic shapes (one graph for the lengths and batch sizes after a first
    recompile). CPU: static shapes per bucket, because torch 2.13's inductor CPU template fails to compile
    FlexAttention with dynamic shapes (C++ error 'cur_kvSplitSize5 was not declared', seen here)."""
    return _compiled(None if device.type == "cuda" else False)


# The BlockMask tile FlexAttention's compiled kernels run with, by device type. On Hopper (sm90, head size 64)
# inductor's only backward configs tile by 128 and it drops every config whose tile does not divide the
# BlockMask's block before kernel options apply, so a BlockMask of BigBird's 64-token blocks finds no backward
# kernel (issue 35). A 128-token tile covers 2 x 2 plan blocks: "full" where all four are in the plan,
# "partial" (evaluated with mask_mod, which reads the 64-block plan) where some are, absent where none are,
# so the attention is exactly the plan's. CPU runs eager or forward-only: the plan's own block.
KERNEL_TILE = {"cuda": 128}


def kernel_tile(plan: BlockSparsePlan, device: torch.device) -> int:
    """The BlockMask block size for ``plan`` on ``device``: ``KERNEL_TILE`` when it is a multiple of the
    plan's block (blocks larger than the tile are used as they are), else the plan's block."""
    tile = KERNEL_TILE.get(device.type, plan.block_size)
    return tile if tile > plan.block_size and tile % plan.block_size == 0 else plan.block_size


def plan_to_block_mask(plan: BlockSparsePlan, key_padding_mask: torch.Tensor | None, batch: int,
                       tile: int | None = None):
    """A BlockMask equivalent to the plan (and the causal and padding masks), in tiles of ``tile`` tokens
    (a multiple of the plan's block; default the plan's block). The sequence is ``plan.num_blocks`` blocks;
    a last tile that reaches past it is partial and ``mask_mod`` refuses the positions beyond. The tile
    tables depend on the plan and on whether there is padding, not on the padding itself: they are built
    once per plan (``_tile_tables``), and a padded call only makes a new ``mask_mod``."""
    nb, bs = plan.num_blocks, plan.block_size
    tile = bs if tile is None else int(tile)
    if tile % bs:
        raise ValueError(f"a BlockMask tile of {tile} tokens does not hold whole plan blocks of {bs}")
    allowed, kv_num, kv_idx, full_num, full_idx = _tile_tables(plan, tile, key_padding_mask is not None)
    heads = allowed.shape[0]
    pad = key_padding_mask
    causal = plan.causal

    def mask_mod(b, h, q_idx, kv_idx_):
        # The plan itself, not only the tile tables: the compiled kernel evaluates mask_mod on partial tiles,
        # where the 64-block plan decides per block, and the eager (unfused) path reads nothing else.
        ok = allowed[h if heads > 1 else h * 0, q_idx // bs, kv_idx_ // bs]
        if causal:
            ok = ok & (kv_idx_ <= q_idx)
        if pad is not None:
            ok = ok & ~pad[b, kv_idx_]
        return ok

    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=tile, mask_mod=mask_mod, seq_lengths=(nb * bs, nb * bs)
    )


_TABLES: dict = {}  # {(id(plan), tile, padded): (plan, tables)}; the plan is held so its id is not reused
_MAX_TABLES = 256  # every layer of a 12+12-layer model at several length buckets, padded and not


def _tile_tables(plan: BlockSparsePlan, tile: int, padded: bool) -> tuple:
    """(allowed (P, nt*f, nt*f) block plan, kv_num, kv_idx, full_num, full_idx) of ``plan_to_block_mask``,
    cached per plan, tile and whether the call has padding (with padding every touched tile is partial)."""
    key = (id(plan), tile, padded)
    hit = _TABLES.get(key)
    if hit is not None and hit[0] is plan:
        return hit[1]
    nb, bs = plan.num_blocks, plan.block_size
    f = tile // bs  # plan blocks per tile side
    nt = -(-nb // f)  # tiles per side
    dev = plan.key_blocks.device
    fine = plan.block_mask()  # (P, nb, nb) bool, causal handled by mask_mod on and below the diagonal
    heads = fine.shape[0]
    # The plan on a whole number of tiles: blocks past the sequence are never attended.
    allowed = torch.zeros(heads, nt * f, nt * f, dtype=torch.bool, device=dev)
    allowed[:, :nb, :nb] = fine
    cells = allowed.view(heads, nt, f, nt, f)
    any_cell = cells.any(dim=(2, 4))  # (P, nt, nt): the tile computes something
    all_cells = cells.all(dim=(2, 4))  # every block of the tile is in the plan
    eye = torch.eye(nt, dtype=torch.bool, device=dev)[None]
    exact_tiles = all_cells if nt * f == nb else all_cells & ~_edge(nt, dev)  # tiles past the end are partial
    if padded:
        partial, full = any_cell, torch.zeros_like(any_cell)
    elif plan.causal:
        full = exact_tiles & ~eye
        partial = any_cell & ~full
    else:
        full = exact_tiles
        partial = any_cell & ~full

    def tables(m):
        counts = m.sum(-1).to(torch.int32)
        order = torch.sort((~m).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
        return counts[None].contiguous(), order[None].contiguous()  # (1, P, nt), (1, P, nt, nt)

    result = (allowed, *tables(partial), *tables(full))
    if len(_TABLES) >= _MAX_TABLES:
        for old in list(_TABLES)[: _MAX_TABLES // 2]:  # the oldest half goes
            del _TABLES[old]
    _TABLES[key] = (plan, result)
    return result


def _edge(nt: int, device) -> torch.Tensor:
    """(1, nt, nt) bool: tiles in the last tile row or column (they reach past a sequence that ends mid-tile)."""
    edge = torch.zeros(nt, nt, dtype=torch.bool, device=device)
    edge[-1, :] = edge[:, -1] = True
    return edge[None]


def flex_blocksparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: BlockSparsePlan,
    *,
    key_padding_mask: torch.Tensor | None = None,
    scale: float | None = None,
    block_mask=None,
    compiled: bool = True,
) -> torch.Tensor:
    """q, k, v (B, H, nb*bs, Dh) -> (B, H, nb*bs, Dh) through FlexAttention with the plan's BlockMask."""
    if flex_attention is None:
        raise RuntimeError("torch.nn.attention.flex_attention is not available in this torch")
    b = q.shape[0]
    check_plan_heads(plan, q.shape[1])
    pad = None if key_padding_mask is None else key_padding_mask.to(torch.bool)
    tile = kernel_tile(plan, q.device) if compiled else plan.block_size
    if block_mask is None and pad is None:
        hit = _MASKS.get((id(plan), tile))
        if hit is None or hit[0] is not plan:
            if len(_MASKS) >= _MAX_TABLES:
                for old in list(_MASKS)[: _MAX_TABLES // 2]:
                    del _MASKS[old]
            hit = _MASKS[(id(plan), tile)] = (plan, plan_to_block_mask(plan, None, b, tile))
        block_mask = hit[1]
    elif block_mask is None:
        block_mask = plan_to_block_mask(plan, pad, b, tile)
    if not compiled:
        return flex_attention(q, k, v, block_mask=block_mask, scale=scale)
    if q.device in _FALLEN_BACK:
        return blocked_blocksparse_attention(q, k, v, plan, key_padding_mask=pad, scale=scale)
    try:
        return _compiled_for(q.device)(q, k, v, block_mask=block_mask, scale=scale)
    except torch._dynamo.exc.FailOnRecompileLimitHit:
        _FALLEN_BACK.add(q.device)
        log.warning("bigbird: compiled FlexAttention hit torch._dynamo's recompile limit on %s; this and later "
                    "calls use the blocked kernel (linear memory) instead of the unfused L x L fallback", q.device)
        return blocked_blocksparse_attention(q, k, v, plan, key_padding_mask=pad, scale=scale)
