"""Attention capture beyond the registry contract: BigBird's paths, mixtures, what is not captured,
and that the normal path is left alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.attention import Attention, Capabilities, bigbird_reference_allowed, build_attention
from attnlab.attention.capture import capture_attention_weights
from attnlab.models import EncoderDecoder

from .conftest import D_MODEL, HEADS, MAX_LEN


def _padded(lengths, n):
    return torch.arange(n)[None] >= torch.tensor(lengths)[:, None]


def _rebuilt(m, x, weights, capture):
    """weights @ V through the value and output projections, with ETC global tokens' values first."""
    values = m.split_heads(m.v_proj(x))
    e = capture.extra_keys
    out = weights[..., e:] @ values
    if e:
        out = out + weights[..., :e] @ m._global_kv()[1]
    return m.out_proj(m.merge_heads(out))


class _Uncaptured(Attention):
    """A variant that never learned to capture: the capture must say so, not skip it."""

    capabilities = Capabilities(cross=False)
    name = "unrecorded"

    def __init__(self) -> None:
        super().__init__(D_MODEL, HEADS)
        self.v_proj = torch.nn.Linear(D_MODEL, D_MODEL)

    def forward(self, x, key_padding_mask=None, cache=None):
        return self.v_proj(x)


def test_a_variant_without_capture_yields_an_unavailable_capture():
    m = _Uncaptured()
    with capture_attention_weights(m) as captured:
        m(torch.randn(1, 5, D_MODEL))
    assert len(captured) == 1 and not captured[0].available
    assert "unrecorded" in captured[0].note
    with pytest.raises(ValueError, match="no attention weights"):
        captured[0].dense()


@pytest.mark.parametrize("causal", [False, True])
def test_bigbird_sparse_capture_is_the_plan_restricted_softmax(make, causal):
    m = make("bigbird", causal=causal)
    n, pad = 30, _padded([30, 25], 30)
    x = torch.randn(2, n, D_MODEL)
    with capture_attention_weights(m) as captured:
        y = m(x, key_padding_mask=pad)
    (capture,) = captured
    assert capture.layout == "block_sparse" and "sparse path" in capture.note
    # No part holds a full L x L block: sparse rows keep only their gathered keys.
    assert all(p.probs.shape[-2] < n or p.probs.shape[-1] < n for p in capture.parts)
    weights, allowed = capture.dense()
    plan = m.plan_for_length(n)
    expected = bigbird_reference_allowed(plan, n)[None] & ~pad[:, None, None, :]  # per head: (B, H, L, L)
    assert any(not torch.equal(expected[:, 0], expected[:, h]) for h in range(1, HEADS))  # per-head plans
    assert torch.equal(allowed, expected)
    assert weights[~expected.expand_as(weights)].abs().max() == 0
    torch.testing.assert_close(_rebuilt(m, x, weights, capture)[~pad], y[~pad], atol=1e-5, rtol=1e-5)


def test_bigbird_dense_fallback_is_captured(make):
    m = make("bigbird", dense_fallback_len=12)  # 3 blocks of 4: dense fallback
    x = torch.randn(1, 12, D_MODEL)
    with capture_attention_weights(m) as captured:
        y = m(x)
    assert captured[0].layout == "dense" and captured[0].note == "dense fallback"
    weights, _ = captured[0].dense()
    torch.testing.assert_close(_rebuilt(m, x, weights, captured[0]), y, atol=1e-5, rtol=1e-5)


def test_a_mixture_captures_the_mixed_weights(make):
    """Weights (0, 1) on (random, vanilla) are vanilla: the captured weights are the vanilla twin's."""
    m = make("synth_random_vanilla", weights=[0.0, 1.0], learn_weights=False)
    v = build_attention("vanilla", d_model=D_MODEL, num_heads=HEADS).eval()
    dot = m.components["vanilla"]
    v.q_proj.load_state_dict(dot.q_proj.state_dict())
    v.k_proj.load_state_dict(dot.k_proj.state_dict())
    x, pad = torch.randn(2, 13, D_MODEL), _padded([13, 9], 13)
    with capture_attention_weights(m) as mixed, capture_attention_weights(v) as plain:
        m(x, key_padding_mask=pad)
        v(x, key_padding_mask=pad)
    rows = ~pad
    torch.testing.assert_close(mixed[0].dense()[0].transpose(1, 2)[rows], plain[0].dense()[0].transpose(1, 2)[rows])


def test_capture_leaves_the_normal_path_alone(make, monkeypatch):
    m = make("vanilla")
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    x = torch.randn(1, 6, D_MODEL)
    m(x)
    with capture_attention_weights(m):
        m(x)
    m(x)
    assert len(calls) == 2  # SDPA outside the capture, the explicit softmax only inside it
    assert not m._forward_hooks and not m._forward_pre_hooks and not m.capturing_weights


def test_model_capture_names_layers_counts_shared_steps_and_skips_cross_and_cached_calls():
    cfg = dict(d_model=D_MODEL, num_heads=HEADS, d_ff=64, dropout=0.0, attention_dropout=0.0,
               activation_dropout=0.0, activation="relu", norm_first=False, attention={"name": "vanilla"},
               cross_attention="auto", recurrence={"name": "stacked"}, encoder_layers=2, decoder_layers=3,
               positions="sinusoidal", share_embeddings=True, tie_output=True)
    torch.manual_seed(0)
    model = EncoderDecoder(cfg, src_vocab=12, tgt_vocab=12, pad_id=0, max_len=MAX_LEN).eval()
    src, tgt = torch.randint(3, 12, (2, 9)), torch.randint(3, 12, (2, 7))
    with capture_attention_weights(model) as captured:
        model(src, tgt)
        memory, memory_padding, _ = model.encode(src)
        model.decode(tgt[:, :1], memory, memory_padding, cache={})  # an incremental step: not captured
    encoder = [f"encoder.layers.{i}.self_attn" for i in range(2)]
    decoder = [f"decoder.layers.{i}.self_attn" for i in range(3)]  # no cross_attn: self-attention only
    assert [r.name for r in captured] == encoder + decoder + encoder
    assert [r.causal for r in captured[2:5]] == [True] * 3 and captured[-1].call == 1

    ut = EncoderDecoder({**cfg, "recurrence": {"name": "ut", "num_steps": 3}}, src_vocab=12, tgt_vocab=12,
                        pad_id=0, max_len=MAX_LEN).eval()
    with capture_attention_weights(ut) as captured:
        ut(src, tgt)
    assert [(r.name, r.call) for r in captured] == [("encoder.layer.self_attn", t) for t in range(3)] + [
        ("decoder.layer.self_attn", t) for t in range(3)
    ]


def test_row_statistics_of_uniform_attention(make):
    m = make("synth_fixed_random")
    m.components["fixed_random"].R.zero_()  # equal logits: uniform rows over the allowed keys
    pad = _padded([8, 5], 8)
    with capture_attention_weights(m) as captured:
        m(torch.randn(2, 8, D_MODEL), key_padding_mask=pad)
    stats = captured[0].row_statistics()
    keys = torch.tensor([8.0] * 8 * HEADS + [5.0] * 5 * HEADS)
    torch.testing.assert_close(stats["keys"].float().sort().values, keys.sort().values)
    torch.testing.assert_close(stats["entropy"].sort().values, keys.log().sort().values)
    torch.testing.assert_close(stats["max"].sort().values, (1 / keys).sort().values)
    assert captured[0].allowed_entries().numel() == (64 + 25) * HEADS
