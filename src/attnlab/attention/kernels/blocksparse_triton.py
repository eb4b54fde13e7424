"""BigBird's own block-sparse flash attention in Triton: forward and backward over the plan's blocks.

Same contract as ``blocksparse_reference.blocksparse_attention`` (the plan layout is documented there), held
equal to it in value and gradient by ``tests/attention/test_bigbird_triton.py`` (run under
``TRITON_INTERPRET=1`` on CPU), with three differences that stay outside what the model uses:

- key padding is given as per-sequence lengths (keys at or past ``lengths[b]`` are padding), not a mask
  tensor: ``lengths_from_padding`` turns a mask into lengths when its padding is a suffix, and says None
  otherwise (the caller then uses another kernel);
- a query row that sees no key at all (only possible through padding) gets 0, as FlexAttention gives, where
  the reference averages its gathered keys uniformly;
- no ETC extra keys.

How it works (the Triton programs are in ``_blocksparse_triton_jit``):

- Per plan, once, on the device (``layout_for``, cached): the lists of key blocks of each (plan head, query
  block) for the forward and dQ, and the transposed lists of query blocks of each (plan head, key block) for
  dK/dV, so every gradient block is written by its own programs: no atomics, deterministic. A list longer
  than SEG blocks (SEG = the longest sparse row; the dense rows of global query blocks and the columns of
  global key blocks are much longer) is split into items of SEG blocks each; their partial results are
  merged afterwards, by log-sum-exp for the forward and by a plain sum for the gradients.
- Online softmax in fp32 over tiles of one plan block (64 x 64 for BigBird's blocks), head sizes that are
  powers of two from 16 (32/64/128 in practice). Causal: the element mask ``key <= query``.
- Registered as the custom op ``attnlab::blocksparse_flash`` with a fake (shapes only) and an autograd
  formula (the op ``attnlab::blocksparse_flash_backward``): dynamo treats it as opaque, so it adds no guard,
  never hits the recompile limit and runs inside ``hardware.compile``. FLOP formulas for both ops count the
  plan's tiles, so MFU needs no reference pass over a whole batch.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import register_flop_formula

from attnlab.attention.kernels.blocksparse_reference import BlockSparsePlan, check_plan_shape

LOG2E = 1.4426950408889634
# Launch settings on a GPU; ``benchmarks/gpu_check.py`` times the ``TRITON_CONFIGS`` list on the first GPU
# lent, and the fastest becomes the default. Ignored by the interpreter.
LAUNCH = {"num_warps": 4, "num_stages": 2}
TRITON_CONFIGS = [{"num_warps": w, "num_stages": s} for w in (4, 8) for s in (2, 3, 4)]

try:  # the kernel needs the optional dependency ``pip install attnlab[triton]``
    import triton  # noqa: F401

    _TRITON_ERROR = None
except ImportError as exc:  # pragma: no cover - depends on the install
    _TRITON_ERROR = f"triton is not installed ({exc.__class__.__name__}: {exc})"


def interpreting() -> bool:
    """True when Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``, the CPU test mode)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_unavailable(device: torch.device) -> str | None:
    """Why this kernel cannot run on ``device`` (one line), or None when it can: a CUDA device with triton
    installed, or a CPU under the Triton interpreter."""
    if _TRITON_ERROR is not None:
        return _TRITON_ERROR
    if device.type == "cuda" or (device.type == "cpu" and interpreting()):
        return None
    return f"triton kernels run on CUDA (or on CPU under TRITON_INTERPRET=1), not on {device.type}"


def shape_unsupported(block_size: int, head_dim: int) -> str | None:
    """Why the kernel cannot serve a plan block / head size (``tl.dot`` needs powers of two >= 16), or None."""
    for name, n in (("block_size", block_size), ("head size", head_dim)):
        if n < 16 or n & (n - 1):
            return f"{name} {n} is not a power of two >= 16"
    return None


