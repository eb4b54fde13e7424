"""BigBird: equal to dense attention restricted to its plan, the plan's life cycle, fallback, causal form."""

from __future__ import annotations

import io
import logging

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab.attention import AttentionError, bigbird_reference_allowed, build_attention

from .conftest import D_MODEL, HEADS


def _heads(t):
    b, n, _ = t.shape
    return t.view(b, n, HEADS, -1).transpose(1, 2)


def _dense(m, x, allowed, pad=None):
    """Dense attention with m's projections, restricted to ``allowed`` (L, L), plus ETC global keys."""
    q, k, v = _heads(m.q_proj(x)), _heads(m.k_proj(x)), _heads(m.v_proj(x))
    mask = allowed[None, None].expand(x.shape[0], 1, *allowed.shape)
    if pad is not None:
        mask = mask & ~pad[:, None, None, :]
    if m.global_tokens is not None:
        g = m.global_tokens[None].expand(x.shape[0], -1, -1)
        k = torch.cat([_heads(m.k_proj(g)), k], dim=2)
        v = torch.cat([_heads(m.v_proj(g)), v], dim=2)
        mask = torch.cat([torch.ones(*mask.shape[:3], g.shape[1], dtype=torch.bool), mask], dim=-1)
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
    b, _, n, _ = p.shape
    return m.out_proj((p @ v).transpose(1, 2).reshape(b, n, D_MODEL))


def _bigbird(causal=False, max_len=64, **options):
    torch.manual_seed(0)
    return build_attention("bigbird", d_model=D_MODEL, num_heads=HEADS, max_len=max_len, causal=causal,
                           **options).eval()


