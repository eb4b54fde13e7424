"""Block-sparse attention in plain PyTorch: the reference that any fast kernel must match.

Only the key blocks named by the plan are gathered and scored, so memory is O(L * K * block) for K key
blocks per query block, never O(L^2). A faster kernel (FlexAttention ``BlockMask`` built from the same
tables, Triton, ...) can live beside this file and be tested against it.

Plan layout (``BlockSparsePlan``), for a sequence padded to ``num_blocks * block_size`` positions:

- ``row_blocks`` (R,) long: query blocks computed block-sparsely, in any order (the same for every head).
- ``key_blocks`` (P, R, K) long: for plan head ``p`` and row ``r``, the key blocks that query block
  ``row_blocks[r]`` attends to in that head; P is 1 (one plan shared by every head) or the number of heads
  (one plan per head, as the official BigBird code draws them). K is the largest count over heads and rows.
  Entries where ``key_valid`` is False are filler and are masked. Valid entries of a row are distinct (a
  duplicated block would be counted twice by the softmax).
- ``key_valid`` (P, R, K) bool.
- ``dense_rows`` (G,) long: query blocks that attend to every key (bidirectional global blocks); they are
  computed as dense rows, O(block * L) each.
- ``causal``: an element-level mask ``key position <= query position`` is applied on top of the tables,
  which matters only inside diagonal blocks when every other listed block is in the past.

The plan is shared by every batch row; per head when P > 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BlockSparsePlan:
    block_size: int
    num_blocks: int
    causal: bool
    row_blocks: torch.Tensor
    key_blocks: torch.Tensor
    key_valid: torch.Tensor
    dense_rows: torch.Tensor

    def to(self, device) -> BlockSparsePlan:
        return BlockSparsePlan(
            self.block_size, self.num_blocks, self.causal, self.row_blocks.to(device),
            self.key_blocks.to(device), self.key_valid.to(device), self.dense_rows.to(device),
        )

    @property
    def plan_heads(self) -> int:
        """P: 1 when every head shares the plan, else the number of heads."""
        return self.key_blocks.shape[0]

    def block_mask(self) -> torch.Tensor:
        """(P, num_blocks, num_blocks) bool: in plan head p, query block i may attend key block j (before
        the causal mask)."""
        n, p = self.num_blocks, self.plan_heads
        m = torch.zeros(p, n, n, dtype=torch.bool, device=self.key_blocks.device)
        if self.row_blocks.numel():
            heads = torch.arange(p, device=m.device)[:, None, None].expand_as(self.key_blocks)
            rows = self.row_blocks[None, :, None].expand_as(self.key_blocks)
            v = self.key_valid
            m[heads[v], rows[v], self.key_blocks[v]] = True
        m[:, self.dense_rows] = True
        return m


def gathered_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    allowed: torch.Tensor,
    scale: float,
    extra_k: torch.Tensor | None = None,
) -> torch.Tensor:
    """The softmax weights of ``attend_gathered``: (B, H, R, Q, E + Kn), the E extra keys first."""
    s = torch.einsum("bhrqd,bhrkd->bhrqk", q, k) * scale
    s = s.masked_fill(~allowed, torch.finfo(s.dtype).min)
    if extra_k is None:
        return torch.softmax(s, dim=-1)
    se = torch.einsum("bhrqd,hed->bhrqe", q, extra_k.to(q.dtype)) * scale
    return torch.softmax(torch.cat([se, s], dim=-1), dim=-1)


def apply_gathered(p: torch.Tensor, v: torch.Tensor, extra_v: torch.Tensor | None = None) -> torch.Tensor:
    """Weights from ``gathered_probs`` applied to the gathered values (and the extra keys' values)."""
    if extra_v is None:
        return torch.einsum("bhrqk,bhrkd->bhrqd", p, v)
    e = extra_v.shape[1]
    return torch.einsum("bhrqe,hed->bhrqd", p[..., :e], extra_v.to(v.dtype)) + torch.einsum(
        "bhrqk,bhrkd->bhrqd", p[..., e:], v
    )


def attend_gathered(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    scale: float,
    extra_k: torch.Tensor | None = None,
    extra_v: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention of query groups over their own gathered keys.

    q (B, H, R, Q, Dh); k, v (B, H, R, Kn, Dh); allowed bool broadcastable to (B, H, R, Q, Kn).
    extra_k, extra_v (H, E, Dh): keys every query may see (ETC global tokens), shared across the batch.
    Returns (B, H, R, Q, Dh).
    """
    return apply_gathered(gathered_probs(q, k, allowed, scale, extra_k), v, extra_v)


@dataclass(frozen=True)
class GatheredWeights:
    """The softmax weights a block-sparse call computed, for recording (``blocksparse_attention(...,
    weights=[])``): ``probs`` (B, H, Q, E + K) of the query positions ``query_index`` (Q,) over the key
    columns ``key_index`` (Q or 1, E + K): columns 0..E-1 are the extra keys, column E + j key position j.
    ``allowed`` (bool, broadcastable to probs) is the mask the softmax used; filler entries are False."""

    probs: torch.Tensor
    allowed: torch.Tensor
    query_index: torch.Tensor
    key_index: torch.Tensor


def _with_extra_columns(allowed: torch.Tensor, extra: int) -> torch.Tensor:
    if not extra:
        return allowed
    shape = (*allowed.shape[:-1], extra)
    return torch.cat([torch.ones(shape, dtype=torch.bool, device=allowed.device), allowed], dim=-1)


def _gather_blocks(t: torch.Tensor, index: torch.Tensor, block_size: int) -> torch.Tensor:
    """t (B, H, nb*bs, Dh), index (P, R, K) with P in (1, H) -> (B, H, R, K*bs, Dh)."""
    b, h, length, d = t.shape
    tb = t.view(b, h, length // block_size, block_size, d)
    p, r, kk = index.shape
    if p == 1:
        return tb[:, :, index[0]].reshape(b, h, r, kk * block_size, d)
    heads = torch.arange(h, device=t.device)[:, None, None]
    return tb[:, heads, index].reshape(b, h, r, kk * block_size, d)


def _row_keys_allowed(
    plan: BlockSparsePlan,
    idx: torch.Tensor,
    valid: torch.Tensor,
    q_pos: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
) -> torch.Tensor:
    """Which gathered keys (``_gather_blocks(., idx)``) the queries of each row may see: (B|1, P, R, Q|1, K*bs).

    idx, valid (P, R, K): the rows' key blocks and which are not filler; q_pos (R, Q, 1): the queries' absolute
    positions, used only by a causal plan (``key position <= query position``); padded keys are never seen."""
    bs = plan.block_size
    ph, r, kk = idx.shape
    offs = torch.arange(bs, device=idx.device)
    allowed = valid[:, :, None, :, None].expand(ph, r, 1, kk, bs).reshape(ph, r, 1, kk * bs)
    if plan.causal:
        k_pos = (idx[:, :, :, None] * bs + offs).reshape(ph, r, 1, kk * bs)
        allowed = allowed & (k_pos <= q_pos)
    allowed = allowed[None]
    if key_padding_mask is not None:
        b = key_padding_mask.shape[0]
        pad = key_padding_mask.view(b, plan.num_blocks, bs)[:, idx].reshape(b, ph, r, 1, kk * bs)
        allowed = allowed & ~pad
    return allowed


def check_plan_heads(plan: BlockSparsePlan, heads: int) -> None:
    if plan.plan_heads not in (1, heads):
        raise ValueError(f"a plan with {plan.plan_heads} head plans cannot serve {heads} heads (needs 1 or {heads})")


def check_plan_shape(plan: BlockSparsePlan, heads: int, length: int) -> None:
    """The plan serves ``heads`` heads over ``length`` positions (whole blocks), else ValueError."""
    if length != plan.num_blocks * plan.block_size:
        raise ValueError(
            f"sequence of {length} positions does not match a plan of {plan.num_blocks} blocks of "
            f"{plan.block_size}"
        )
    check_plan_heads(plan, heads)


def blocksparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: BlockSparsePlan,
    *,
    key_padding_mask: torch.Tensor | None = None,
    extra_k: torch.Tensor | None = None,
    extra_v: torch.Tensor | None = None,
    scale: float | None = None,
    weights: list[GatheredWeights] | None = None,
) -> torch.Tensor:
    """Attention restricted to the plan. q, k, v (B, H, nb*bs, Dh); key_padding_mask (B, nb*bs) True at
    padding. Returns (B, H, nb*bs, Dh). No attention dropout (the official sparse path has none).

    With ``weights`` (a list), the softmax weights of the sparse rows and of the dense rows are appended
    to it as ``GatheredWeights``, exactly as computed (for attention-weight recording)."""
    b, h, length, d = q.shape
    bs, nb = plan.block_size, plan.num_blocks
    if length != nb * bs:
        raise ValueError(f"sequence of {length} positions does not match a plan of {nb} blocks of {bs}")
    check_plan_heads(plan, h)
    scale = d**-0.5 if scale is None else scale
    dev = q.device
    out = q.new_zeros(b, h, nb, bs, d)
    qb = q.view(b, h, nb, bs, d)
    offs = torch.arange(bs, device=dev)

    rows = plan.row_blocks
    if rows.numel():
        idx = plan.key_blocks  # (P, R, K)
        q_pos = (rows[:, None] * bs + offs)[:, :, None]  # (R, bs, 1)
        allowed = _row_keys_allowed(plan, idx, plan.key_valid, q_pos, key_padding_mask)
        p = gathered_probs(qb[:, :, rows], _gather_blocks(k, idx, bs), allowed, scale, extra_k)
        out = out.index_copy(2, rows, apply_gathered(p, _gather_blocks(v, idx, bs), extra_v))
        if weights is not None:
            weights.append(_union_weights(p, allowed, idx, plan.key_valid, rows, bs, nb, extra_k))

    dense = plan.dense_rows
    if dense.numel():
        g = dense.numel()
        qd = qb[:, :, dense].reshape(b, h, 1, g * bs, d)
        allowed = torch.ones(1, 1, 1, 1, length, dtype=torch.bool, device=dev)
        if plan.causal:
            q_pos = (dense[:, None] * bs + offs).reshape(g * bs, 1)
            allowed = allowed & (torch.arange(length, device=dev) <= q_pos)
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask[:, None, None, None, :]
        p = gathered_probs(qd, k[:, :, None], allowed, scale, extra_k)
        o = apply_gathered(p, v[:, :, None], extra_v)
        out = out.index_copy(2, dense, o.view(b, h, g, bs, d))
        if weights is not None:
            e = 0 if extra_k is None else extra_k.shape[1]
            mask = _with_extra_columns(allowed.expand(-1, -1, -1, g * bs, -1), e)
            weights.append(GatheredWeights(
                probs=p.reshape(b, h, g * bs, e + length),
                allowed=mask.reshape(mask.shape[0], 1, g * bs, e + length),
                query_index=(dense[:, None] * bs + offs).reshape(-1),
                key_index=torch.arange(e + length, device=dev)[None],
            ))
    return out.view(b, h, length, d)


def blocksparse_attention_at(
    q: torch.Tensor,
    positions: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: BlockSparsePlan,
    *,
    key_padding_mask: torch.Tensor | None = None,
    extra_k: torch.Tensor | None = None,
    extra_v: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Queries at given absolute positions attend as their block's plan row says (incremental decoding).

    q (B, H, n, Dh) at ``positions`` (n,); k, v (B, H, nb*bs, Dh) hold every key so far, padded to the
    plan's blocks, with the block padding marked in ``key_padding_mask``. Every query block must be a
    sparse row of the plan (true for causal plans, whose global rows only see the leading globals).
    The keyword arguments are ``blocksparse_attention``'s, spelled out so that each entry point reads alone.
    Returns (B, H, n, Dh).
    """
    b, h, n, d = q.shape
    bs = plan.block_size
    scale = d**-0.5 if scale is None else scale
    dev = q.device
    row_of_block = torch.full((plan.num_blocks,), -1, dtype=torch.long, device=dev)
    row_of_block[plan.row_blocks] = torch.arange(plan.row_blocks.numel(), device=dev)
    rows = row_of_block[positions // bs]
    if bool((rows < 0).any()):
        raise ValueError("a query position falls in a dense row of the plan; decode with a causal plan")
    check_plan_heads(plan, h)
    idx = plan.key_blocks[:, rows]  # (P, n, K): each query is a row of its own
    allowed = _row_keys_allowed(plan, idx, plan.key_valid[:, rows], positions[:, None, None], key_padding_mask)
    o = attend_gathered(
        q[:, :, :, None], _gather_blocks(k, idx, bs), _gather_blocks(v, idx, bs), allowed, scale,
        extra_k, extra_v,
    )
    return o[:, :, :, 0]


def _union_weights(p, allowed, idx, valid, rows, bs, nb, extra_k) -> GatheredWeights:
    """The sparse rows' weights for recording, over the union of the key blocks of every head.

    p (B, H, R, bs, E + K*bs) as computed; allowed (B|1, P, R, bs|1, K*bs); idx, valid (P, R, K). Each head's
    weights are scattered (not recomputed) into the union's columns; columns outside a head's plan get
    weight 0 and allowed False in that head. With one shared plan the union is the plan itself."""
    dev = p.device
    b, h, r = p.shape[:3]
    ph, _, kk = idx.shape
    e = 0 if extra_k is None else extra_k.shape[1]
    offs = torch.arange(bs, device=dev)
    member = torch.zeros(r, nb, dtype=torch.bool, device=dev)
    heads_rows = torch.arange(r, device=dev)[None, :, None].expand_as(idx)
    member[heads_rows[valid], idx[valid]] = True
    counts = member.sum(1)
    ku = max(1, int(counts.max()))
    union = torch.sort((~member).to(torch.int8), dim=1, stable=True).indices[:, :ku]  # (R, Ku), members first
    slot = torch.zeros(r, nb, dtype=torch.long, device=dev)
    slot.scatter_(1, union, torch.arange(ku, device=dev).expand(r, ku))
    pos = torch.where(valid, slot[heads_rows, idx], ku)  # filler entries go to a dump block, cropped below
    cols = (pos[:, :, None, :, None] * bs + offs).reshape(ph, r, 1, kk * bs)
    width = (ku + 1) * bs
    probs = p.new_zeros(b, h, r, bs, width)
    probs.scatter_(-1, cols.expand(h, r, bs, kk * bs).expand(b, -1, -1, -1, -1), p[..., e:])
    allowed = allowed.expand(-1, -1, -1, bs, -1)
    mask = torch.zeros(*allowed.shape[:-1], width, dtype=torch.bool, device=dev)
    mask.scatter_(-1, cols.expand(ph, r, bs, kk * bs).expand(allowed.shape[0], -1, -1, -1, -1), allowed)
    probs = torch.cat([p[..., :e], probs[..., : ku * bs]], dim=-1)
    mask = _with_extra_columns(mask[..., : ku * bs], e)
    key_cols = (union[:, :, None] * bs + offs).reshape(r, ku * bs) + e
    key_cols = torch.cat([torch.arange(e, device=dev).expand(r, e), key_cols], dim=1)
    return GatheredWeights(
        probs=probs.reshape(b, h, r * bs, e + ku * bs),
        allowed=mask.reshape(mask.shape[0], ph, r * bs, e + ku * bs),
        query_index=(rows[:, None] * bs + offs).reshape(-1),
        key_index=key_cols.repeat_interleave(bs, dim=0),
    )