# -- the plan's work lists -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkList:
    """Programs of one kernel: item i handles output block ``item_block[i]``, reading the input blocks
    ``lists[p, i, :counts[p, i]]`` in plan head p. Output blocks with one item take it as is
    (``single_items`` -> ``single_blocks``); the others merge the items ``multi_items[g]`` (padded with the
    index ``n_items``, an empty item) into ``multi_blocks[g]``."""

    item_block: torch.Tensor  # (n_items,) int32
    lists: torch.Tensor  # (P, n_items, seg) int32
    counts: torch.Tensor  # (P, n_items) int32
    single_items: torch.Tensor  # (n_single,) long
    single_blocks: torch.Tensor  # (n_single,) long
    multi_items: torch.Tensor  # (n_multi, max_segments) long
    multi_blocks: torch.Tensor  # (n_multi,) long

    def tensors(self) -> list[torch.Tensor]:
        return [self.item_block, self.lists, self.counts, self.single_items, self.single_blocks,
                self.multi_items, self.multi_blocks]

    @staticmethod
    def of(tensors: list[torch.Tensor]) -> WorkList:
        return WorkList(*tensors)


def work_list(incidence: torch.Tensor, seg: int) -> WorkList:
    """The work list of ``incidence`` (P, n_out, n_in) bool (output block o reads input block i in plan head
    p): each output block gets ceil(max over heads of its count / seg) items (at least one, so that every
    block is written), its inputs in ascending order."""
    ph, n_out, n_in = incidence.shape
    counts = incidence.sum(2)  # (P, n_out)
    segments = ((counts.amax(0) + seg - 1) // seg).clamp(min=1)  # (n_out,)
    item_block = torch.repeat_interleave(torch.arange(n_out), segments)
    first = torch.cumsum(segments, 0) - segments
    segment = torch.arange(item_block.numel()) - first[item_block]  # index of the item within its block
    members = torch.sort((~incidence).to(torch.int8), dim=2, stable=True).indices  # members first, ascending
    slot = segment[:, None] * seg + torch.arange(seg)  # (n_items, seg)
    lists = members[:, item_block[:, None], slot.clamp(max=n_in - 1)]
    item_counts = (counts[:, item_block] - segment[None, :] * seg).clamp(0, seg)
    lists = torch.where(torch.arange(seg) < item_counts[..., None], lists, 0)
    single = segments[item_block] == 1
    multi_blocks = torch.nonzero(segments > 1).flatten()
    width = int(segments.max()) if multi_blocks.numel() else 0
    multi_items = first[multi_blocks, None] + torch.arange(width)
    multi_items = torch.where(torch.arange(width) < segments[multi_blocks, None], multi_items, item_block.numel())
    return WorkList(
        item_block.to(torch.int32), lists.to(torch.int32).contiguous(), item_counts.to(torch.int32).contiguous(),
        torch.nonzero(single).flatten(), item_block[single], multi_items, multi_blocks,
    )


@dataclass(frozen=True)
class TritonLayout:
    """What the kernel needs of a plan, built once per plan and device (``layout_for``)."""

    block_size: int
    seg: int
    causal: bool
    forward: WorkList  # per query block: key blocks (forward and dQ)
    transposed: WorkList  # per key block: query blocks (dK, dV)
    tile_pairs: int  # (query block, key block) tiles computed per sequence, summed over plan heads


def build_layout(plan: BlockSparsePlan) -> TritonLayout:
    """The plan's work lists (on the plan's device). A causal plan's blocks after the query block are left
    out (everything in them is masked)."""
    incidence = plan.block_mask().cpu()  # (P, nb, nb): the sparse rows' lists and the dense rows
    nb = plan.num_blocks
    if plan.causal:
        incidence &= torch.ones(nb, nb, dtype=torch.bool).tril()
    sparse_counts = plan.key_valid.sum(2)
    seg = max(1, int(sparse_counts.max())) if sparse_counts.numel() else max(1, min(nb, 8))
    device = plan.key_blocks.device
    forward = WorkList.of([t.to(device) for t in work_list(incidence, seg).tensors()])
    transposed = WorkList.of([t.to(device) for t in work_list(incidence.transpose(1, 2), seg).tensors()])
    return TritonLayout(plan.block_size, seg, plan.causal, forward, transposed, int(incidence.sum()))


# {id(plan): (plan, layout)}; the plan is held so that its id is not reused while its layout is cached.
_LAYOUTS: dict[int, tuple[BlockSparsePlan, TritonLayout]] = {}
_MAX_LAYOUTS = 256  # every layer of a 12+12-layer model at 10 lengths: a forward never evicts its own plans


def layout_for(plan: BlockSparsePlan) -> TritonLayout:
    """``build_layout(plan)``, cached for as long as the plan object lives (a plan is immutable). Under
    ``torch.compile`` a cached layout is a constant of the graph; a missing one is built outside it."""
    hit = _LAYOUTS.get(id(plan))
    if hit is not None and hit[0] is plan:
        return hit[1]
    return _cache_layout(plan)


@torch.compiler.disable
def _cache_layout(plan: BlockSparsePlan) -> TritonLayout:
    if len(_LAYOUTS) >= _MAX_LAYOUTS:
        for key in list(_LAYOUTS)[: _MAX_LAYOUTS // 2]:  # the oldest half goes
            del _LAYOUTS[key]
    layout = build_layout(plan)
    _LAYOUTS[id(plan)] = (plan, layout)
    return layout


def lengths_from_padding(key_padding_mask: torch.Tensor | None, batch: int, length: int,
                         device: torch.device) -> torch.Tensor | None:
    """(B,) int32 real lengths for a (B, L) True-at-padding mask whose padding is a suffix of every row;
    None when some row has padding before a real key (the kernel cannot express it)."""
    if key_padding_mask is None:
        return torch.full((batch,), length, dtype=torch.int32, device=device)
    pad = key_padding_mask.to(torch.bool)
    lengths = (~pad).sum(1)
    suffix = torch.arange(length, device=pad.device)[None, :] >= lengths[:, None]
    if not bool(torch.equal(suffix, pad)):
        return None
    return lengths.to(torch.int32)


# -- launching -----------------------------------------------------------------------------------------------


def _kernels():
    from attnlab.attention.kernels import _blocksparse_triton_jit  # imports triton: only where a kernel launches

    return _blocksparse_triton_jit


def _head_strides(work: WorkList) -> tuple[int, int]:
    """Strides of ``lists`` and ``counts`` between plan heads: 0 when one plan serves every head."""
    if work.lists.shape[0] == 1:
        return 0, 0
    return work.lists.shape[1] * work.lists.shape[2], work.counts.shape[1]


def _settings(device: torch.device, block: int, head_dim: int, seg: int, causal: bool) -> dict:
    settings = {"CAUSAL": causal, "BLOCK": block, "HEAD_DIM": head_dim, "SEG": seg, "UPCAST": interpreting()}
    if device.type == "cuda":
        settings.update(LAUNCH)
    return settings


def _partials(batch: int, heads: int, work: WorkList, block: int, head_dim: int, device, count: int = 1):
    """``count`` fp32 buffers (B, H, n_items + 1, block, head_dim), the last item zero (the empty item that
    pads ``multi_items``)."""
    n = work.item_block.numel()
    out = []
    for _ in range(count):
        t = torch.empty(batch, heads, n + 1, block, head_dim, dtype=torch.float32, device=device)
        t[:, :, n] = 0
        out.append(t)
    return out


def _merge_softmax(part: torch.Tensor, lse_part: torch.Tensor, work: WorkList, nb: int):
    """Forward items -> (B, H, nb, block, D) output and (B, H, nb, block) log2-sum-exp: single items copied,
    split rows merged by their log-sum-exp (a row that saw no key in any item stays 0 / -inf)."""
    b, h, _, block, d = part.shape
    out = part.new_empty(b, h, nb, block, d)
    lse = lse_part.new_empty(b, h, nb, block)
    out[:, :, work.single_blocks] = part[:, :, work.single_items]
    lse[:, :, work.single_blocks] = lse_part[:, :, work.single_items]
    if work.multi_blocks.numel():
        lg = lse_part[:, :, work.multi_items]  # (B, H, G, S, block)
        top = lg.amax(3, keepdim=True)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        weight = torch.exp2(lg - top)
        total = weight.sum(3, keepdim=True)
        seen = total > 0
        weight = weight / torch.where(seen, total, torch.ones_like(total))
        out[:, :, work.multi_blocks] = (weight[..., None] * part[:, :, work.multi_items]).sum(3)
        merged = torch.where(seen, top + torch.log2(torch.where(seen, total, torch.ones_like(total))), -math.inf)
        lse[:, :, work.multi_blocks] = merged.squeeze(3)
    return out, lse


def _sum_items(part: torch.Tensor, work: WorkList, nb: int) -> torch.Tensor:
    """Gradient items -> (B, H, nb, block, D): single items copied, split blocks summed in a fixed order."""
    b, h, _, block, d = part.shape
    out = part.new_empty(b, h, nb, block, d)
    out[:, :, work.single_blocks] = part[:, :, work.single_items]
    if work.multi_blocks.numel():
        out[:, :, work.multi_blocks] = part[:, :, work.multi_items].sum(3)
    return out


@torch.library.custom_op("attnlab::blocksparse_flash", mutates_args=())
def blocksparse_flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, forward: list[torch.Tensor],
    transposed: list[torch.Tensor], scale: float, causal: bool, block: int, seg: int, tile_pairs: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, L, D) in q's dtype, lse (B, H, L) fp32 log2-sum-exp) for contiguous q, k, v (B, H, L, D).
    ``forward`` and ``transposed`` are ``WorkList.tensors()`` of the plan's layout; ``tile_pairs`` only feeds
    the FLOP formula."""
    b, h, length, d = q.shape
    work = WorkList.of(forward)
    (part,) = _partials(b, h, work, block, d, q.device)
    lse_part = part.new_empty(part.shape[:4])
    lse_part[:, :, -1] = -math.inf
    lists_head, counts_head = _head_strides(work)
    _kernels().blocksparse_fwd[(work.item_block.numel(), b * h)](
        q, k, v, part, lse_part, lengths, work.item_block, work.lists, work.counts,
        q.stride(0), q.stride(1), q.stride(2), part.stride(0), part.stride(1), part.stride(2),
        h, lists_head, counts_head, scale * LOG2E, **_settings(q.device, block, d, seg, causal),
    )
    out, lse = _merge_softmax(part, lse_part, work, length // block)
    return out.view(b, h, length, d).to(q.dtype), lse.view(b, h, length)


@blocksparse_flash.register_fake
def _(q, k, v, lengths, forward, transposed, scale, causal, block, seg, tile_pairs):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("attnlab::blocksparse_flash_backward", mutates_args=())
def blocksparse_flash_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    lengths: torch.Tensor, forward: list[torch.Tensor], transposed: list[torch.Tensor], scale: float,
    causal: bool, block: int, seg: int, tile_pairs: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) of ``blocksparse_flash`` for the output gradient ``dout``, FlashAttention-style: the
    probabilities are recomputed from ``lse``, with delta = rowsum(dO * O)."""
    b, h, length, d = q.shape
    nb = length // block
    dout = dout.contiguous()
    delta = (dout.float() * out.float()).sum(-1).contiguous()
    lse = torch.where(lse == -math.inf, math.inf, lse).contiguous()  # rows that saw no key: p = 0
    settings = _settings(q.device, block, d, seg, causal)
    common = (q.stride(0), q.stride(1), q.stride(2))

    rows = WorkList.of(forward)
    (dq_part,) = _partials(b, h, rows, block, d, q.device)
    lists_head, counts_head = _head_strides(rows)
    _kernels().blocksparse_bwd_dq[(rows.item_block.numel(), b * h)](
        q, k, v, dout, lse, delta, dq_part, lengths, rows.item_block, rows.lists, rows.counts,
        *common, dq_part.stride(0), dq_part.stride(1), dq_part.stride(2),
        h, length, lists_head, counts_head, scale * LOG2E, scale, **settings,
    )
    cols = WorkList.of(transposed)
    dk_part, dv_part = _partials(b, h, cols, block, d, q.device, count=2)
    lists_head, counts_head = _head_strides(cols)
    _kernels().blocksparse_bwd_dkdv[(cols.item_block.numel(), b * h)](
        q, k, v, dout, lse, delta, dk_part, dv_part, lengths, cols.item_block, cols.lists, cols.counts,
        *common, dk_part.stride(0), dk_part.stride(1), dk_part.stride(2),
        h, length, lists_head, counts_head, scale * LOG2E, scale, **settings,
    )
    grads = (_sum_items(dq_part, rows, nb), _sum_items(dk_part, cols, nb), _sum_items(dv_part, cols, nb))
    return tuple(g.view(b, h, length, d).to(t.dtype) for g, t in zip(grads, (q, k, v)))


@blocksparse_flash_backward.register_fake
def _(dout, q, k, v, out, lse, lengths, forward, transposed, scale, causal, block, seg, tile_pairs):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, lengths, forward, transposed, scale, causal, block, seg, tile_pairs = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse, lengths, *forward, *transposed)
    ctx.settings = (len(forward), scale, causal, block, seg, tile_pairs)


