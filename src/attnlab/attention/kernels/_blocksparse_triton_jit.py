"""The Triton programs of ``blocksparse_triton`` (imported only when triton is installed).

Each program owns one work item: a (batch, head, query block, segment of at most SEG key blocks) for the
forward and dQ, a (batch, head, key block, segment of at most SEG query blocks) for dK/dV. Lists longer than
SEG (the dense rows of global query blocks, the columns of global key blocks) are split over several items
whose partial results the caller merges, so no program loops over every block while the rest loop SEG times.

Scores are kept in base 2 (``qk_scale`` = softmax scale * log2(e), log-sum-exp stored as log2) so the
exponentials are ``exp2``. Loops run to the constexpr SEG and skip the tail with an ``if``: a ``range`` over
a runtime count fails in the interpreter with numpy >= 2.4. ``UPCAST`` (set under ``TRITON_INTERPRET=1``)
loads the operands as fp32, because the interpreter's ``tl.dot`` on bf16 operands returns wrong values.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _visible(q_pos, k_pos, seqlen, CAUSAL: tl.constexpr):
    """(BLOCK_q, BLOCK_k) bool: key k_pos is a real key (before the sequence's length) and, when causal, not in
    the query's future."""
    ok = k_pos[None, :] < seqlen
    if CAUSAL:
        ok = ok & (k_pos[None, :] <= q_pos[:, None])
    return ok


@triton.jit
def _program(ITEM_BLOCK, COUNTS, LENGTHS, heads, count_head_stride, stride_b, stride_h):
    """This program's item, batch row, head, output block, list length, sequence length and q/k/v offset."""
    item = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // heads
    h = bh % heads
    block = tl.load(ITEM_BLOCK + item)
    count = tl.load(COUNTS + h * count_head_stride + item)
    seqlen = tl.load(LENGTHS + b)
    base = b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    return item, b, h, block, count, seqlen, base


@triton.jit
def _tile(PTR, base, pos, stride_l, HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr):
    """The (BLOCK, HEAD_DIM) rows ``pos`` of one (batch, head) of a (B, H, L, D) tensor."""
    tile = tl.load(PTR + base + pos[:, None].to(tl.int64) * stride_l + tl.arange(0, HEAD_DIM)[None, :])
    if UPCAST:
        tile = tile.to(tl.float32)
    return tile


@triton.jit
def _item_offsets(b, h, item, out_stride_b, out_stride_h, out_stride_item, BLOCK: tl.constexpr,
                  HEAD_DIM: tl.constexpr):
    """Offsets of this item's (BLOCK, HEAD_DIM) tile in a (B, H, n_items + 1, BLOCK, HEAD_DIM) buffer."""
    out_base = b.to(tl.int64) * out_stride_b + h.to(tl.int64) * out_stride_h + item.to(tl.int64) * out_stride_item
    return out_base + tl.arange(0, BLOCK)[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]


@triton.jit
def blocksparse_fwd(
    Q, K, V, OUT, LSE, LENGTHS, ITEM_BLOCK, LISTS, COUNTS,
    stride_b, stride_h, stride_l, out_stride_b, out_stride_h, out_stride_item,
    heads, list_head_stride, count_head_stride, qk_scale,
    CAUSAL: tl.constexpr, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, SEG: tl.constexpr, UPCAST: tl.constexpr,
):
    """OUT[b, h, item] = the softmax-weighted values of the item's key blocks for its query block (normalised
    within the item), LSE[b, h, item] = log2 of the item's softmax denominator (-inf where it saw no key)."""
    item, b, h, qb, count, seqlen, base = _program(ITEM_BLOCK, COUNTS, LENGTHS, heads, count_head_stride,
                                                   stride_b, stride_h)
    rows = tl.arange(0, BLOCK)
    q_pos = qb * BLOCK + rows
    q = _tile(Q, base, q_pos, stride_l, HEAD_DIM, UPCAST)
    m_i = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK], dtype=tl.float32)
    acc = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    for j in range(SEG):
        if j < count:
            k_pos = tl.load(LISTS + h * list_head_stride + item * SEG + j) * BLOCK + rows
            k = _tile(K, base, k_pos, stride_l, HEAD_DIM, UPCAST)
            v = _tile(V, base, k_pos, stride_l, HEAD_DIM, UPCAST)
            s = tl.dot(q, tl.trans(k)) * qk_scale
            s = tl.where(_visible(q_pos, k_pos, seqlen, CAUSAL), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
            alpha = tl.math.exp2(m_i - m_safe)
            p = tl.math.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
    seen = l_i > 0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    tile = _item_offsets(b, h, item, out_stride_b, out_stride_h, out_stride_item, BLOCK, HEAD_DIM)
    tl.store(OUT + tile, out)
    tl.store(LSE + tl.max(tile, 1) // HEAD_DIM, lse)  # the row's offset in the (..., BLOCK) LSE buffer


@triton.jit
def blocksparse_bwd_dq(
    Q, K, V, DOUT, LSE, DELTA, DQ, LENGTHS, ITEM_BLOCK, LISTS, COUNTS,
    stride_b, stride_h, stride_l, out_stride_b, out_stride_h, out_stride_item,
    heads, padded_len, list_head_stride, count_head_stride, qk_scale, scale,
    CAUSAL: tl.constexpr, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, SEG: tl.constexpr, UPCAST: tl.constexpr,
):
    """DQ[b, h, item] = the item's share of dQ for its query block. LSE (log2, +inf on rows that saw no key)
    and DELTA = rowsum(dO * O) are (B, H, L) fp32 over the whole row."""
    item, b, h, qb, count, seqlen, base = _program(ITEM_BLOCK, COUNTS, LENGTHS, heads, count_head_stride,
                                                   stride_b, stride_h)
    rows = tl.arange(0, BLOCK)
    q_pos = qb * BLOCK + rows
    q = _tile(Q, base, q_pos, stride_l, HEAD_DIM, UPCAST)
    do = _tile(DOUT, base, q_pos, stride_l, HEAD_DIM, UPCAST)
    row_base = (b * heads + h).to(tl.int64) * padded_len
    lse = tl.load(LSE + row_base + q_pos)
    delta = tl.load(DELTA + row_base + q_pos)
    dq = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    for j in range(SEG):
        if j < count:
            k_pos = tl.load(LISTS + h * list_head_stride + item * SEG + j) * BLOCK + rows
            k = _tile(K, base, k_pos, stride_l, HEAD_DIM, UPCAST)
            v = _tile(V, base, k_pos, stride_l, HEAD_DIM, UPCAST)
            s = tl.dot(q, tl.trans(k)) * qk_scale
            p = tl.where(_visible(q_pos, k_pos, seqlen, CAUSAL), tl.math.exp2(s - lse[:, None]), 0.0)
            ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
            dq += tl.dot(ds.to(k.dtype), k)
    tl.store(DQ + _item_offsets(b, h, item, out_stride_b, out_stride_h, out_stride_item, BLOCK, HEAD_DIM),
             dq * scale)


@triton.jit
def blocksparse_bwd_dkdv(
    Q, K, V, DOUT, LSE, DELTA, DK, DV, LENGTHS, ITEM_BLOCK, LISTS, COUNTS,
    stride_b, stride_h, stride_l, out_stride_b, out_stride_h, out_stride_item,
    heads, padded_len, list_head_stride, count_head_stride, qk_scale, scale,
    CAUSAL: tl.constexpr, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, SEG: tl.constexpr, UPCAST: tl.constexpr,
):
    """DK, DV[b, h, item] = the item's share of dK and dV for its key block, over the query blocks that list it
    (the transposed plan): every key block is written by its own programs, so no atomics are needed."""
    item, b, h, kb, count, seqlen, base = _program(ITEM_BLOCK, COUNTS, LENGTHS, heads, count_head_stride,
                                                   stride_b, stride_h)
    rows = tl.arange(0, BLOCK)
    k_pos = kb * BLOCK + rows
    k = _tile(K, base, k_pos, stride_l, HEAD_DIM, UPCAST)
    v = _tile(V, base, k_pos, stride_l, HEAD_DIM, UPCAST)
    row_base = (b * heads + h).to(tl.int64) * padded_len
    dk = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    for j in range(SEG):
        if j < count:
            q_pos = tl.load(LISTS + h * list_head_stride + item * SEG + j) * BLOCK + rows
            q = _tile(Q, base, q_pos, stride_l, HEAD_DIM, UPCAST)
            do = _tile(DOUT, base, q_pos, stride_l, HEAD_DIM, UPCAST)
            lse = tl.load(LSE + row_base + q_pos)
            delta = tl.load(DELTA + row_base + q_pos)
            s = tl.dot(q, tl.trans(k)) * qk_scale  # (query rows, key rows)
            p = tl.where(_visible(q_pos, k_pos, seqlen, CAUSAL), tl.math.exp2(s - lse[:, None]), 0.0)
            dv += tl.dot(tl.trans(p).to(do.dtype), do)
            ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
            dk += tl.dot(tl.trans(ds).to(q.dtype), q)
    tile = _item_offsets(b, h, item, out_stride_b, out_stride_h, out_stride_item, BLOCK, HEAD_DIM)
    tl.store(DK + tile, dk * scale)
    tl.store(DV + tile, dv)
