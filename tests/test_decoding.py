"""Greedy and beam search: cached decoding equals re-running the prefix; beam search finds better sequences."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnlab.decoding.options import DecodingOptions
from attnlab.decoding.search import beam_search, beam_search_reference, gnmt_length_penalty, greedy_decode
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


# -- length penalties: GNMT and fairseq ----------------------------------------------------------------------
def test_fairseq_length_penalty_hand_values():
    from attnlab.decoding.search import fairseq_length_penalty, length_penalty_fn

    assert fairseq_length_penalty(1.0, 0.6) == 1.0
    assert fairseq_length_penalty(10.0, 1.0) == 10.0  # lenpen 1: the mean log-probability per token
    assert abs(fairseq_length_penalty(10.0, 0.6) - 10**0.6) < 1e-12
    assert fairseq_length_penalty(7.0, 0.0) == gnmt_length_penalty(7.0, 0.0) == 1.0
    # the two differ: at L=10, alpha=0.6 GNMT divides by 2.5^0.6 = 1.73, fairseq by 10^0.6 = 3.98
    assert abs(gnmt_length_penalty(10.0, 0.6) - 1.7329) < 1e-4
    assert abs(fairseq_length_penalty(10.0, 0.6) - 3.9811) < 1e-4
    assert length_penalty_fn("gnmt") is gnmt_length_penalty
    assert length_penalty_fn("fairseq") is fairseq_length_penalty


def test_unknown_length_penalty_is_one_clear_line():
    import pytest

    from attnlab.decoding.search import length_penalty_fn

    with pytest.raises(ValueError, match=r"^length penalty 'wu' is not known; valid: gnmt, fairseq$"):
        length_penalty_fn("wu")
    with pytest.raises(ValueError, match="valid: gnmt, fairseq"):
        beam_search(_model(), torch.randint(3, 12, (1, 4)), bos_id=1, eos_id=2, max_len=5, length_penalty="wu")


def _every_hypothesis_logprob(model, src, *, vocab: int, max_len: int, eos: int) -> dict[tuple[int, ...], float]:
    """log p of every hypothesis that ends in EOS within max_len (one batched teacher-forced pass per length)."""
    import itertools

    others = [t for t in range(vocab) if t != eos]
    scores = {}
    with torch.no_grad():
        for n in range(max_len):
            hyps = [[*prefix, eos] for prefix in itertools.product(others, repeat=n)]
            tgt_in = torch.tensor([[1, *h[:-1]] for h in hyps])  # BOS = 1
            logp = model(src.expand(len(hyps), -1), tgt_in)[0].log_softmax(-1)
            picked = logp.gather(-1, torch.tensor(hyps).unsqueeze(-1)).squeeze(-1).sum(-1)
            scores.update({tuple(h): float(v) for h, v in zip(hyps, picked, strict=True)})
    return scores


def _brute_force_best(logprobs: dict[tuple[int, ...], float], penalty) -> list[int]:
    """The hypothesis with the best log p / penalty(length incl. EOS), over every hypothesis."""
    return list(max(logprobs, key=lambda h: logprobs[h] / penalty(float(len(h)))))


def test_beam_search_with_fairseq_penalty_returns_the_brute_force_best():
    from attnlab.decoding.search import fairseq_length_penalty

    torch.manual_seed(4)  # a model whose best hypotheses under the two penalties differ (checked below)
    vocab, max_len, alpha = 5, 4, 0.6
    model = EncoderDecoder(CFG, src_vocab=vocab, tgt_vocab=vocab, pad_id=0, max_len=16).eval()
    differs = 0
    for i in range(6):
        src = torch.randint(3, vocab, (1, 3 + i % 3))
        # beam 64 = every live prefix (4 non-EOS tokens, 3 steps): the search is exhaustive up to max_len
        beam = beam_search(model, src, bos_id=1, eos_id=2, max_len=max_len, beam_size=64, alpha=alpha,
                           length_penalty="fairseq")[0].tolist()
        beam = beam[: beam.index(2) + 1]
        logprobs = _every_hypothesis_logprob(model, src, vocab=vocab, max_len=max_len, eos=2)
        assert len(logprobs) == 1 + 4 + 16 + 64  # every length 1-4 ending in EOS
        fairseq = _brute_force_best(logprobs, lambda n: fairseq_length_penalty(n, alpha))
        gnmt = _brute_force_best(logprobs, lambda n: gnmt_length_penalty(n, alpha))
        assert beam == fairseq, (i, beam, fairseq)
        gnmt_beam = beam_search(model, src, bos_id=1, eos_id=2, max_len=max_len, beam_size=64, alpha=alpha)[0].tolist()
        assert gnmt_beam[: gnmt_beam.index(2) + 1] == gnmt  # the default stays GNMT
        differs += fairseq != gnmt
    assert differs, "the sources chosen must tell the two penalties apart"


def test_decoding_flavour_names_the_length_penalty():
    beam = {"strategy": "beam", "beam_size": 4, "length_penalty_alpha": 0.6, "max_len_a": 1.5, "max_len_b": 10}
    assert DecodingOptions.of(beam).describe() == "beam 4, GNMT length penalty ((5+L)/6)^0.6, max length 1.5*src+10"
    fairseq = DecodingOptions.of({**beam, "length_penalty": "fairseq"}).describe()
    assert "fairseq length penalty L^0.6 (--lenpen 0.6" in fairseq
    assert DecodingOptions.of({**beam, "strategy": "greedy"}).describe() == "greedy, max length 1.5*src+10"
    with pytest.raises(ValueError, match="task.decoding.length_penalty='wu' is not valid; valid: gnmt, fairseq"):
        DecodingOptions.of({**beam, "length_penalty": "wu"}).describe()


def test_decoding_defaults_fill_what_a_task_or_an_old_checkpoint_leaves_out():
    # A checkpoint written before the fairseq option has no length_penalty: it decodes with GNMT's, as it trained.
    old = DecodingOptions.of({"strategy": "beam", "beam_size": 2, "length_penalty_alpha": 1.0, "max_len_a": 0.0,
                              "max_len_b": 7, "decode_in_validation": False})
    assert old.length_penalty == "gnmt" and old.max_length(100) == 7
    assert DecodingOptions.of(None) == DecodingOptions() and DecodingOptions().max_length(5) == 15
    assert DecodingOptions().describe() == "greedy, max length 1.0*src+10"  # what a task without task.decoding states


def test_the_config_check_and_the_run_read_the_same_decoding_defaults():
    from omegaconf import OmegaConf

    from attnlab.training.build import decoding_config

    cfg = OmegaConf.create({"task": {"name": "t", "decoding": {"strategy": "beam", "max_len_b": 3}}})
    assert decoding_config(cfg) == {**dataclasses.asdict(DecodingOptions()), "strategy": "beam", "max_len_b": 3}
    assert decoding_config(OmegaConf.create({"task": {"name": "t"}})) == dataclasses.asdict(DecodingOptions())


def _eos_biased_model(seed: int, eos_bias: float):
    """A model whose EOS logit is shifted, so hypotheses finish early, late, or never within max_len."""
    model = _model(seed)
    original = model.decode

    def decode(*args, **kwargs):
        logits, aux = original(*args, **kwargs)
        logits = logits.clone()
        logits[..., 2] += eos_bias
        return logits, aux

    model.decode = decode
    return model


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("eos_bias", [-4.0, 0.0, 2.0])
@pytest.mark.parametrize("beam_size,alpha,penalty", [(1, 0.0, "gnmt"), (4, 0.6, "gnmt"), (5, 1.0, "fairseq")])
def test_batched_beam_search_equals_the_one_at_a_time_reference(seed, eos_bias, beam_size, alpha, penalty):
    """Same hypotheses as the per-source, per-candidate reference, whatever the batch holds: sources that
    finish at once, late, or never (EOS pushed away), a batch of one, and padded sources of mixed length."""
    model = _eos_biased_model(seed, eos_bias)
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 12, (7, 9), generator=gen)
    src[1, 5:] = 0  # padding: a shorter source in the batch
    src[4, 2:] = 0
    kw = dict(bos_id=1, eos_id=2, max_len=14, beam_size=beam_size, alpha=alpha, length_penalty=penalty)
    fast = beam_search(model, src, **kw)
    ref = beam_search_reference(model, src, **kw)
    assert torch.equal(fast, ref)
    # Each source alone gives its row of the batched result (up to trailing EOS padding).
    for i in (0, 4):
        alone = beam_search(model, src[i : i + 1, : int((src[i] != 0).sum())] if i == 4 else src[i : i + 1], **kw)
        row = alone[0].tolist()
        assert fast[i, : len(row)].tolist() == row


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("beam_size,alpha", [(4, 0.6), (3, 0.0)])
def test_sources_leave_the_batched_beam_search_when_done_without_changing_any_hypothesis(use_cache, beam_size, alpha):
    """EOS is made likely only once the hypothesis is about as long as its source, so short sources end their
    search many steps before long ones and leave the batch (the decoder sees fewer rows); every hypothesis
    must still equal the reference's, which keeps stepping every source to the end."""
    model = _model(3)
    original = model.decode
    rows_seen: list[int] = []

    def decode(tgt_in, memory, memory_padding, cache=None):
        """The model's logits, steered so that each row's choice depends on its own memory, its own cache and
        its own prefix: a row mixed up when sources leave changes the hypotheses."""
        logits, aux = original(tgt_in, memory, memory_padding, cache=cache)
        rows_seen.append(logits.shape[0])
        if cache is None:  # the decayed count of the prefix's tokens, recomputed from the whole prefix
            history = torch.zeros(tgt_in.shape[0], 12)
            for column in tgt_in.T:
                history = 0.5 * history + torch.nn.functional.one_hot(column, 12).float()
        else:  # the same, carried in the cache (reordered with the beams, cut when sources leave)
            history = 0.5 * cache.get("history", torch.zeros(tgt_in.shape[0], 12))
            history = history + torch.nn.functional.one_hot(tgt_in[:, -1], 12).float()
            cache["history"] = history
        if cache is None:
            step = tgt_in.shape[1]
        else:
            step = cache["steps"] = cache.get("steps", 0) + 1
        source_len = (~memory_padding).sum(1)
        source_tag = memory[:, 0, :9] / memory[:, 0, :9].std(1, keepdim=True)
        logits = logits.clone()
        logits[:, -1, 3:] += 2.0 * source_tag - 3.0 * history[:, 3:]
        # EOS likely only once the hypothesis is about as long as its source; pad and BOS never follow.
        logits[:, -1, 2] += torch.where(step >= source_len - 1, 6.0, -6.0)
        logits[:, -1, :2] = float("-inf")
        return logits, aux

    model.decode = decode
    gen = torch.Generator().manual_seed(5)
    src = torch.randint(3, 12, (6, 10), generator=gen)
    for row, length in enumerate([10, 3, 7, 2, 9, 4]):
        src[row, length:] = 0
    kw = dict(bos_id=1, eos_id=2, max_len=16, beam_size=beam_size, alpha=alpha, use_cache=use_cache)
    ref = beam_search_reference(model, src, **kw)
    rows_seen.clear()
    fast = beam_search(model, src, **kw)
    assert min(rows_seen) < max(rows_seen) == 6 * beam_size, "no source left the batch early"
    assert torch.equal(fast, ref)
