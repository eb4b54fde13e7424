"""Autoregressive search with incremental caches.

The model contract is ``EncoderDecoder``'s: ``encode(src) -> (memory, memory_padding, aux)`` and
``decode(tgt_in, memory, memory_padding, cache=dict) -> (logits, aux)``, where the cache carries every
layer's keys and values so each step costs one position, not the whole prefix.
"""

from __future__ import annotations

import torch

from attnlab.attention import reorder_cache


def gnmt_length_penalty(length: torch.Tensor | float, alpha: float) -> torch.Tensor | float:
    """((5 + L) / 6) ** alpha (Wu et al. 2016), as T2T, Mesh and QKNorm used for their MT numbers."""
    return ((5.0 + length) / 6.0) ** alpha


def fairseq_length_penalty(length: torch.Tensor | float, alpha: float) -> torch.Tensor | float:
    """L ** alpha: fairseq's ``--lenpen`` (a finished hypothesis scores sum log p / L^lenpen, L counting EOS)."""
    return length**alpha


LENGTH_PENALTIES = {"gnmt": gnmt_length_penalty, "fairseq": fairseq_length_penalty}


def length_penalty_fn(name: str):
    """The penalty function called ``name``; one clear line for anything else."""
    if name not in LENGTH_PENALTIES:
        raise ValueError(f"length penalty {name!r} is not known; valid: {', '.join(LENGTH_PENALTIES)}")
    return LENGTH_PENALTIES[name]


