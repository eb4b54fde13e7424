"""Greedy and beam search: cached decoding equals re-running the prefix; beam search finds better sequences."""

from __future__ import annotations

import torch

from attnlab.decoding import beam_search, gnmt_length_penalty, greedy_decode
from attnlab.models import EncoderDecoder

CFG = dict(d_model=32, num_heads=4, d_ff=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
           activation="relu", norm_first=False, attention={"name": "vanilla"}, cross_attention="auto",
           recurrence={"name": "stacked"}, encoder_layers=2, decoder_layers=2, positions="sinusoidal",
           share_embeddings=True, tie_output=True)


def _model(seed=0):
    torch.manual_seed(seed)
    return EncoderDecoder(CFG, src_vocab=12, tgt_vocab=12, pad_id=0, max_len=64).eval()


def _sequence_logprob(model, src, hyp, bos=1):
    tgt_in = torch.tensor([[bos, *hyp[:-1]]])
    logits, _ = model(src, tgt_in)
    return logits.log_softmax(-1)[0, torch.arange(len(hyp)), torch.tensor(hyp)].sum().item()


def test_greedy_with_cache_equals_without():
    model = _model()
    src = torch.randint(3, 12, (5, 9))
    cached = greedy_decode(model, src, bos_id=1, eos_id=2, max_len=20)
    plain = greedy_decode(model, src, bos_id=1, eos_id=2, max_len=20, use_cache=False)
    assert torch.equal(cached, plain)


def test_beam_with_cache_equals_without_and_beam1_is_greedy():
    model = _model(1)
    src = torch.randint(3, 12, (3, 7))
    cached = beam_search(model, src, bos_id=1, eos_id=2, max_len=15, beam_size=4)
    plain = beam_search(model, src, bos_id=1, eos_id=2, max_len=15, beam_size=4, use_cache=False)
    assert torch.equal(cached, plain)
    greedy = greedy_decode(model, src, bos_id=1, eos_id=2, max_len=15)
    beam1 = beam_search(model, src, bos_id=1, eos_id=2, max_len=15, beam_size=1, alpha=0.0)
    for g, b in zip(greedy.tolist(), beam1.tolist()):
        g = g[: g.index(2) + 1] if 2 in g else g
        b = b[: b.index(2) + 1] if 2 in b else b
        assert g == b


def test_beam_search_scores_at_least_as_well_as_greedy():
    model = _model(2)
    src = torch.randint(3, 12, (4, 6))
    greedy = greedy_decode(model, src, bos_id=1, eos_id=2, max_len=12)
    beam = beam_search(model, src, bos_id=1, eos_id=2, max_len=12, beam_size=6, alpha=0.0)
    for i in range(src.shape[0]):
        g, b = greedy[i].tolist(), beam[i].tolist()
        if 2 not in g or 2 not in b:
            continue
        g, b = g[: g.index(2) + 1], b[: b.index(2) + 1]
        assert _sequence_logprob(model, src[i : i + 1], b) >= _sequence_logprob(model, src[i : i + 1], g) - 1e-4


def test_gnmt_length_penalty():
    assert gnmt_length_penalty(1.0, 0.6) == 1.0
    assert abs(gnmt_length_penalty(10.0, 0.6) - (15 / 6) ** 0.6) < 1e-12
