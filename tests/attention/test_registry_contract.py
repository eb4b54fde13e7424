"""Contract tests generated from the registry: every variant is covered without being named here."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

import attnlab
from attnlab.attention import AttentionError, available, build_attention, get_entry, reorder_cache
from attnlab.attention.capture import capture_attention_weights
from attnlab.attention.contract import check_causal_never_leaks, check_padding_changes_nothing
from attnlab.attention.masks import causal_allowed

from .conftest import D_MODEL, HEADS, MAX_LEN

NAMES = available()
CAUSAL = [n for n in NAMES if get_entry(n).cls.capabilities.causal]
CROSS = [n for n in NAMES if get_entry(n).cls.capabilities.cross]
NO_CROSS = [n for n in NAMES if not get_entry(n).cls.capabilities.cross]
INCREMENTAL = [n for n in CAUSAL if get_entry(n).cls.capabilities.incremental]
BOUNDED = [n for n in NAMES if get_entry(n).cls.capabilities.bounded_length]
CONF_DIR = Path(attnlab.__file__).parent / "conf" / "model" / "attention"


def test_registry_has_the_papers_variants():
    expected = {
        "vanilla", "qknorm", "bigbird", "synth_dense", "synth_random", "synth_fixed_random",
        "synth_factorized_dense", "synth_factorized_random", "synth_mixture", "synth_random_dense",
        "synth_dense_vanilla", "synth_random_vanilla",
    }
    assert expected <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_config_file_lists_every_option_with_its_default(name):
    cfg = yaml.safe_load((CONF_DIR / f"{name}.yaml").read_text())
    assert cfg.pop("name") == name
    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(get_entry(name).options)
    }
    assert cfg == defaults


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_shape_and_finite(make, name, causal):
    if causal and name not in CAUSAL:
        pytest.skip("no causal form")
    x = torch.randn(2, 30, D_MODEL)
    y = make(name, causal=causal)(x)
    assert y.shape == x.shape and torch.isfinite(y).all()


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_never_leaks(make, name):
    check_causal_never_leaks(name, make)  # the check `python -m attnlab.attention.contract` runs
    m = make(name, causal=True)
    x = torch.randn(2, 30, D_MODEL)
    for t in (0, 13, 29):  # and position t itself is seen (the mask does not cut off too much)
        x2 = x.clone()
        x2[:, t:] = torch.randn_like(x2[:, t:])
        assert not torch.allclose(m(x2)[:, t], m(x)[:, t])


@pytest.mark.parametrize("name", NAMES)
def test_padding_invariance_self(make, name):
    check_padding_changes_nothing(name, make)  # both forms, as `python -m attnlab.attention.contract` checks


@pytest.mark.parametrize("name", CROSS)
def test_padding_invariance_cross(make, name):
    m = make(name, cross=True)
    x = torch.randn(2, 7, D_MODEL)
    mem = torch.randn(2, 12, D_MODEL)
    lengths = [12, 9]
    pad = torch.arange(12)[None] >= torch.tensor(lengths)[:, None]
    y = m(x, mem, memory_padding_mask=pad)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(y[b], m(x[b:b + 1], mem[b:b + 1, :n])[0], atol=1e-5, rtol=1e-5)
    mem2 = mem.clone()
    mem2[pad] = torch.randn_like(mem2[pad])
    torch.testing.assert_close(m(x, mem2, memory_padding_mask=pad), y, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", INCREMENTAL)
def test_incremental_equals_full_causal_forward(make, name):
    m = make(name, causal=True)
    lengths = [30, 26]
    x = torch.randn(2, 30, D_MODEL)
    pad = torch.arange(30)[None] >= torch.tensor(lengths)[:, None]
    full = m(x, key_padding_mask=pad)
    cache: dict = {}
    steps = [m(x[:, :5], key_padding_mask=pad[:, :5], cache=cache)]  # a prompt, then one token at a time
    for t in range(5, 30):
        steps.append(m(x[:, t:t + 1], key_padding_mask=pad[:, t:t + 1], cache=cache))
    assert cache["length"] == 30
    inc = torch.cat(steps, dim=1)
    torch.testing.assert_close(inc[~pad], full[~pad], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", INCREMENTAL)
@pytest.mark.parametrize("masked_steps", ["prompt_only", "later_only", "alternating"])
def test_incremental_padding_mask_given_on_some_steps_only(make, name, masked_steps):
    # A step given without a mask counts as real tokens; masks given earlier must keep applying to the keys
    # they covered (a cache that drops them lets later queries attend padding).
    m = make(name, causal=True)
    x = torch.randn(2, 12, D_MODEL)
    pad = torch.zeros(2, 12, dtype=torch.bool)
    if masked_steps == "prompt_only":
        pad[1, 2:5] = True  # padding inside the 5-token prompt of row 1, every later token real
        given = {0}
    elif masked_steps == "later_only":
        pad[1, 7] = True  # no mask with the prompt, one padded position later
        given = {7}
    else:
        pad[0, 3], pad[1, 5], pad[1, 9] = True, True, True
        given = {0, 5, 9}
    full = m(x, key_padding_mask=pad)
    cache: dict = {}
    steps = [m(x[:, :5], key_padding_mask=pad[:, :5] if 0 in given else None, cache=cache)]
    for t in range(5, 12):
        steps.append(m(x[:, t:t + 1], key_padding_mask=pad[:, t:t + 1] if t in given else None, cache=cache))
    inc = torch.cat(steps, dim=1)
    torch.testing.assert_close(inc[~pad], full[~pad], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", INCREMENTAL)
def test_cache_is_batch_first_for_beam_reordering(make, name):
    m = make(name, causal=True)
    x = torch.randn(3, 10, D_MODEL)
    full = m(x)
    cache: dict = {}
    m(x[:, :6], cache=cache)
    index = torch.tensor([2, 0, 1])
    reorder_cache(cache, index)
    out = torch.cat([m(x[index, t:t + 1], cache=cache) for t in range(6, 10)], dim=1)
    torch.testing.assert_close(out, full[index, 6:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", [n for n in CROSS if get_entry(n).cls.capabilities.incremental])
def test_cross_incremental_equals_full(make, name):
    m = make(name, cross=True)
    x, mem = torch.randn(2, 6, D_MODEL), torch.randn(2, 9, D_MODEL)
    pad = torch.tensor([[False] * 9, [False] * 6 + [True] * 3])
    full = m(x, mem, memory_padding_mask=pad)
    cache: dict = {}
    inc = torch.cat([m(x[:, t:t + 1], mem, memory_padding_mask=pad, cache=cache) for t in range(6)], dim=1)
    torch.testing.assert_close(inc, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_every_parameter_gets_a_gradient(make, name):
    m = make(name).train()
    x = torch.randn(2, 30, D_MODEL)
    pad = torch.arange(30)[None] >= torch.tensor([30, 24])[:, None]
    y = m(x, key_padding_mask=pad)
    (y[~pad] ** 2).sum().backward()
    for pname, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}: {pname} got no gradient"


@pytest.mark.parametrize("name", NO_CROSS)
def test_builder_refuses_cross(name):
    with pytest.raises(AttentionError) as err:
        build_attention(name, d_model=D_MODEL, num_heads=HEADS, max_len=MAX_LEN, cross=True)
    assert "\n" not in str(err.value) and "cross" in str(err.value)


@pytest.mark.parametrize("name", BOUNDED)
def test_longer_than_max_len_is_refused(make, name):
    m = make(name)
    with pytest.raises(AttentionError) as err:
        m(torch.randn(1, MAX_LEN + 1, D_MODEL))
    assert "\n" not in str(err.value) and "max_len" in str(err.value)
    if name in INCREMENTAL:
        m = make(name, causal=True)
        cache: dict = {}
        m(torch.randn(1, MAX_LEN, D_MODEL), cache=cache)
        with pytest.raises(AttentionError):
            m(torch.randn(1, 1, D_MODEL), cache=cache)


@pytest.mark.parametrize("name", BOUNDED)
def test_bounded_variants_need_max_len(name):
    with pytest.raises(AttentionError) as err:
        build_attention(name, d_model=D_MODEL, num_heads=HEADS)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", NAMES)
def test_unknown_option_is_refused(name):
    with pytest.raises(AttentionError) as err:
        build_attention(name, d_model=D_MODEL, num_heads=HEADS, max_len=MAX_LEN, not_an_option=1)
    assert "\n" not in str(err.value) and "not_an_option" in str(err.value)


@pytest.mark.parametrize("name", NAMES)
def test_the_default_options_serve_the_cpu(make, name):
    # The config check calls check_device before the run folder exists; a refusal here would refuse every CPU run.
    for causal in {False, name in CAUSAL}:
        make(name, causal=causal).check_device(torch.device("cpu"))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_captured_weights_are_the_weights_the_output_used(make, name, causal):
    """Every variant captured its post-mask softmax weights (Synthesizer Figure 2), and they are exact:
    rows sum to 1 over allowed keys, masked keys get 0, weights @ V through the value and output
    projections is the output, and capturing does not change the output."""
    if causal and name not in CAUSAL:
        pytest.skip("no causal form")
    m = make(name, causal=causal)
    lengths, n = [30, 23], 30
    x = torch.randn(2, n, D_MODEL)
    pad = torch.arange(n)[None] >= torch.tensor(lengths)[:, None]
    normal = m(x, key_padding_mask=pad)
    with capture_attention_weights(m) as captured:
        with_capture = m(x, key_padding_mask=pad)
    assert len(captured) == 1
    capture = captured[0]
    assert capture.available, capture.note
    torch.testing.assert_close(with_capture, normal, atol=1e-5, rtol=1e-5)
    weights, allowed = capture.dense()
    assert weights.shape == (2, HEADS, n, n) and capture.extra_keys == 0
    real_rows = (~pad)[:, None, :, None].expand_as(weights)
    may_see = (~pad)[:, None, None, :].expand_as(weights)  # padding keys are never attended
    if causal:
        may_see = may_see & causal_allowed(n, n)
    assert (weights >= 0).all()
    assert weights[real_rows & ~may_see].abs().max() == 0
    assert weights[real_rows & ~allowed.expand_as(weights)].abs().max() == 0
    sums = (weights * allowed).sum(-1)
    torch.testing.assert_close(sums[real_rows[..., 0]], torch.ones(int(real_rows[..., 0].sum())))
    values = m.split_heads(m.v_proj(x))
    rebuilt = m.out_proj(m.merge_heads(weights @ values))
    torch.testing.assert_close(rebuilt[~pad], normal[~pad], atol=1e-5, rtol=1e-5)