@torch.no_grad()
def greedy_decode(model, src: torch.Tensor, *, bos_id: int, eos_id: int, max_len: int, use_cache: bool = True):
    """Greedy decoding; returns (batch, <= max_len) ids, EOS included where produced, padded with EOS."""
    memory, memory_padding, _ = model.encode(src)
    batch = src.shape[0]
    out = torch.full((batch, 1), bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(batch, dtype=torch.bool, device=src.device)
    cache: dict | None = {} if use_cache else None
    for _ in range(max_len):
        step_in = out[:, -1:] if use_cache else out
        logits, _ = model.decode(step_in, memory, memory_padding, cache=cache)
        nxt = logits[:, -1].argmax(-1)
        nxt = torch.where(finished, torch.full_like(nxt, eos_id), nxt)
        out = torch.cat([out, nxt.unsqueeze(1)], dim=1)
        finished |= nxt.eq(eos_id)
        if bool(finished.all()):
            break
    return out[:, 1:]


def _beam_start(model, src: torch.Tensor, k: int, bos_id: int):
    """Memory repeated per beam, BOS-only beams and their scores (one beam alive per source)."""
    batch, device = src.shape[0], src.device
    memory, memory_padding, _ = model.encode(src)
    memory = memory.repeat_interleave(k, dim=0)
    memory_padding = memory_padding.repeat_interleave(k, dim=0)
    tokens = torch.full((batch * k, 1), bos_id, dtype=torch.long, device=device)
    scores = torch.zeros(batch, k, device=device)
    scores[:, 1:] = float("-inf")  # all beams start identical: keep one alive at step 0
    return memory, memory_padding, tokens, scores


def _best_candidates(model, tokens, memory, memory_padding, cache, scores, k: int):
    """One decoding step: the 2k best (score, source beam, token) extensions per source, best first."""
    step_in = tokens[:, -1:] if cache is not None else tokens
    logits, _ = model.decode(step_in, memory, memory_padding, cache=cache)
    logp = logits[:, -1].float().log_softmax(-1)
    vocab = logp.shape[-1]
    cand = (scores.view(-1, 1) + logp).view(scores.shape[0], k * vocab)
    top_scores, top_idx = cand.topk(2 * k, dim=-1)
    return top_scores, top_idx // vocab, top_idx % vocab


@torch.no_grad()
def beam_search(
    model,
    src: torch.Tensor,
    *,
    bos_id: int,
    eos_id: int,
    max_len: int,
    beam_size: int = 4,
    alpha: float = 0.6,
    use_cache: bool = True,
    length_penalty: str = "gnmt",
):
    """Beam search with a length penalty; returns the best hypothesis per source, (batch, <= max_len).

    ``length_penalty``: ``gnmt`` (((5+L)/6)^alpha, Wu et al. 2016; T2T / the papers) or ``fairseq``
    (L^alpha, fairseq's ``--lenpen``); L is the hypothesis length including its EOS. Finished hypotheses are
    kept aside with score log p / lp(length); search stops when every source has ``beam_size`` finished
    hypotheses that no live beam can beat (both penalties only grow with length for alpha >= 0, so a live
    beam's best possible final score is its current log p / lp(max_len)).

    The bookkeeping is batched tensor work (no Python loop over sources or candidates, no device syncs but
    the stopping test), with the same choices, in the same order, as ``beam_search_reference``: of the 2k
    best candidates, EOS ones join the finished set (kept best-k, earlier-finished first on ties) and the
    first k others continue.
    """
    lp_fn = length_penalty_fn(length_penalty)
    batch, device = src.shape[0], src.device
    k = beam_size
    memory, memory_padding, tokens, scores = _beam_start(model, src, k, bos_id)
    neg_inf = torch.tensor(float("-inf"), device=device)
    # Finished hypotheses per live source, best first: normalised score, tokens (EOS-padded), length.
    done_scores = torch.full((batch, k), float("-inf"), device=device)
    done_tokens = torch.full((batch, k, max_len), eos_id, dtype=torch.long, device=device)
    done_len = torch.zeros(batch, k, dtype=torch.long, device=device)
    # A source whose search is over leaves the batch (its rows of the memory, the beams and every cache go),
    # so the last long sentences of a batch do not drag the finished ones through each step. Its best
    # finished hypothesis is final by then: a later EOS scores s / lp(step) <= s / lp(max_len) <= the live
    # bound that already lost, so the reference, which keeps stepping it, never changes it either.
    result = torch.full((batch, max_len), eos_id, dtype=torch.long, device=device)
    result_len = torch.zeros(batch, dtype=torch.long, device=device)
    source_ids = torch.arange(batch, device=device)  # original index of each source still in the batch
    cache: dict | None = {} if use_cache else None
    for step in range(1, max_len + 1):
        live = source_ids.shape[0]
        rows = torch.arange(live, device=device)
        top_scores, beam_idx, tok_idx = _best_candidates(model, tokens, memory, memory_padding, cache, scores, k)
        alive = top_scores > float("-inf")
        is_eos = (tok_idx == eos_id) & alive
        lp = lp_fn(float(step), alpha)
        # Hypotheses ending here: the prefix (without BOS) of the beam each EOS candidate extends.
        prefix = tokens[:, 1:].view(live, k, step - 1)
        new_hyp = torch.full((live, 2 * k, max_len), eos_id, dtype=torch.long, device=device)
        new_hyp[:, :, : step - 1] = prefix.gather(1, beam_idx.unsqueeze(-1).expand(-1, -1, step - 1))
        new_done = torch.where(is_eos, top_scores / lp, neg_inf)
        # Merge with what finished before; a stable sort puts earlier-finished first among equals, as the
        # reference's append-then-stable-sort does, and its strict ">" drops a new tie at the k-th place.
        pool_scores = torch.cat([done_scores, new_done], dim=1)
        order = pool_scores.sort(dim=1, descending=True, stable=True).indices[:, :k]
        done_scores = pool_scores.gather(1, order)
        pool_tokens = torch.cat([done_tokens, new_hyp], dim=1)
        done_tokens = pool_tokens.gather(1, order.unsqueeze(-1).expand(-1, -1, max_len))
        pool_len = torch.cat([done_len, torch.full((live, 2 * k), step - 1, dtype=torch.long, device=device)], 1)
        done_len = pool_len.gather(1, order)
        # The first k non-EOS candidates continue; rank r goes to slot r, the rest to a scratch slot k.
        going_on = alive & ~is_eos
        rank = going_on.long().cumsum(1) - 1
        slot = torch.where(going_on & (rank < k), rank, torch.full_like(rank, k))
        new_scores = torch.full((live, k + 1), float("-inf"), device=device).scatter(1, slot, top_scores)[:, :k]
        new_src = torch.zeros(live, k + 1, dtype=torch.long, device=device).scatter(1, slot, beam_idx)[:, :k]
        new_tok = torch.full((live, k + 1), eos_id, dtype=torch.long, device=device).scatter(1, slot, tok_idx)[:, :k]
        # Slots nobody filled keep -inf, source beam 0 and EOS, as in the reference.
        filled = torch.zeros(live, k + 1, dtype=torch.bool, device=device).scatter(1, slot, going_on)[:, :k]
        new_scores = torch.where(filled, new_scores, neg_inf)
        new_src = torch.where(filled, new_src, torch.zeros_like(new_src))
        new_tok = torch.where(filled, new_tok, torch.full_like(new_tok, eos_id))
        flat_src = (new_src + rows.unsqueeze(1) * k).view(-1)
        tokens = torch.cat([tokens.index_select(0, flat_src), new_tok.view(-1, 1)], dim=1)
        scores = new_scores
        best_possible = scores.max(dim=1).values / lp_fn(float(max_len), alpha)
        worst_kept = done_scores[:, -1]
        over = (worst_kept > float("-inf")) & (best_possible <= worst_kept)
        n_over = int(over.sum())  # the one device sync per step, as the all-finished test was
        if n_over:
            ended = source_ids[over]
            result[ended] = done_tokens[over, 0]
            result_len[ended] = done_len[over, 0] + 1  # with its EOS
        if n_over == live:  # every search is over: nothing is decoded again, so the cache is left as it is
            source_ids = source_ids[:0]
            break
        if n_over:
            keep = (~over).nonzero().squeeze(1)
            keep_rows = (keep.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1)
            flat_src = flat_src.index_select(0, keep_rows)
            tokens = tokens.index_select(0, keep_rows)
            memory = memory.index_select(0, keep_rows)
            memory_padding = memory_padding.index_select(0, keep_rows)
            scores, done_scores, done_tokens, done_len = (
                scores[keep], done_scores[keep], done_tokens[keep], done_len[keep])
            source_ids = source_ids[keep]
        if cache is not None:
            reorder_cache(cache, flat_src)
    if source_ids.numel():
        # Still searching at max_len: the best finished hypothesis plus its EOS, or, with none, the best live
        # beam (max_len tokens, no EOS).
        live = source_ids.shape[0]
        has_done = done_scores[:, 0] > float("-inf")
        best_live = scores.argmax(dim=1)
        live_tokens = tokens.view(live, k, -1)[torch.arange(live, device=device), best_live, 1:]
        live_full = torch.full((live, max_len), eos_id, dtype=torch.long, device=device)
        live_full[:, : live_tokens.shape[1]] = live_tokens
        result[source_ids] = torch.where(has_done.unsqueeze(1), done_tokens[:, 0], live_full)
        result_len[source_ids] = torch.where(
            has_done, done_len[:, 0] + 1, torch.full_like(done_len[:, 0], live_tokens.shape[1]))
    width = int(result_len.max())  # <= max_len: finished ones end by step - 1, live ones ran every step
    return result[:, :width]


@torch.no_grad()
def beam_search_reference(
    model,
    src: torch.Tensor,
    *,
    bos_id: int,
    eos_id: int,
    max_len: int,
    beam_size: int = 4,
    alpha: float = 0.6,
    use_cache: bool = True,
    length_penalty: str = "gnmt",
):
    """Beam search, one source and one candidate at a time in Python: the reference ``beam_search`` is held
    equal to (tests/test_decoding.py). Arguments, length penalties and stopping rule as ``beam_search``'s;
    returns the best hypothesis per source, (batch, <= max_len).
    """
    lp_fn = length_penalty_fn(length_penalty)
    batch, device = src.shape[0], src.device
    k = beam_size
    memory, memory_padding, tokens, scores = _beam_start(model, src, k, bos_id)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    cache: dict | None = {} if use_cache else None
    for step in range(1, max_len + 1):
        top_scores, beam_idx, tok_idx = _best_candidates(model, tokens, memory, memory_padding, cache, scores, k)
        new_scores = torch.full((batch, k), float("-inf"), device=device)
        new_src = torch.zeros(batch, k, dtype=torch.long, device=device)
        new_tok = torch.full((batch, k), eos_id, dtype=torch.long, device=device)
        lp = lp_fn(float(step), alpha)
        for b in range(batch):
            filled = 0
            for j in range(2 * k):
                s = float(top_scores[b, j])
                if s == float("-inf"):
                    break
                src_beam = int(beam_idx[b, j])
                if int(tok_idx[b, j]) == eos_id:
                    if len(finished[b]) < k or s / lp > min(f[0] for f in finished[b]):
                        hyp = tokens[b * k + src_beam, 1:].tolist()
                        finished[b].append((s / lp, hyp))
                        finished[b].sort(key=lambda f: -f[0])
                        del finished[b][k:]
                    continue
                if filled < k:
                    new_scores[b, filled] = s
                    new_src[b, filled] = src_beam
                    new_tok[b, filled] = tok_idx[b, j]
                    filled += 1
        flat_src = (new_src + torch.arange(batch, device=device).unsqueeze(1) * k).view(-1)
        tokens = torch.cat([tokens.index_select(0, flat_src), new_tok.view(-1, 1)], dim=1)
        scores = new_scores
        if cache is not None:
            reorder_cache(cache, flat_src)
        best_possible = scores.max(dim=1).values / lp_fn(float(max_len), alpha)
        if all(
            len(finished[b]) >= k and float(best_possible[b]) <= finished[b][-1][0] for b in range(batch)
        ):
            break
    results = []
    for b in range(batch):
        if finished[b]:
            results.append(finished[b][0][1] + [eos_id])
        else:  # nothing finished within max_len: take the best live beam
            best = int(scores[b].argmax())
            results.append(tokens[b * k + best, 1:].tolist())
    width = max(len(r) for r in results)
    out = torch.full((batch, width), eos_id, dtype=torch.long, device=device)
    for b, r in enumerate(results):
        out[b, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out
