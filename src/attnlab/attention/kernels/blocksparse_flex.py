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


def plan_to_block_mask(plan: BlockSparsePlan, key_padding_mask: torch.Tensor | None, batch: int):
    """A BlockMask equivalent to the plan (and the causal and padding masks)."""
    nb, bs = plan.num_blocks, plan.block_size
    dev = plan.key_blocks.device
    allowed = plan.block_mask()  # (P, nb, nb) bool, causal handled by mask_mod on the diagonal
    eye = torch.eye(nb, dtype=torch.bool, device=dev)[None]
    if key_padding_mask is not None:
        partial, full = allowed, torch.zeros_like(allowed)
    elif plan.causal:
        partial, full = allowed & eye, allowed & ~eye
    else:
        partial, full = torch.zeros_like(allowed), allowed

    def tables(m):
        counts = m.sum(-1).to(torch.int32)
        order = torch.sort((~m).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
        return counts[None].contiguous(), order[None].contiguous()  # (1, P, nb), (1, P, nb, nb)

    kv_num, kv_idx = tables(partial)
    full_num, full_idx = tables(full)
    pad = key_padding_mask
    causal = plan.causal

    heads = allowed.shape[0]

    def mask_mod(b, h, q_idx, kv_idx_):
        # The plan itself, not only the block tables: the compiled kernel evaluates mask_mod on partial
        # blocks only, but the eager (unfused) path, which dynamo falls back to, reads nothing else.
        ok = allowed[h if heads > 1 else h * 0, q_idx // bs, kv_idx_ // bs]
        if causal:
            ok = ok & (kv_idx_ <= q_idx)
        if pad is not None:
            ok = ok & ~pad[b, kv_idx_]
        return ok

    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=bs, mask_mod=mask_mod, seq_lengths=(nb * bs, nb * bs)
    )


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
    if block_mask is None and pad is None:
        hit = _MASKS.get(id(plan))
        if hit is None or hit[0] is not plan:
            if len(_MASKS) > 16:
                _MASKS.clear()
            hit = _MASKS[id(plan)] = (plan, plan_to_block_mask(plan, None, b))
        block_mask = hit[1]
    elif block_mask is None:
        block_mask = plan_to_block_mask(plan, pad, b)
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