@pytest.mark.parametrize("causal", [False, True])
def test_full_coverage_plan_equals_dense_at_paper_block_size(causal):
    m = _bigbird(causal, max_len=256, dense_fallback_len=0)  # block 64, window 3, 2 global, 3 random
    assert m.options.block_size == 64
    plan = m.plan_for_length(256)
    full_blocks = torch.ones(4, 4, dtype=torch.bool)
    assert plan.num_blocks == 4
    assert torch.equal(plan.block_mask(), full_blocks.tril() if causal else full_blocks)
    x = torch.randn(2, 256, D_MODEL)
    full = torch.ones(256, 256, dtype=torch.bool)
    torch.testing.assert_close(m(x), _dense(m, x, full.tril() if causal else full), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("global_tokens", [0, 2])
@pytest.mark.parametrize("length", [32, 37])
@pytest.mark.parametrize("causal", [False, True])
def test_equals_dense_restricted_to_the_reference_mask(causal, length, global_tokens):
    m = _bigbird(causal, block_size=4, num_random_blocks=1, dense_fallback_len=0,
                 num_global_tokens=global_tokens)
    plan = m.plan_for_length(length)
    assert plan.num_blocks == -(-length // 4)
    allowed = bigbird_reference_allowed(plan, length)
    reachable = torch.ones(length, length, dtype=torch.bool)
    reachable = reachable.tril() if causal else reachable
    assert not bool(allowed[reachable].all())  # the plan is sparse: the test compares something
    assert not bool(allowed[~reachable].any())
    x = torch.randn(2, length, D_MODEL)
    pad = torch.arange(length)[None] >= torch.tensor([length, length - 6])[:, None]
    y = m(x, key_padding_mask=pad)
    ref = _dense(m, x, allowed, pad)
    torch.testing.assert_close(y[~pad], ref[~pad], atol=1e-5, rtol=1e-5)


def test_plan_structure_bidirectional_and_causal():
    kw = {"block_size": 4, "window_blocks": 3, "num_global_blocks": 2, "num_random_blocks": 2,
          "dense_fallback_len": 0}
    n = 12
    bi = _bigbird(False, **kw).plan_for_length(4 * n)
    mb = bi.block_mask()
    assert mb[:, 0].all() and mb[:, -1].all() and mb[0].all() and mb[-1].all()  # ITC: first and last
    assert sorted(bi.dense_rows.tolist()) == [0, n - 1]
    assert (mb[1:-1].sum(1) <= 2 + 3 + 2).all()
    ca = _bigbird(True, **kw).plan_for_length(4 * n)
    mc = ca.block_mask()
    assert not mc.triu(1).any()  # nothing from future blocks
    assert mc[:, :1].all() and mc[1:, :2].all()  # leading globals only
    assert not mc[:-1, -1].any()  # no trailing global block
    assert ca.dense_rows.numel() == 0
    for i in range(n):
        assert mc[i, max(0, i - 2):i + 1].all()  # own block and w - 1 previous
        randoms = set(mc[i].nonzero().flatten().tolist()) - {0, 1} - set(range(i - 2, i + 1))
        assert len(randoms) == min(2, max(0, i - 4)) and all(j < i for j in randoms)


def test_aligned_length_adds_no_block_and_unaligned_is_unpadded():
    m = _bigbird(False, block_size=8, num_random_blocks=1, dense_fallback_len=0)
    assert m.plan_for_length(48).num_blocks == 6
    assert m.plan_for_length(49).num_blocks == 7
    assert m(torch.randn(1, 49, D_MODEL)).shape == (1, 49, D_MODEL)


def test_plan_is_the_same_in_train_and_eval_and_has_no_attention_dropout():
    torch.manual_seed(0)
    m = build_attention("bigbird", d_model=D_MODEL, num_heads=HEADS, max_len=64, dropout=0.5,
                        block_size=4, num_random_blocks=1, dense_fallback_len=0)
    x = torch.randn(2, 40, D_MODEL)
    m.train()
    y_train, plan_train = m(x), m.plan_for_length(40).block_mask()
    m.eval()
    y_eval, plan_eval = m(x), m.plan_for_length(40).block_mask()
    assert torch.equal(plan_train, plan_eval)
    torch.testing.assert_close(y_train, y_eval)


def test_plan_survives_a_checkpoint_round_trip():
    a = _bigbird(False, block_size=4, num_random_blocks=1, dense_fallback_len=0, seed=1)
    b = _bigbird(False, block_size=4, num_random_blocks=1, dense_fallback_len=0, seed=2)
    assert not torch.equal(a.plan_for_length(64).block_mask(), b.plan_for_length(64).block_mask())
    assert "rand_scores" in a.state_dict()
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b.load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(a.plan_for_length(64).block_mask(), b.plan_for_length(64).block_mask())
    x = torch.randn(1, 64, D_MODEL)
    torch.testing.assert_close(a(x), b(x))


def test_resample_every_step_draws_in_training_only():
    m = _bigbird(False, block_size=4, num_random_blocks=1, dense_fallback_len=0, resample="every_step")
    x = torch.randn(1, 64, D_MODEL)
    m.train()
    m(x)
    first = m.plan_for_length(64).block_mask()
    m(x)
    second = m.plan_for_length(64).block_mask()
    assert not torch.equal(first, second)
    m.eval()
    m(x)
    assert torch.equal(m.plan_for_length(64).block_mask(), second)


def test_dense_fallback_is_logged_once_per_length_and_not_sticky(caplog):
    m = _bigbird(False, block_size=4, num_random_blocks=1, dense_fallback_len=24)
    short, long = torch.randn(1, 24, D_MODEL), torch.randn(1, 40, D_MODEL)
    with caplog.at_level(logging.INFO, logger="attnlab.attention.bigbird"):
        y1 = m(short)
        m(short)
        y_long = m(long)
        y2 = m(short)
    assert sum("length 24" in r.getMessage() for r in caplog.records) == 1
    assert not any("length 40" in r.getMessage() for r in caplog.records)
    dense_ref = _dense(m, short, torch.ones(24, 24, dtype=torch.bool))
    torch.testing.assert_close(y1, dense_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y2, y1)
    sparse_ref = _dense(m, long, bigbird_reference_allowed(m.plan_for_length(40), 40))
    torch.testing.assert_close(y_long, sparse_ref, atol=1e-5, rtol=1e-5)
    # The default rule: dense when the padded length has at most g + w + r blocks.
    default = _bigbird(False, block_size=4, num_random_blocks=1)
    assert default.uses_dense(24) and not default.uses_dense(25)


def test_causal_fallback_threshold_beyond_exactness_is_refused():
    with pytest.raises(AttentionError) as err:
        _bigbird(True, block_size=4, num_random_blocks=1, dense_fallback_len=25)
    assert "\n" not in str(err.value)
    _bigbird(True, block_size=4, num_random_blocks=1, dense_fallback_len=24)


@pytest.mark.parametrize("options", [{"window_blocks": 2}, {"resample": "sometimes"}, {"block_size": 0}])
def test_invalid_options_are_refused(options):
    with pytest.raises(AttentionError) as err:
        _bigbird(False, **options)
    assert "\n" not in str(err.value)


def test_causal_outputs_ignore_appended_blocks_of_padding():
    m = _bigbird(True, block_size=4, num_random_blocks=1, dense_fallback_len=0)
    x = torch.randn(1, 22, D_MODEL)
    longer = torch.cat([x, torch.randn(1, 30, D_MODEL)], dim=1)
    pad = torch.arange(52)[None] >= 22
    torch.testing.assert_close(m(longer, key_padding_mask=pad)[:, :22], m(x), atol=1e-5, rtol=1e-5)


class _LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("causal", [False, True])
def test_sparse_path_never_materialises_a_length_squared_tensor(causal):
    length = 512
    m = _bigbird(causal, max_len=length, block_size=8, num_random_blocks=1, dense_fallback_len=0)
    m.plan_for_length(length)  # the (blocks x blocks) plan is built outside the measured region
    x = torch.randn(1, length, D_MODEL)
    with torch.no_grad(), _LargestTensor() as probe:
        m(x)
    assert probe.largest < length * length