def _backward(ctx, dout, _dlse):
    n_forward, scale, causal, block, seg, tile_pairs = ctx.settings
    q, k, v, out, lse, lengths, *tables = ctx.saved_tensors
    dq, dk, dv = blocksparse_flash_backward(
        dout, q, k, v, out, lse, lengths, tables[:n_forward], tables[n_forward:], scale, causal, block, seg,
        tile_pairs,
    )
    no_grads = [None] * n_forward
    return dq, dk, dv, None, no_grads, no_grads, None, None, None, None, None


blocksparse_flash.register_autograd(_backward, setup_context=_setup_context)


def _register_flops() -> None:
    """Model FLOPs of the kernels for ``FlopCounterMode`` (MFU): 2 matmuls of block x block x D per tile in
    the forward (QK^T and PV), 5 in the backward (as torch counts SDPA's backward: the scores recomputed,
    dV, dP, dQ, dK), over the plan's tiles of every sequence."""
    def tile_flops(q_shape, block, tile_pairs, matmuls):  # tile_pairs: per sequence, over every head
        batch, _, _, head_dim = q_shape
        return matmuls * 2 * batch * tile_pairs * block * block * head_dim

    @register_flop_formula(torch.ops.attnlab.blocksparse_flash)
    def _forward_flops(q, k, v, lengths, forward, transposed, scale, causal, block, seg, tile_pairs, *a, **kw):
        return tile_flops(q, block, tile_pairs, 2)

    @register_flop_formula(torch.ops.attnlab.blocksparse_flash_backward)
    def _backward_flops(dout, q, k, v, out, lse, lengths, forward, transposed, scale, causal, block, seg,
                        tile_pairs, *a, **kw):
        return tile_flops(q, block, tile_pairs, 5)


