"""Blocked block-sparse attention with a hand-written backward: the fast CPU training path.

Same contract and numerics conventions as ``blocksparse_reference.blocksparse_attention`` (the plan layout
is documented there), held equal to it in value and gradient by ``tests/attention/test_bigbird_fast.py``:

- masked scores are filled with ``finfo.min`` (not -inf), so a query row whose keys are all masked (only
  possible through padding) gets a uniform average over its gathered keys, and no gradient reaches its
  scores (the reference's ``masked_fill`` blocks it);
- no attention dropout;
- ETC keys (``extra_k``/``extra_v``, shared by every query) are scored with every row.

Why it is faster than the reference under autograd (numbers in docs/performance.md):

1. Query rows are processed in chunks sized to stay in cache (``chunk_bytes``): the gathered key and value
   blocks of a chunk are built with ``index_select`` and dropped after the chunk; they are never
   materialised for the whole sequence, in the forward or in the backward.
2. The key slots of every row are reordered once per plan (own block first when causal, filler last), so
   the static mask is one (bs, bs) triangle on the first slot plus a tail fill on the few short rows,
   instead of a broadcast ``masked_fill`` over every score.
3. The backward is written by hand (``torch.autograd.Function``): from the saved probabilities
   (``save_probs=True``, the default: O(L * K * bs) memory, like the scores of the forward) or by
   recomputing them chunk by chunk (``save_probs=False``: only q, k, v and the output are saved,
   FlashAttention-style), with ``delta = rowsum(dO * O)``. Gradients of the gathered blocks are
   accumulated in place with ``index_add_``. Autograd through the reference instead keeps every gathered
   K/V block, the scores, the probabilities and the masks of all rows alive until the backward.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from attnlab.attention.kernels.blocksparse_reference import BlockSparsePlan, check_plan_shape

DEFAULT_CHUNK_BYTES = 2 << 20  # fp32 scores of one chunk of query rows (512K scores)
# On a GPU a chunk is one kernel launch per op, not a cache-sized piece: few, large chunks (the whole call for
# most shapes), from one thread, since Python threads launching on one stream only add contention.
CUDA_CHUNK_BYTES = 512 << 20

_POOL: ThreadPoolExecutor | None = None
_POOL_KEY: tuple[int, int] | None = None


def _pool(workers: int) -> ThreadPoolExecutor:
    """Worker threads that each run single-threaded torch ops (set in the initializer, thread-local)."""
    global _POOL, _POOL_KEY
    key = (os.getpid(), workers)
    if key != _POOL_KEY:
        _POOL = ThreadPoolExecutor(workers, thread_name_prefix="attnlab-blocksparse",
                                   initializer=torch.set_num_threads, initargs=(1,))
        _POOL_KEY = key
    return _POOL


def _run_parts(work, chunks: list, workers: int) -> None:
    """Run ``work(part_chunks, part_index)`` over the chunks, split round-robin among ``workers`` threads.

    Each chunk is a handful of small ops; with torch's intra-op threads every op ends in a barrier, and on a
    shared machine a preempted thread stalls all of them at every op. Independent single-threaded workers
    over disjoint chunks synchronise once per call instead. Grad mode and inference mode are thread-local
    in torch, so the caller's are re-entered in the workers."""
    if workers <= 1 or len(chunks) < 2:
        work(chunks, 0)
        return
    inference = torch.is_inference_mode_enabled()

    def run(part: int):
        ctx = torch.inference_mode() if inference else torch.no_grad()
        with ctx:
            work(chunks[part::workers], part)

    for f in [_pool(workers).submit(run, i) for i in range(workers)]:
        f.result()


@contextlib.contextmanager
def _single_threaded(active: bool):
    """The calling thread's own ops (setup, accumulation) single-threaded while the workers run: an
    intra-op barrier per small op costs more than it saves on a busy machine. The OpenMP/MKL setting is
    thread-local; the restore at exit also resets torch's process-wide default (which the workers'
    initializer set to 1) so threads created later start with the caller's count."""
    if not active:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def launch_settings(device: torch.device, chunk_bytes: int | None, workers: int | None) -> tuple[int, int]:
    """(chunk bytes, worker threads) for a call on ``device``; None takes the device's default: cache-sized
    chunks over ``torch.get_num_threads()`` threads on CPU, ``CUDA_CHUNK_BYTES`` from the calling thread on
    CUDA (one Python thread per core and ~20k launches a step made BigBird 11x slower than dense there)."""
    cuda = device.type == "cuda"
    if chunk_bytes is None:
        chunk_bytes = CUDA_CHUNK_BYTES if cuda else DEFAULT_CHUNK_BYTES
    if workers is None:
        workers = 1 if cuda else torch.get_num_threads()
    return int(chunk_bytes), max(1, int(workers))


