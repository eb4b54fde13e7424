"""Blocked block-sparse attention with a hand-written backward: the fast CPU training path.

Same contract and same numerics conventions as ``blocksparse_reference.blocksparse_attention`` (the plan
layout is documented there), and held equal to it in value and gradient by ``tests/attention``:

- masked scores are filled with ``finfo.min`` (not -inf), so a query row whose keys are all masked gets
  a uniform average over its gathered keys, and no gradient reaches its scores (``masked_fill``);
- no attention dropout;
- ETC keys (``extra_k``/``extra_v``, shared by every query) are scored with every row.

Why it is faster than the reference under autograd:

1. Query rows are processed in chunks sized to stay in cache (``chunk_bytes``), so the gathered key and
   value blocks, the scores and the probabilities of one chunk never exist for the whole sequence.
2. The forward saves only q, k, v and the output (O(L * Dh)); the backward recomputes the scores chunk
   by chunk (FlashAttention-style), using ``delta = rowsum(dO * O)`` instead of the stored
   probabilities. Autograd through the reference instead keeps every gathered K/V block, the scores and
   the probabilities of all rows alive until the backward: about ``(3 + 2*Dh/(K*bs)) x`` more memory.
3. Gradients of the gathered blocks are scattered back with ``index_add_`` per chunk, in place.
"""

from __future__ import annotations

import torch

from attnlab.attention.kernels.blocksparse_reference import BlockSparsePlan

DEFAULT_CHUNK_BYTES = 4 << 20  # scores of one chunk of query rows (fp32: 1M scores); fits L2+L3 well

_LAYOUTS: dict[int, tuple[BlockSparsePlan, dict]] = {}


def _layout(plan: BlockSparsePlan) -> dict:
    """Static tensors derived from a plan (cached by identity: plans are cached by their module)."""
    hit = _LAYOUTS.get(id(plan))
    if hit is not None and hit[0] is plan:
        return hit[1]
    bs = plan.block_size
    dev = plan.key_blocks.device
    rows, idx, valid = plan.row_blocks, plan.key_blocks, plan.key_valid
    r, kk = idx.shape
    offs = torch.arange(bs, device=dev)
    masked = ~valid[:, None, :, None].expand(r, 1, kk, bs).reshape(r, 1, kk * bs)  # (R, 1, K*bs)
    if plan.causal:
        q_pos = (rows[:, None] * bs + offs)[:, :, None]
        k_pos = (idx[:, :, None] * bs + offs).reshape(r, 1, kk * bs)
        masked = masked | (k_pos > q_pos)  # (R, bs, K*bs)
    lay = {
        "masked": masked if bool(masked.any()) else None,
        # contiguous row ranges are sliced (a view) instead of gathered
        "rows_range": _as_range(rows),
        "dense_range": _as_range(plan.dense_rows),
    }
    if len(_LAYOUTS) > 64:
        _LAYOUTS.clear()
    _LAYOUTS[id(plan)] = (plan, lay)
    return lay


def _as_range(index: torch.Tensor) -> tuple[int, int] | None:
    n = index.numel()
    if n == 0:
        return None
    start = int(index[0])
    if torch.equal(index.cpu(), torch.arange(start, start + n)):
        return start, start + n
    return None


def _take_rows(tb: torch.Tensor, index: torch.Tensor, rng: tuple[int, int] | None, lo: int, hi: int):
    """Blocks ``index[lo:hi]`` of tb (B, H, nb, bs, Dh): a view when the index is a contiguous range."""
    if rng is not None:
        return tb[:, :, rng[0] + lo : rng[0] + hi]
    return tb[:, :, index[lo:hi]]


def _chunk_rows(b: int, h: int, bs: int, keys: int, itemsize: int, chunk_bytes: int) -> int:
    return max(1, chunk_bytes // max(1, b * h * bs * keys * itemsize))


def _with_extra(kg: torch.Tensor, extra: torch.Tensor | None) -> torch.Tensor:
    """kg (B, H, c, Kn, Dh); extra (H, E, Dh) prepended to every row's keys."""
    if extra is None:
        return kg
    b, h, c, _, d = kg.shape
    e = extra.to(kg.dtype)[None, :, None].expand(b, h, c, extra.shape[1], d)
    return torch.cat([e, kg], dim=3)


def _mask_for(masked_static, pad_g, lo, hi, e: int):
    """Bool mask (B|1, 1, c, bs|1, E+Kn) of masked scores for rows lo:hi, or None."""
    m = None
    if masked_static is not None:
        m = masked_static[lo:hi][None, None]
    if pad_g is not None:
        p = pad_g[:, lo:hi][:, None, :, None, :]
        m = p if m is None else (m | p)
    if m is not None and e:
        m = torch.nn.functional.pad(m, (e, 0), value=False)
    return m


def _dense_mask(plan, dense_idx, pad, length, e, bs, dev):
    m = None
    if plan.causal:
        q_pos = (dense_idx[:, None] * bs + torch.arange(bs, device=dev)).reshape(-1, 1)
        m = (torch.arange(length, device=dev) > q_pos)[None, None, None]  # (1,1,1,G*bs,L)
    if pad is not None:
        p = pad[:, None, None, None, :]
        m = p if m is None else (m | p)
    if m is not None and e:
        m = torch.nn.functional.pad(m, (e, 0), value=False)
    return m


class _BlockSparseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, extra_k, extra_v, plan, pad, scale, chunk_bytes):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = _forward(q, k, v, extra_k, extra_v, plan, pad, scale, chunk_bytes)
        ctx.save_for_backward(q, k, v, extra_k, extra_v, out)
        ctx.plan, ctx.pad, ctx.scale, ctx.chunk_bytes = plan, pad, scale, chunk_bytes
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, extra_k, extra_v, out = ctx.saved_tensors
        grads = _backward(
            q, k, v, extra_k, extra_v, out, dout.contiguous(), ctx.plan, ctx.pad, ctx.scale,
            ctx.chunk_bytes, ctx.needs_input_grad,
        )
        return (*grads, None, None, None, None)