_register_flops()


def triton_blocksparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: BlockSparsePlan,
    *,
    lengths: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """q, k, v (B, H, nb*bs, Dh) -> (B, H, nb*bs, Dh) through the Triton kernel; ``lengths`` (B,) the real
    keys of each sequence (default: all). Differentiable in q, k and v."""
    b, h, length, d = q.shape
    check_plan_shape(plan, h, length)
    reason = triton_unavailable(q.device) or shape_unsupported(plan.block_size, d)
    if reason is not None:
        raise RuntimeError(f"the triton block-sparse kernel cannot serve this call: {reason}")
    layout = layout_for(plan)
    if layout.forward.lists.device != q.device:
        raise ValueError(f"the plan is on {layout.forward.lists.device}, the inputs on {q.device}")
    scale = d**-0.5 if scale is None else float(scale)
    if lengths is None:
        lengths = torch.full((b,), length, dtype=torch.int32, device=q.device)
    tile_pairs = layout.tile_pairs * (h if plan.plan_heads == 1 else 1)
    out, _ = blocksparse_flash(
        q.contiguous(), k.contiguous(), v.contiguous(), lengths.to(torch.int32).contiguous(),
        layout.forward.tensors(), layout.transposed.tensors(), scale, plan.causal, plan.block_size, layout.seg,
        tile_pairs,
    )
    return out