_LAYOUTS: dict[tuple[int, int], tuple[BlockSparsePlan, dict]] = {}


def _as_range(index: torch.Tensor) -> tuple[int, int] | None:
    n = index.numel()
    if n == 0:
        return None
    start = int(index[0])
    if torch.equal(index.cpu(), torch.arange(start, start + n)):
        return start, start + n
    return None


def _layout(plan: BlockSparsePlan, heads: int) -> dict:
    """Static tables derived from a plan for ``heads`` heads, cached by identity (modules cache plans).

    ``flat`` (H, R, K): the key blocks of every head as indices into the (H * nb) blocks of a head-major
    (B, H * nb, bs, Dh) view, so one ``index_select`` gathers every head's own blocks."""
    hit = _LAYOUTS.get((id(plan), heads))
    if hit is not None and hit[0] is plan:
        return hit[1]
    bs, nb = plan.block_size, plan.num_blocks
    rows = plan.row_blocks.cpu()
    idx = plan.key_blocks.cpu().expand(heads, -1, -1)
    valid = plan.key_valid.cpu().expand(heads, -1, -1)
    _, r, kk = idx.shape
    dev = plan.key_blocks.device
    lay: dict = {"rows_range": _as_range(rows), "K": kk}
    own = idx == rows[None, :, None]
    simple = True
    if plan.causal and r:
        # BigBird causal rows: every valid block is at or before the row's own block, which is listed.
        simple = bool(((own & valid).any(2)).all()) and bool(((idx <= rows[None, :, None]) | ~valid).all())
    if simple:
        # slot order: own block first (causal), other valid blocks, filler last; stable otherwise
        prio = torch.where(valid, 1, 2) - (own & valid).to(torch.long) * int(plan.causal)
        order = torch.sort(prio, dim=2, stable=True).indices
        idx = torch.gather(idx, 2, order)
        counts = valid.sum(2)  # (H, R)
        short = (counts < kk).any(0)
        lay["short_before"] = [0, *torch.cumsum(short.to(torch.long), 0).tolist()]
        lay["counts"] = counts.to(dev)
        lay["empty_rows"] = bool((counts == 0).any())  # a row with no key at all (random-only plans)
        lay["slot"] = (torch.arange(kk * bs) // bs).to(dev)
        lay["masked"] = None
        lay["diag"] = torch.ones(bs, bs, dtype=torch.bool).triu(1).to(dev) if plan.causal else None
    else:
        offs = torch.arange(bs)
        masked = ~valid[:, :, None, :, None].expand(heads, r, 1, kk, bs).reshape(heads, r, 1, kk * bs)
        if plan.causal:
            q_pos = (rows[:, None] * bs + offs)[:, :, None]
            k_pos = (idx[:, :, :, None] * bs + offs).reshape(heads, r, 1, kk * bs)
            masked = masked | (k_pos > q_pos)
        lay.update(short_before=None, masked=masked.to(dev), diag=None, empty_rows=False)
    lay["idx"] = idx.contiguous().to(dev)
    lay["flat"] = (idx + torch.arange(heads)[:, None, None] * nb).contiguous().to(dev)
    if len(_LAYOUTS) > 64:
        _LAYOUTS.clear()
    _LAYOUTS[(id(plan), heads)] = (plan, lay)
    return lay


def _rows(tb: torch.Tensor, index: torch.Tensor, rng, lo: int, hi: int) -> torch.Tensor:
    """Blocks ``index[lo:hi]`` of tb (B, H, nb, ...): a view when the index is a contiguous range."""
    if rng is not None:
        return tb[:, :, rng[0] + lo : rng[0] + hi]
    return tb.index_select(2, index[lo:hi])


def _put_rows(tb: torch.Tensor, index: torch.Tensor, rng, lo: int, hi: int, value: torch.Tensor) -> None:
    if rng is not None:
        tb[:, :, rng[0] + lo : rng[0] + hi] = value
    else:
        tb[:, :, index[lo:hi]] = value


def _gather(tb: torch.Tensor, flat: torch.Tensor, lo: int, hi: int, extra: torch.Tensor | None) -> torch.Tensor:
    """Key blocks of rows lo:hi, each head its own: tb (B, H, nb, bs, Dh), flat (H, R, K) head-major block
    indices -> (B, H, c, [E +] K*bs, Dh)."""
    b, h, nb, bs, d = tb.shape
    _, _, kk = flat.shape
    c = hi - lo
    g = tb.view(b, h * nb, bs, d).index_select(1, flat[:, lo:hi].reshape(-1)).view(b, h, c, kk * bs, d)
    if extra is None:
        return g
    e = extra.to(g.dtype)[None, :, None].expand(b, h, c, extra.shape[1], d)
    return torch.cat([e, g], dim=3)


def _chunk_probs(qc, kc, lay, lo, hi, pad_g, e, bs):
    """Softmax probabilities of rows lo:hi (B, H, c, bs, E + K*bs) and their dead-row flags (or None).
    qc is already scaled."""
    s = torch.matmul(qc, kc.transpose(-1, -2))
    neg = torch.finfo(s.dtype).min
    if lay["diag"] is not None:
        s[..., e : e + bs].masked_fill_(lay["diag"], neg)
    short = lay["short_before"]
    if short is not None and short[hi] > short[lo]:
        # rows with fewer valid blocks than K in some head: mask their filler slots (filler is last)
        tail = lay["slot"] >= lay["counts"][:, lo:hi, None, None]  # (H, c, 1, K*bs)
        s[..., e:].masked_fill_(tail, neg)
    if lay["masked"] is not None:
        s[..., e:].masked_fill_(lay["masked"][:, lo:hi], neg)
    dead = None
    if pad_g is not None:
        s[..., e:].masked_fill_(pad_g[:, :, lo:hi, None, :], neg)
    if not e and (pad_g is not None or lay["masked"] is not None or lay["empty_rows"]):
        dead = s.amax(-1, keepdim=True) == neg
        dead = dead if bool(dead.any()) else None
    return torch.softmax(s, dim=-1), dead


def _dense_probs(qd, kd, plan, q_pos, pad, e):
    """Dense rows: queries qd (B, H, 1, Q, Dh) at positions q_pos (Q,) over all keys kd (B, H, 1, E + L, Dh)."""
    s = torch.matmul(qd, kd.transpose(-1, -2))
    neg = torch.finfo(s.dtype).min
    length = kd.shape[3] - e
    if plan.causal:
        s[..., e:].masked_fill_(torch.arange(length, device=qd.device) > q_pos[:, None], neg)
    dead = None
    if pad is not None:
        s[..., e:].masked_fill_(pad[:, None, None, None, :], neg)
    if not e and (pad is not None or plan.causal):
        dead = s.amax(-1, keepdim=True) == neg
        dead = dead if bool(dead.any()) else None
    return torch.softmax(s, dim=-1), dead


MIN_DENSE_PIECE_ROWS = 16


def _dense_tasks(plan: BlockSparsePlan, b: int, h: int, keys: int, itemsize: int, chunk_bytes: int) -> list:
    """("d", block, first query, last query): the dense rows (global query blocks) cut into pieces of
    query rows whose scores over all keys fit ``chunk_bytes``, so no L x block temporary is built; at
    least ``MIN_DENSE_PIECE_ROWS`` rows, since every piece adds a rank-(rows) update to the whole dK and
    dV (fewer rows at long lengths made that traffic grow faster than L)."""
    bs = plan.block_size
    rows = max(min(bs, MIN_DENSE_PIECE_ROWS), min(bs, chunk_bytes // max(1, b * h * keys * itemsize)))
    return [("d", int(blk), lo, min(bs, lo + rows)) for blk in plan.dense_rows.tolist() for lo in range(0, bs, rows)]


class _BlockSparseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, extra_k, extra_v, plan, pad, scale, chunk_bytes, save_probs, workers):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        with _single_threaded(workers > 1):
            out, probs = _forward(q, k, v, extra_k, extra_v, plan, pad, scale, chunk_bytes, save_probs, workers)
        ctx.save_for_backward(q, k, v, extra_k, extra_v, out)
        ctx.probs = probs
        ctx.plan, ctx.pad, ctx.scale, ctx.chunk_bytes, ctx.workers = plan, pad, scale, chunk_bytes, workers
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, extra_k, extra_v, out = ctx.saved_tensors
        probs, ctx.probs = ctx.probs, None
        with _single_threaded(ctx.workers > 1):
            grads = _backward(
                q, k, v, extra_k, extra_v, out, dout.contiguous(), ctx.plan, ctx.pad, ctx.scale,
                ctx.chunk_bytes, ctx.needs_input_grad, probs, ctx.workers,
            )
        return (*grads, None, None, None, None, None, None)


def _chunks(plan: BlockSparsePlan, lay: dict, b: int, h: int, e: int, itemsize: int, chunk_bytes: int):
    r = plan.row_blocks.numel()
    keys = lay["K"] * plan.block_size + e
    c = max(1, chunk_bytes // max(1, b * h * plan.block_size * keys * itemsize))
    return [(j, lo, min(r, lo + c)) for j, lo in enumerate(range(0, r, c))]


def _pad_gathered(pad, lay, b, nb, bs):
    """Key padding of every head's gathered keys: (B, H, R, K*bs) bool, or None."""
    if pad is None:
        return None
    idx = lay["idx"]
    h, r, kk = idx.shape
    return pad.view(b, nb, bs)[:, idx].reshape(b, h, r, kk * bs)


def _forward(q, k, v, extra_k, extra_v, plan, pad, scale, chunk_bytes, keep_probs, workers):
    b, h, length, d = q.shape
    bs, nb = plan.block_size, plan.num_blocks
    lay = _layout(plan, h)
    e = 0 if extra_k is None else extra_k.shape[1]
    out = torch.empty_like(q)
    qb, kb, vb, ob = (t.view(b, h, nb, bs, d) for t in (q, k, v, out))
    rows, rng, flat = plan.row_blocks, lay["rows_range"], lay["flat"]
    dense = plan.dense_rows
    chunks = _chunks(plan, lay, b, h, e, q.element_size(), chunk_bytes) if rows.numel() else []
    dtasks = _dense_tasks(plan, b, h, e + length, q.element_size(), chunk_bytes)
    tasks = [(*t, i) for i, t in enumerate(dtasks)] + [("s", *c) for c in chunks]
    probs: dict | None = None
    if keep_probs:
        probs = {"rows": [None] * len(chunks), "dead": [None] * len(chunks),
                 "dense": [None] * len(dtasks), "dense_dead": [None] * len(dtasks)}
    pad_g = _pad_gathered(pad, lay, b, nb, bs) if chunks else None
    kd = _extra_all(k, extra_k) if dense.numel() else None
    vd = _extra_all(v, extra_v) if dense.numel() else None

    def work(part, _):
        for task in part:
            if task[0] == "d":
                _, blk, lo, hi, i = task
                q_pos = torch.arange(blk * bs + lo, blk * bs + hi, device=q.device)
                p, dead = _dense_probs(qb[:, :, blk : blk + 1, lo:hi] * scale, kd, plan, q_pos, pad, e)
                ob[:, :, blk, lo:hi] = torch.matmul(p, vd)[:, :, 0]
                if probs is not None:
                    probs["dense"][i], probs["dense_dead"][i] = p, dead
                continue
            _, j, lo, hi = task
            qc = _rows(qb, rows, rng, lo, hi) * scale
            p, dead = _chunk_probs(qc, _gather(kb, flat, lo, hi, extra_k), lay, lo, hi, pad_g, e, bs)
            _put_rows(ob, rows, rng, lo, hi, torch.matmul(p, _gather(vb, flat, lo, hi, extra_v)))
            if probs is not None:
                probs["rows"][j], probs["dead"][j] = p, dead

    _run_parts(work, tasks, workers)
    return out, probs


def _extra_all(t: torch.Tensor, extra: torch.Tensor | None) -> torch.Tensor:
    """t (B, H, L, Dh) -> (B, H, 1, [E +] L, Dh)."""
    if extra is None:
        return t[:, :, None]
    b, h, _, d = t.shape
    return torch.cat([extra.to(t.dtype)[None].expand(b, h, -1, d), t], dim=2)[:, :, None]


def _chunk_grads(p, dead, qc, kc, vc, doc, deltac):
    """From probabilities p: (dQ / scale, dK, dV) of one chunk; qc is pre-scaled so dK is complete."""
    dv = torch.matmul(p.transpose(-1, -2), doc)
    ds = torch.matmul(doc, vc.transpose(-1, -2))
    ds.sub_(deltac).mul_(p)  # masked entries have p == 0 exactly, so their gradient is 0 ...
    if dead is not None:
        ds.masked_fill_(dead, 0.0)  # ... except in dead rows (uniform p), where masked_fill blocks it
    return torch.matmul(ds, kc), torch.matmul(ds.transpose(-1, -2), qc), dv


def _backward(q, k, v, extra_k, extra_v, out, dout, plan, pad, scale, chunk_bytes, needs, probs, workers):
    b, h, length, d = q.shape
    bs, nb = plan.block_size, plan.num_blocks
    lay = _layout(plan, h)
    e = 0 if extra_k is None else extra_k.shape[1]
    # rowsum(dO * O), (B, H, L, 1), without an L x Dh temporary
    delta = torch.matmul(dout.unsqueeze(-2), out.unsqueeze(-1))[..., 0]
    dq = torch.empty_like(q)  # every query row is written once: by its sparse chunk or its dense piece
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    dek = None if extra_k is None else q.new_zeros(b, *extra_k.shape)
    dev_ = None if extra_v is None else q.new_zeros(b, *extra_v.shape)
    qb, kb, vb, dob, dqb = (t.view(b, h, nb, bs, d) for t in (q, k, v, dout, dq))
    dk_heads, dv_heads = dk.view(b, h * nb, bs, d), dv.view(b, h * nb, bs, d)
    deltab = delta.view(b, h, nb, bs, 1)
    rows, rng, flat = plan.row_blocks, lay["rows_range"], lay["flat"]

    dense = plan.dense_rows
    chunks = _chunks(plan, lay, b, h, e, q.element_size(), chunk_bytes) if rows.numel() else []
    dtasks = _dense_tasks(plan, b, h, e + length, q.element_size(), chunk_bytes)
    tasks = [(*t, i) for i, t in enumerate(dtasks)] + [("s", *c) for c in chunks]
    nparts = max(1, min(workers, len(tasks)))
    # dK/dV: one buffer shared by the workers (per-worker copies would double the gradient memory). The
    # accumulations run in task order, one at a time (a turnstile), so the sums are bitwise the same for
    # any number of workers; a worker holds at most one chunk's gradients while it waits its turn.
    turn = threading.Condition()
    next_task, failed = [0], [False]

    @contextlib.contextmanager
    def in_order(t: int):
        with turn:
            turn.wait_for(lambda: next_task[0] == t or failed[0])
            if failed[0]:
                raise RuntimeError("another block-sparse backward worker failed")
        try:
            yield
        finally:
            with turn:
                next_task[0] = t + 1
                turn.notify_all()

    def fail() -> None:
        with turn:
            failed[0] = True
            turn.notify_all()

    def split_extra(gk, gv):
        if e:
            dek.add_(gk[:, :, :, :e].sum(2))
            dev_.add_(gv[:, :, :, :e].sum(2))
            gk, gv = gk[:, :, :, e:], gv[:, :, :, e:]
        return gk, gv

    pad_g = _pad_gathered(pad, lay, b, nb, bs) if chunks else None
    kd = _extra_all(k, extra_k) if dense.numel() else None
    vd = _extra_all(v, extra_v) if dense.numel() else None

    def work(part, _):
        try:
            for t, task in part:
                one(t, task)
        except BaseException:
            fail()  # release the workers waiting for this one's turn
            raise

    def one(t, task):
        if task[0] == "d":
            _, blk, lo, hi, i = task
            qd = qb[:, :, blk : blk + 1, lo:hi] * scale  # (B, H, 1, Q, Dh)
            if probs is not None:
                p, dead = probs["dense"][i], probs["dense_dead"][i]
                probs["dense"][i] = None
            else:
                q_pos = torch.arange(blk * bs + lo, blk * bs + hi, device=q.device)
                p, dead = _dense_probs(qd, kd, plan, q_pos, pad, e)
            doc = dob[:, :, blk : blk + 1, lo:hi]
            ds = torch.matmul(doc, vd.transpose(-1, -2))
            ds.sub_(deltab[:, :, blk : blk + 1, lo:hi]).mul_(p)
            if dead is not None:
                ds.masked_fill_(dead, 0.0)
            dqb[:, :, blk, lo:hi] = torch.matmul(ds, kd)[:, :, 0]
            n = hi - lo
            # dK += dS^T Q and dV += P^T dO accumulate in place: no (L x Dh) temporary per piece.
            with in_order(t):
                pt, dst = p[:, :, 0, :, e:].transpose(-1, -2), ds[:, :, 0, :, e:].transpose(-1, -2)
                dv.view(b * h, length, d).baddbmm_(pt.reshape(b * h, length, n), doc.reshape(b * h, n, d))
                dk.view(b * h, length, d).baddbmm_(dst.reshape(b * h, length, n), qd.reshape(b * h, n, d))
                if e:
                    dev_.add_(torch.matmul(p[:, :, 0, :, :e].transpose(-1, -2), doc[:, :, 0]))
                    dek.add_(torch.matmul(ds[:, :, 0, :, :e].transpose(-1, -2), qd[:, :, 0]))
            return
        _, j, lo, hi = task
        qc, kc = _rows(qb, rows, rng, lo, hi) * scale, _gather(kb, flat, lo, hi, extra_k)
        if probs is not None:
            p, dead = probs["rows"][j], probs["dead"][j]
            probs["rows"][j] = None  # free as we go
        else:
            p, dead = _chunk_probs(qc, kc, lay, lo, hi, pad_g, e, bs)
        gq, gk, gv = _chunk_grads(
            p, dead, qc, kc, _gather(vb, flat, lo, hi, extra_v), _rows(dob, rows, rng, lo, hi),
            _rows(deltab, rows, rng, lo, hi),
        )
        del p, kc
        _put_rows(dqb, rows, rng, lo, hi, gq)
        index = flat[:, lo:hi].reshape(-1)
        n = index.numel()
        with in_order(t):
            gk, gv = split_extra(gk, gv)
            dk_heads.index_add_(1, index, gk.reshape(b, n, bs, d))
            dv_heads.index_add_(1, index, gv.reshape(b, n, bs, d))

    _run_parts(work, list(enumerate(tasks)), nparts)
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
    chunk_bytes: int | None = None,
    save_probs: bool = False,
    workers: int | None = None,
) -> torch.Tensor:
    """Drop-in for ``blocksparse_attention`` (same arguments, same result) with a chunked forward and a
    hand-written backward. q, k, v (B, H, nb*bs, Dh); key_padding_mask (B, nb*bs) True at padding;
    extra_k, extra_v (H, E, Dh). ``save_probs`` keeps the probabilities for the backward (faster);
    False recomputes them (saves only q, k, v, out). ``workers``: threads over chunks of rows, each
    running single-threaded ops (default ``torch.get_num_threads()``; 1 runs the chunks in the calling
    thread with torch's intra-op threads). ``chunk_bytes`` and ``workers`` default by device
    (``launch_settings``). Returns (B, H, nb*bs, Dh)."""
    b, h, length, d = q.shape
    check_plan_shape(plan, h, length)
    scale = d**-0.5 if scale is None else float(scale)
    pad = None if key_padding_mask is None else key_padding_mask.to(torch.bool)
    tensors = [t for t in (q, k, v, extra_k, extra_v) if t is not None]
    chunk_bytes, workers = launch_settings(q.device, chunk_bytes, workers)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        with _single_threaded(workers > 1):
            return _forward(q.contiguous(), k.contiguous(), v.contiguous(), extra_k, extra_v, plan, pad, scale,
                            int(chunk_bytes), False, workers)[0]
    return _BlockSparseAttention.apply(
        q, k, v, extra_k, extra_v, plan, pad, scale, int(chunk_bytes), bool(save_probs), workers
    )