def _softmax_attend(qc, kc, vc, mask):
    s = torch.matmul(qc, kc.transpose(-1, -2))
    if mask is not None:
        s.masked_fill_(mask, torch.finfo(s.dtype).min)
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, vc)


def _forward(q, k, v, extra_k, extra_v, plan, pad, scale, chunk_bytes):
    b, h, length, d = q.shape
    bs, nb = plan.block_size, plan.num_blocks
    lay = _layout(plan)
    e = 0 if extra_k is None else extra_k.shape[1]
    qs = q * scale
    out = torch.empty_like(q)
    qb, kb, vb, ob = (t.view(b, h, nb, bs, d) for t in (qs, k, v, out))
    rows = plan.row_blocks
    if rows.numel():
        idx = plan.key_blocks
        r, kk = idx.shape
        pad_g = None if pad is None else pad.view(b, nb, bs)[:, idx].reshape(b, r, kk * bs)
        c = _chunk_rows(b, h, bs, kk * bs + e, q.element_size(), chunk_bytes)
        for lo in range(0, r, c):
            hi = min(r, lo + c)
            ic = idx[lo:hi]
            qc = _take_rows(qb, rows, lay["rows_range"], lo, hi)
            kc = _with_extra(kb[:, :, ic].view(b, h, hi - lo, kk * bs, d), extra_k)
            vc = _with_extra(vb[:, :, ic].view(b, h, hi - lo, kk * bs, d), extra_v)
            o = _softmax_attend(qc, kc, vc, _mask_for(lay["masked"], pad_g, lo, hi, e))
            if lay["rows_range"] is not None:
                a = lay["rows_range"][0]
                ob[:, :, a + lo : a + hi] = o
            else:
                ob[:, :, rows[lo:hi]] = o
    dense = plan.dense_rows
    if dense.numel():
        g = dense.numel()
        qd = qb[:, :, dense].reshape(b, h, 1, g * bs, d)
        mask = _dense_mask(plan, dense, pad, length, e, bs, q.device)
        o = _softmax_attend(qd, _with_extra(k[:, :, None], extra_k), _with_extra(v[:, :, None], extra_v), mask)
        ob[:, :, dense] = o.view(b, h, g, bs, d)
    return out


def _chunk_backward(qc, kc, vc, doc, deltac, mask, dead):
    """One chunk: returns (dq * 1/scale-free, dk, dv) of the chunk's rows and gathered keys.

    qc is pre-scaled, so dk = dS^T qc is already scaled and dq must be multiplied by ``scale``."""
    s = torch.matmul(qc, kc.transpose(-1, -2))
    if mask is not None:
        s.masked_fill_(mask, torch.finfo(s.dtype).min)
    p = torch.softmax(s, dim=-1)
    del s
    dv = torch.matmul(p.transpose(-1, -2), doc)
    ds = torch.matmul(doc, vc.transpose(-1, -2))
    ds.sub_(deltac).mul_(p)
    del p
    if mask is not None:
        ds.masked_fill_(mask, 0.0)  # masked_fill blocks the gradient (only dead rows have p != 0 there)
    if dead is not None:
        ds.masked_fill_(dead, 0.0)
    dq = torch.matmul(ds, kc)
    dk = torch.matmul(ds.transpose(-1, -2), qc)
    return dq, dk, dv


