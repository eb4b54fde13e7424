"""QKNorm: the paper's formula by hand, the learnable scale g and its initialisation g0."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.attention import AttentionError, build_attention, qknorm_g0

from .conftest import D_MODEL, HEADS


def _heads(t):
    b, n, _ = t.shape
    return t.view(b, n, HEADS, D_MODEL // HEADS).transpose(1, 2)


def _by_hand(m, x, mem, pad, causal):
    q = F.normalize(_heads(m.q_proj(x)), dim=-1)
    k = F.normalize(_heads(m.k_proj(mem)), dim=-1)
    v = _heads(m.v_proj(mem))
    logits = m.g * q @ k.transpose(-1, -2)  # no 1/sqrt(d_h)
    allowed = ~pad[:, None, None, :]
    if causal:
        allowed = allowed & torch.ones(x.shape[1], mem.shape[1], dtype=torch.bool).tril()
    p = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    b, _, n, _ = p.shape
    return m.out_proj((p @ v).transpose(1, 2).reshape(b, n, D_MODEL))


@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_equals_formula(make, causal):
    m = make("qknorm", causal=causal, g0=5.0)
    x = torch.randn(2, 11, D_MODEL)
    pad = torch.arange(11)[None] >= torch.tensor([11, 8])[:, None]
    y = m(x, key_padding_mask=pad)
    torch.testing.assert_close(y[~pad], _by_hand(m, x, x, pad, causal)[~pad], atol=1e-5, rtol=1e-5)


def test_cross_attention_equals_formula(make):
    m = make("qknorm", cross=True, g0=7.0)
    x, mem = torch.randn(2, 5, D_MODEL), torch.randn(2, 9, D_MODEL)
    pad = torch.arange(9)[None] >= torch.tensor([9, 4])[:, None]
    torch.testing.assert_close(m(x, mem, memory_padding_mask=pad), _by_hand(m, x, mem, pad, False), atol=1e-5,
                               rtol=1e-5)


def test_g_is_one_shared_parameter_and_gets_gradient(make):
    m = make("qknorm", train_length_p975=72)
    assert isinstance(m.g, torch.nn.Parameter) and m.g.numel() == 1
    assert [n for n, _ in m.named_parameters() if n == "g"] == ["g"]
    m(torch.randn(2, 6, D_MODEL)).sum().backward()
    assert m.g.grad is not None and m.g.grad.abs() > 0


def test_g0_initialisation_rules():
    def g(**kw):
        return build_attention("qknorm", d_model=D_MODEL, num_heads=HEADS, **kw).g.item()

    assert g(train_length_p975=72) == pytest.approx(math.log2(72 * 72 - 72))  # ~12.3 (en-vi in the paper)
    assert g(train_length_p975=72, g0=3.5) == pytest.approx(3.5)
    assert g(max_len=50) == pytest.approx(math.log2(50 * 49))
    assert g(max_len=50, train_length_p975=20) == pytest.approx(math.log2(20 * 19))
    with pytest.raises(AttentionError) as err:
        g()
    assert "\n" not in str(err.value)


def test_g0_from_training_lengths():
    lengths = list(range(1, 101))
    pos = 0.975 * (len(lengths) - 1)  # linear interpolation between order statistics
    lo = sorted(lengths)[math.floor(pos)]
    hi = sorted(lengths)[math.ceil(pos)]
    p975 = lo + (hi - lo) * (pos - math.floor(pos))
    assert qknorm_g0(lengths) == pytest.approx(math.log2(p975 * p975 - p975))
    assert qknorm_g0([72] * 10) == pytest.approx(math.log2(72 * 71))
    with pytest.raises(AttentionError):
        qknorm_g0([])


def test_model_builder_takes_the_975th_percentile_of_training_lengths():
    # Henry et al.: L is the 97.5th percentile of training lengths (not the median, not the max). Reference
    # by definition: linear interpolation between order statistics at rank 0.975 * (n - 1).
    from omegaconf import OmegaConf

    from attnlab.training.build import model_config

    lengths = [3] * 50 + [10] * 30 + list(range(11, 41))  # skewed: median 10, p97.5 near 38
    ordered = sorted(lengths)
    rank = 0.975 * (len(ordered) - 1)
    lo, frac = math.floor(rank), rank - math.floor(rank)
    expected = ordered[lo] + (ordered[lo + 1] - ordered[lo]) * frac

    class _Task:
        max_len, train_lengths = 64, lengths

    cfg = OmegaConf.create({"seed": 0, "model": {"max_len": None, "attention": {
        "name": "qknorm", "g0": None, "train_length_p975": None, "bias": True}}})
    model = model_config(cfg, _Task())
    assert model["attention"]["train_length_p975"] == pytest.approx(expected)
    opts = {k: v for k, v in model["attention"].items() if k != "name"}
    m = build_attention("qknorm", d_model=D_MODEL, num_heads=HEADS, max_len=64, **opts)
    assert m.g.item() == pytest.approx(math.log2(expected * expected - expected))


def test_auto_cross_attention_is_qknorm_inside_a_model():
    # QKNorm normalises encoder self-, decoder self- and cross-attention (design decision 23,
    # docs/design_decisions.md#qknorm); with model.cross_attention=auto every attention module of the network must be
    # QKNorm.
    from attnlab.attention.qknorm import QKNormAttention
    from attnlab.models import EncoderDecoder

    cfg = dict(d_model=D_MODEL, num_heads=HEADS, d_ff=64, dropout=0.0, attention_dropout=0.0,
               activation_dropout=0.0, activation="relu", norm_first=True, cross_attention="auto",
               attention={"name": "qknorm", "g0": None, "train_length_p975": 20, "bias": True},
               recurrence={"name": "stacked"}, encoder_layers=2, decoder_layers=2, positions="sinusoidal",
               share_embeddings=True, tie_output=True)
    model = EncoderDecoder(cfg, src_vocab=13, tgt_vocab=13, pad_id=0, max_len=32)
    crosses = [layer.cross_attn for layer in model.decoder.layers]
    assert all(type(c) is QKNormAttention and c.is_cross for c in crosses)
    selfs = [layer.self_attn for layer in [*model.encoder.layers, *model.decoder.layers]]
    assert all(type(s) is QKNormAttention for s in selfs)
    g_names = [n for n, _ in model.named_parameters() if n.endswith(".g")]
    assert len(g_names) == 2 + 2 * 2  # one g per attention module: enc self, dec self and dec cross
