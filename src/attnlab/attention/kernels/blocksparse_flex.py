"""FlexAttention path for block-sparse plans: the fused kernel on GPU (Triton), compiled C++ on CPU.

``torch.nn.attention.flex_attention`` takes a ``BlockMask`` built here from the same plan tables as the
reference (``blocksparse_reference``): for query block i, the listed key blocks are the BlockMask's kv
blocks; blocks that need an element mask (the diagonal block of a causal plan, every block when there is
key padding) are "partial" blocks evaluated with ``mask_mod``, the others "full" blocks.

Differences from the reference, both outside its contract: a query row whose keys are all masked (a
padded position that sees only padding) gets 0 instead of the reference's uniform average, and ETC extra
keys are not supported (the caller routes them elsewhere). In torch 2.13 FlexAttention has no backward on
CPU: ``flex_available(device, need_grad)`` tells the caller when this path can serve.
"""

from __future__ import annotations

import functools

import torch

from attnlab.attention.kernels.blocksparse_reference import BlockSparsePlan

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


@functools.lru_cache(maxsize=4)
def _compiled(dynamic: bool):
    return torch.compile(flex_attention, dynamic=dynamic)


def plan_to_block_mask(plan: BlockSparsePlan, key_padding_mask: torch.Tensor | None, batch: int):
    """A BlockMask equivalent to the plan (and the causal and padding masks)."""
    nb, bs = plan.num_blocks, plan.block_size
    dev = plan.key_blocks.device
    allowed = plan.block_mask()  # (nb, nb) bool, causal handled by mask_mod on the diagonal
    eye = torch.eye(nb, dtype=torch.bool, device=dev)
    if key_padding_mask is not None:
        partial, full = allowed, torch.zeros_like(allowed)
    elif plan.causal:
        partial, full = allowed & eye, allowed & ~eye
    else:
        partial, full = torch.zeros_like(allowed), allowed

    def tables(m):
        counts = m.sum(1).to(torch.int32)
        order = torch.sort((~m).to(torch.int8), dim=1, stable=True).indices.to(torch.int32)
        return counts[None, None].contiguous(), order[None, None].contiguous()

    kv_num, kv_idx = tables(partial)
    full_num, full_idx = tables(full)
    pad = key_padding_mask
    causal = plan.causal

    def mask_mod(b, h, q_idx, kv_idx_):
        ok = kv_idx_ >= 0
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
    fn = _compiled(False) if compiled else flex_attention
    return fn(q, k, v, block_mask=block_mask, scale=scale)