def _backward(q, k, v, extra_k, extra_v, out, dout, plan, pad, scale, chunk_bytes, needs):
    b, h, length, d = q.shape
    bs, nb = plan.block_size, plan.num_blocks
    lay = _layout(plan)
    e = 0 if extra_k is None else extra_k.shape[1]
    qs = q * scale
    delta = (dout * out).sum(-1, keepdim=True)  # (B, H, L, 1)
    dq = torch.zeros_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    dek = None if extra_k is None else torch.zeros(b, *extra_k.shape, dtype=q.dtype, device=q.device)
    dev_ = None if extra_v is None else torch.zeros(b, *extra_v.shape, dtype=q.dtype, device=q.device)
    qb, kb, vb, dob = (t.view(b, h, nb, bs, d) for t in (qs, k, v, dout))
    deltab = delta.view(b, h, nb, bs, 1)
    dqb, dkb, dvb = (t.view(b, h, nb, bs, d) for t in (dq, dk, dv))
    rows = plan.row_blocks
    rng = lay["rows_range"]
    if rows.numel():
        idx = plan.key_blocks
        r, kk = idx.shape
        pad_g = None if pad is None else pad.view(b, nb, bs)[:, idx].reshape(b, r, kk * bs)
        c = _chunk_rows(b, h, bs, kk * bs + e, q.element_size(), chunk_bytes)
        for lo in range(0, r, c):
            hi = min(r, lo + c)
            n = hi - lo
            ic = idx[lo:hi]
            qc = _take_rows(qb, rows, rng, lo, hi)
            kc = _with_extra(kb[:, :, ic].view(b, h, n, kk * bs, d), extra_k)
            vc = _with_extra(vb[:, :, ic].view(b, h, n, kk * bs, d), extra_v)
            mask = _mask_for(lay["masked"], pad_g, lo, hi, e)
            dead = None
            if pad is not None:
                dead = mask.all(dim=-1, keepdim=True)
                dead = dead if bool(dead.any()) else None
            gq, gk, gv = _chunk_backward(
                qc, kc, vc, _take_rows(dob, rows, rng, lo, hi), _take_rows(deltab, rows, rng, lo, hi),
                mask, dead,
            )
            if rng is not None:
                dqb[:, :, rng[0] + lo : rng[0] + hi] = gq
            else:
                dqb[:, :, rows[lo:hi]] = gq
            if e:
                dek += gk[:, :, :, :e].sum(2)
                dev_ += gv[:, :, :, :e].sum(2)
                gk, gv = gk[:, :, :, e:], gv[:, :, :, e:]
            flat = ic.reshape(-1)
            dkb.index_add_(2, flat, gk.reshape(b, h, n * kk, bs, d))
            dvb.index_add_(2, flat, gv.reshape(b, h, n * kk, bs, d))
    dense = plan.dense_rows
    if dense.numel():
        g = dense.numel()
        qd = qb[:, :, dense].reshape(b, h, 1, g * bs, d)
        mask = _dense_mask(plan, dense, pad, length, e, bs, q.device)
        dead = None
        if mask is not None:
            dead = mask.all(dim=-1, keepdim=True)
            dead = dead if bool(dead.any()) else None
        gq, gk, gv = _chunk_backward(
            qd, _with_extra(k[:, :, None], extra_k), _with_extra(v[:, :, None], extra_v),
            dob[:, :, dense].reshape(b, h, 1, g * bs, d), deltab[:, :, dense].reshape(b, h, 1, g * bs, 1),
            mask, dead,
        )
        dqb[:, :, dense] = gq.view(b, h, g, bs, d)
        if e:
            dek += gk[:, :, :, :e].sum(2)
            dev_ += gv[:, :, :, :e].sum(2)
            gk, gv = gk[:, :, :, e:], gv[:, :, :, e:]
        dk += gk[:, :, 0]
        dv += gv[:, :, 0]
    dq.mul_(scale)
    return (
        dq if needs[0] else None,
        dk if needs[1] else None,
        dv if needs[2] else None,
        None if dek is None or not needs[3] else dek.sum(0),
        None if dev_ is None or not needs[4] else dev_.sum(0),
    )


def blocked_blocksparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: BlockSparsePlan,
    *,
    key_padding_mask: torch.Tensor | None = None,
    extra_k: torch.Tensor | None = None,
    extra_v: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> torch.Tensor:
    """Drop-in for ``blocksparse_attention`` (same arguments and result), with a chunked forward and a
    recomputing hand-written backward. q, k, v (B, H, nb*bs, Dh); key_padding_mask (B, nb*bs) True at
    padding; extra_k, extra_v (H, E, Dh). Returns (B, H, nb*bs, Dh)."""
    b, h, length, d = q.shape
    if length != plan.num_blocks * plan.block_size:
        raise ValueError(
            f"sequence of {length} positions does not match a plan of {plan.num_blocks} blocks of "
            f"{plan.block_size}"
        )
    scale = d**-0.5 if scale is None else float(scale)
    pad = None if key_padding_mask is None else key_padding_mask.to(torch.bool)
    return _BlockSparseAttention.apply(q, k, v, extra_k, extra_v, plan, pad, scale, int(chunk_bytes))
