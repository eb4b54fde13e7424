"""Universal Transformer recurrences ``ut`` and ``ut_act`` (design decisions 10-16,
docs/design_decisions.md#universal-transformer)."""

from __future__ import annotations

import pytest
import torch

from attnlab.models import universal
from attnlab.models.blocks import LayerSpec
from attnlab.models.networks import DecoderLM, EncoderClassifier, EncoderDecoder
from attnlab.models.recurrence import available_recurrences, build_decoder_stack, build_encoder_stack

D, HEADS, FF, VOCAB, PAD = 32, 4, 64, 23, 0


def model_cfg(recurrence: dict, **overrides) -> dict:
    cfg = dict(
        d_model=D,
        num_heads=HEADS,
        d_ff=FF,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation="relu",
        norm_first=False,
        attention={"name": "vanilla"},
        cross_attention="auto",
        recurrence=recurrence,
        encoder_layers=4,
        decoder_layers=4,
        positions="sinusoidal",
        share_embeddings=True,
        tie_output=True,
    )
    cfg.update(overrides)
    return cfg


def spec(**kw) -> LayerSpec:
    base = dict(d_model=D, num_heads=HEADS, d_ff=FF, dropout=0.0, max_len=64)
    base.update(kw)
    return LayerSpec(**base)


def tokens(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (batch, length), generator=g)


def padding(lengths: list[int], total: int) -> torch.Tensor:
    return torch.arange(total)[None, :] >= torch.tensor(lengths)[:, None]


# A negative bias makes p ~ 0.27 at init, so positions take several, differing numbers of steps.
DEEP_ACT = {"name": "ut_act", "act_max_steps": 8, "halting_bias_init": -1.0}


def test_registered_and_options_validated():
    assert {"ut", "ut_act"} <= set(available_recurrences())
    with pytest.raises(ValueError, match="transition"):
        build_encoder_stack({"name": "ut", "transition": "conv"}, spec(), 2)
    with pytest.raises(ValueError, match="halted_state"):
        build_encoder_stack({"name": "ut_act", "halted_state": "freeze"}, spec(), 2)
    with pytest.raises(ValueError, match="num_steps"):
        build_encoder_stack({"name": "ut_act", "num_steps": 3}, spec(), 2)  # ACT has act_max_steps instead
    enc = build_encoder_stack({"name": "ut_act"}, spec(), 3)
    assert enc.num_steps == 6 and enc.threshold == pytest.approx(0.99)  # T2T: 2 x layers, 1 - 0.01
    assert build_encoder_stack({"name": "ut"}, spec(), 3).num_steps == 3
    assert build_encoder_stack({"name": "ut", "num_steps": 5}, spec(), 3).num_steps == 5


def test_halting_arithmetic_invariants():
    torch.manual_seed(0)
    b, n, max_steps = 6, 11, 7
    real = ~padding([11, 9, 5, 11, 1, 7], n)
    zeros = torch.zeros(b, n)
    state = universal.ACTState(zeros, zeros, zeros, ~real)
    total_weight = torch.zeros(b, n)
    for t in range(1, max_steps + 1):
        p = torch.rand(b, n) ** 2  # skewed small so that some positions reach the forced halt
        state, w, running = universal.act_halting_step(p, state, 0.99, force_halt=t == max_steps)
        assert torch.all(w[~running] == 0)
        total_weight += w
    assert torch.allclose(total_weight[real], torch.ones(()), atol=1e-6)
    assert torch.all(total_weight[~real] == 0)
    n_real, r_real = state.n_updates[real], state.remainders[real]
    assert n_real.min() >= 1 and n_real.max() <= max_steps
    assert (n_real == max_steps).any() and (n_real < max_steps).any()
    assert r_real.min() >= 0 and r_real.max() <= 1
    assert torch.all(state.n_updates[~real] == 0) and torch.all(state.remainders[~real] == 0)
    assert state.halted.all()


@pytest.mark.parametrize("transition", ["ffn", "sepconv"])
@pytest.mark.parametrize("halted_state", ["copy", "transform"])
def test_act_encoder_invariants_and_padding(monkeypatch, transition, halted_state):
    torch.manual_seed(1)
    enc = build_encoder_stack(
        dict(DEEP_ACT, transition=transition, halted_state=halted_state), spec(), 4
    ).eval()
    weights = []
    real_step = universal.act_halting_step

    def recording(*args, **kwargs):
        out = real_step(*args, **kwargs)
        weights.append(out[1])
        return out

    monkeypatch.setattr(universal, "act_halting_step", recording)
    x = torch.randn(3, 10, D)
    pad = padding([10, 6, 3], 10)
    x = x.masked_fill(pad[..., None], 0.0)  # the padding embedding is zero
    h, aux = enc(x, pad)
    steps = aux["steps"]
    assert torch.allclose(torch.stack(weights).sum(0)[~pad], torch.ones(()), atol=1e-5)
    assert torch.all(steps[~pad] >= 1) and torch.all(steps[~pad] <= 8) and torch.all(steps[pad] == 0)
    assert len(weights) == int(steps.max())  # no step after the last position halted
    # More padding leaves real positions untouched, sepconv included (padding is zeroed before convolving).
    x_more = torch.cat([x, torch.zeros(3, 5, D)], dim=1)
    h_more, aux_more = enc(x_more, torch.cat([pad, torch.ones(3, 5, dtype=torch.bool)], dim=1))
    assert torch.allclose(h_more[:, :10][~pad], h[~pad], atol=1e-5)
    assert torch.equal(aux_more["steps"][:, :10], steps)
    assert aux["log/ponder_cost"] == pytest.approx(aux["loss/ponder"].item() / 0.01, rel=1e-5)
    assert aux["log/encoder_mean_steps"] == pytest.approx(float(steps[~pad].mean()))


@pytest.mark.parametrize("norm_first", [False, True])
def test_eps_one_halts_after_one_step_and_equals_one_layer(norm_first):
    torch.manual_seed(2)
    s = spec(norm_first=norm_first)
    opts = {"name": "ut_act", "act_epsilon": 1.0, "act_max_steps": 8}
    enc = build_encoder_stack(opts, s, 4).eval()
    dec = build_decoder_stack(opts, s, 4, cross=True).eval()
    x, memory = torch.randn(2, 7, D), torch.randn(2, 5, D)
    coords = universal.sinusoid_table(7, D) + universal.sinusoid_table(1, D, offset=1)  # P^1: t = 1
    h, aux = enc(x)
    assert torch.all(aux["steps"] == 1) and aux["log/ponder_cost"] == pytest.approx(2.0)  # N = 1, R = 1
    assert torch.allclose(h, enc.final_norm(enc.layer(x + coords)), atol=1e-6)
    h, aux = dec(x, memory)
    assert torch.all(aux["steps"] == 1)
    assert torch.allclose(h, dec.final_norm(dec.layer(x + coords, memory)), atol=1e-6)


def test_fixed_ut_is_the_shared_layer_applied_t_times():
    torch.manual_seed(3)
    enc = build_encoder_stack({"name": "ut", "num_steps": 3}, spec(), 6).eval()
    x = torch.randn(2, 5, D)
    expected = x
    for t in (1, 2, 3):
        expected = enc.layer(
            expected + universal.sinusoid_table(5, D) + universal.sinusoid_table(1, D, offset=t)
        )
    assert torch.allclose(enc(x)[0], expected, atol=1e-6)


@pytest.mark.parametrize("num_layers", [2, 6])
def test_ut_shares_one_layer_among_t_steps(num_layers):
    def count(m):
        return sum(p.numel() for p in m.parameters())

    s = spec()
    for cross in (True, False):
        stacked = build_decoder_stack({"name": "stacked"}, s, num_layers, cross=cross)
        ut = build_decoder_stack({"name": "ut"}, s, num_layers, cross=cross)
        assert ut.num_steps == num_layers and count(ut) * num_layers == count(stacked)
    stacked, ut = (
        build_encoder_stack({"name": "stacked"}, s, num_layers),
        build_encoder_stack({"name": "ut"}, s, num_layers),
    )
    assert count(ut) * num_layers == count(stacked)
    # The learned timestep embedding (T2T's default) adds T x d parameters and nothing else.
    learned = build_encoder_stack({"name": "ut", "timestep_embedding": "learned"}, s, num_layers)
    assert count(learned) - count(ut) == num_layers * D


def test_ponder_loss_gradient_reaches_halting_unit():
    torch.manual_seed(4)
    enc = build_encoder_stack(DEEP_ACT, spec(), 4)
    _, aux = enc(torch.randn(2, 6, D), padding([6, 4], 6))
    aux["loss/ponder"].backward()
    assert enc.halting_unit.weight.grad.abs().sum() > 0
    assert enc.halting_unit.bias.grad.abs().sum() > 0


class CountCalls:
    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        module.register_forward_hook(self.hook)

    def hook(self, *_):
        self.calls += 1


@pytest.mark.parametrize("bias, expected_steps", [(20.0, 1), (-20.0, 8)])
def test_loop_exits_when_all_positions_halt(bias, expected_steps):
    torch.manual_seed(5)
    for build in (
        lambda o: build_encoder_stack(o, spec(), 4),
        lambda o: build_decoder_stack(o, spec(), 4, cross=False),
    ):
        stack = build({"name": "ut_act", "act_max_steps": 8, "halting_bias_init": bias}).eval()
        counter = CountCalls(stack.layer)
        _, aux = stack(torch.randn(2, 5, D))
        assert counter.calls == expected_steps
        assert torch.all(aux["steps"] == expected_steps)
        if bias < 0:  # never reached the threshold: halted by force at the cap, R = 1 - sum(p) ~ 1
            assert torch.all(aux["log/ponder_cost"] > expected_steps + 0.99)


def test_loop_length_is_the_largest_step_count():
    torch.manual_seed(6)
    enc = build_encoder_stack(
        {"name": "ut_act", "act_max_steps": 16, "halting_bias_init": -1.0}, spec(), 4
    ).eval()
    counter = CountCalls(enc.layer)
    _, aux = enc(torch.randn(4, 9, D), padding([9, 7, 4, 2], 9))
    assert counter.calls == int(aux["steps"].max()) < 16


def _incremental_equals_full(model: torch.nn.Module, run_full, run_step, length: int):
    full = run_full()
    cache: dict = {}
    steps = torch.cat([run_step(i, cache) for i in range(length)], dim=1)
    assert torch.allclose(steps, full, atol=1e-5), (steps - full).abs().max()
    return cache


RECURRENCES = [
    pytest.param({"name": "stacked"}, False, id="stacked"),
    pytest.param({"name": "ut"}, False, id="ut"),
    pytest.param(
        {"name": "ut", "transition": "sepconv", "timestep_embedding": "learned"},
        True,
        id="ut-sepconv-prenorm",
    ),
    pytest.param(dict(DEEP_ACT), False, id="act-copy"),
    pytest.param(dict(DEEP_ACT, halted_state="transform"), False, id="act-transform"),
    pytest.param(dict(DEEP_ACT, transition="sepconv"), True, id="act-copy-sepconv-prenorm"),
    pytest.param(
        dict(DEEP_ACT, halted_state="transform", transition="sepconv"), False, id="act-transform-sepconv"
    ),
]


@pytest.mark.parametrize("recurrence, norm_first", RECURRENCES)
def test_cached_decoding_equals_full_lm(recurrence, norm_first):
    torch.manual_seed(7)
    model = DecoderLM(
        model_cfg(recurrence, norm_first=norm_first), vocab=VOCAB, pad_id=PAD, max_len=32
    ).eval()
    ids = tokens(2, 9)
    catch_up_steps = 0

    def one_token(i: int, cache: dict) -> torch.Tensor:
        nonlocal catch_up_steps
        filled_before = dict(cache.get("filled", {}))
        logits, aux = model(ids[:, i : i + 1], cache=cache)
        if "decoder/steps" in aux:  # steps at which earlier positions had to be brought up first
            taken = int(aux["decoder/steps"].max())
            catch_up_steps += sum(filled_before.get(t, 0) < i for t in range(1, taken + 1))
        return logits

    with torch.no_grad():
        full, aux = model(ids)
        cache = _incremental_equals_full(model, lambda: full, one_token, 9)
        if recurrence["name"] == "ut_act":
            steps = aux["decoder/steps"]
            assert len(cache["steps"]) == int(steps.max())
            # A later token pondered longer than an earlier one: the catch-up path was exercised.
            assert catch_up_steps > 0
            # A prompt fed in two chunks gives the same logits as the full pass too.
            c2: dict = {}
            first = model(ids[:, :4], cache=c2)[0]
            second = model(ids[:, 4:], cache=c2)[0]
            assert torch.allclose(torch.cat([first, second], 1), full, atol=1e-5)


@pytest.mark.parametrize("recurrence, norm_first", RECURRENCES)
def test_cached_decoding_equals_full_encoder_decoder(recurrence, norm_first):
    torch.manual_seed(8)
    model = EncoderDecoder(
        model_cfg(recurrence, norm_first=norm_first), src_vocab=VOCAB, tgt_vocab=VOCAB, pad_id=PAD, max_len=32
    ).eval()
    src = tokens(3, 8, seed=1)
    src[1, 5:] = PAD
    tgt = tokens(3, 7, seed=2)
    with torch.no_grad():
        memory, memory_padding, _ = model.encode(src)
        full, _ = model.decode(tgt, memory, memory_padding)
        _incremental_equals_full(
            model,
            lambda: full,
            lambda i, c: model.decode(tgt[:, i : i + 1], memory, memory_padding, cache=c)[0],
            7,
        )


@pytest.mark.parametrize("recurrence", [{"name": "ut"}, DEEP_ACT, dict(DEEP_ACT, transition="sepconv")])
def test_networks_train_forward_backward(recurrence):
    torch.manual_seed(9)
    cfg = model_cfg(recurrence, dropout=0.1)
    src, tgt = tokens(2, 6), tokens(2, 5, seed=3)
    src[0, 4:] = PAD
    ed = EncoderDecoder(cfg, src_vocab=VOCAB, tgt_vocab=VOCAB, pad_id=PAD, max_len=32).train()
    logits, aux = ed(src, tgt)
    loss = logits.logsumexp(-1).mean() + sum(v for k, v in aux.items() if k.startswith("loss/"))
    loss.backward()
    assert all(p.grad is not None for p in ed.parameters() if p.requires_grad)
    if recurrence["name"] == "ut_act":
        # Encoder and decoder ponder terms add up; step statistics stay per stack.
        assert torch.allclose(aux["loss/ponder"], aux["encoder/loss/ponder"] + aux["decoder/loss/ponder"])
        assert {"log/encoder_mean_steps", "log/decoder_mean_steps", "encoder/steps", "decoder/steps"} <= set(
            aux
        )
        assert aux["encoder/steps"].shape == src.shape and aux["decoder/steps"].shape == tgt.shape
    lm = DecoderLM(cfg, vocab=VOCAB, pad_id=PAD, max_len=32).train()
    logits, aux = lm(tgt)
    (logits.logsumexp(-1).mean() + sum(v for k, v in aux.items() if k.startswith("loss/"))).backward()
    clf = EncoderClassifier(cfg, vocab=VOCAB, pad_id=PAD, max_len=32, num_classes=3).train()
    out, aux = clf(src)
    (out.sum() + sum(v for k, v in aux.items() if k.startswith("loss/"))).backward()


def test_with_synth_random_attention():
    from attnlab.attention import available

    if "synth_random" not in available():
        pytest.skip("attention variant synth_random is not registered yet (written concurrently)")
    torch.manual_seed(10)
    cfg = model_cfg(DEEP_ACT, attention={"name": "synth_random"})
    model = EncoderDecoder(cfg, src_vocab=VOCAB, tgt_vocab=VOCAB, pad_id=PAD, max_len=16)
    src, tgt = tokens(2, 6), tokens(2, 5, seed=4)
    logits, aux = model(src, tgt)
    (logits.logsumexp(-1).mean() + aux["loss/ponder"]).backward()
    model.eval()
    with torch.no_grad():
        memory, memory_padding, _ = model.encode(src)
        full, _ = model.decode(tgt, memory, memory_padding)
        _incremental_equals_full(
            model,
            lambda: full,
            lambda i, c: model.decode(tgt[:, i : i + 1], memory, memory_padding, cache=c)[0],
            5,
        )


@pytest.mark.slow  # compiling: ~65 s on two CPU cores with a cold inductor cache (~17 s warm)
def test_torch_compile_forward_backward():
    # The data-dependent "any position still running?" test is a graph break, which must not crash.
    torch.manual_seed(11)
    enc = build_encoder_stack(DEEP_ACT, LayerSpec(d_model=16, num_heads=2, d_ff=32, dropout=0.0), 2)
    compiled = torch.compile(enc)
    x = torch.randn(2, 5, 16)
    h, aux = compiled(x, padding([5, 3], 5))
    (h.sum() + aux["loss/ponder"]).backward()
    assert enc.halting_unit.weight.grad is not None
    eager_h, _ = enc(x, padding([5, 3], 5))
    assert torch.allclose(h, eager_h, atol=1e-5)


@torch.no_grad()
def _act_reference(enc, x, pad, *, copy: bool):
    """ACT as listed in the UT paper / Graves (2016), written position by position in float64, with the
    stack's own layer, halting unit and coordinate signals: returns (output, N, R)."""
    b, n, _ = x.shape
    eps, max_steps = 1.0 - enc.threshold, enc.num_steps
    x = x.double()
    layer = enc.layer.double()
    unit = enc.halting_unit.double()
    positions = enc.coordinates.positions(n, 0, x).double()
    total = [[0.0] * n for _ in range(b)]  # sum of p
    steps = [[0] * n for _ in range(b)]
    remainder = [[0.0] * n for _ in range(b)]
    halted = [[bool(pad[i, j]) for j in range(n)] for i in range(b)]
    state, output = x.clone(), torch.zeros_like(x)
    for t in range(1, max_steps + 1):
        if all(all(row) for row in halted):
            break
        state_in = state + positions + enc.coordinates.timestep(t).double()
        p = torch.sigmoid(unit(state_in)).squeeze(-1)
        new = layer(state_in, pad)
        for i in range(b):
            for j in range(n):
                if halted[i][j]:
                    continue  # a halted position keeps its output (and, with copy, its state)
                steps[i][j] += 1
                if t == max_steps or total[i][j] + float(p[i, j]) > 1.0 - eps:
                    weight = remainder[i][j] = 1.0 - total[i][j]
                    halted[i][j] = True
                else:
                    weight = float(p[i, j])
                    total[i][j] += weight
                output[i, j] = weight * new[i, j] + (1.0 - weight) * output[i, j]
                if copy:
                    state[i, j] = new[i, j]
        if not copy:
            state = new  # T2T: every position keeps being transformed
    enc.float()
    return output, torch.tensor(steps, dtype=torch.float64), torch.tensor(remainder, dtype=torch.float64)


@pytest.mark.parametrize("halted_state", ["copy", "transform"])
def test_act_encoder_follows_the_paper_listing(halted_state):
    # Independent reference (Graves 2016 / UT paper's ACT listing): outputs, N, R and the ponder cost, with
    # padding, positions halting at different steps and a forced halt at the cap. Catches `copy` behaving
    # like `transform` (or the reverse) and a ponder mean taken over padding positions.
    torch.manual_seed(11)
    enc = build_encoder_stack(dict(DEEP_ACT, act_max_steps=5, halted_state=halted_state), spec(), 4).eval()
    x = torch.randn(3, 9, D)
    pad = padding([9, 6, 2], 9)
    h, aux = enc(x, pad)
    ref, n_ref, r_ref = _act_reference(enc, x, pad, copy=halted_state == "copy")
    other, _, _ = _act_reference(enc, x, pad, copy=halted_state != "copy")
    real = ~pad
    assert len(set(n_ref[real].tolist())) >= 3  # halting at several different steps, so copy != transform
    assert (n_ref[real] == enc.num_steps).any()  # and some positions forced to halt at the cap
    assert (other[real] - ref[real]).abs().max() > 1e-3  # the two readings differ on this input
    torch.testing.assert_close(h[real].double(), ref[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(aux["steps"].double(), n_ref)
    # mean over real tokens only (design decision 13, docs/design_decisions.md#universal-transformer)
    ponder = float((n_ref + r_ref)[real].mean())
    assert float(aux["log/ponder_cost"]) == pytest.approx(ponder, rel=1e-5)
    assert float(aux["loss/ponder"].detach()) == pytest.approx(0.01 * ponder, rel=1e-5)


def test_act_halting_is_float32_under_bf16_autocast():
    # p = 0.4951 per step halts at step 2 (0.9902 > 0.99, R = 0.5049). Rounded to bf16, p becomes 0.49414
    # and 2p = 0.98828 < 0.99: one more step. The halting unit and bookkeeping must stay in float32.
    torch.manual_seed(12)
    enc = build_encoder_stack({"name": "ut_act", "act_max_steps": 8}, spec(), 4).eval()
    with torch.no_grad():
        enc.halting_unit.weight.zero_()
        enc.halting_unit.bias.fill_(torch.logit(torch.tensor(0.4951, dtype=torch.float64)).item())
    x = torch.randn(2, 5, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h, aux = enc(x)
    assert torch.all(aux["steps"] == 2)
    assert float(aux["log/ponder_cost"]) == pytest.approx(2 + (1 - 0.4951), abs=1e-5)
    assert h.dtype == torch.float32


def test_a_zero_halting_weight_lets_the_bias_alone_set_the_starting_depth():
    """``halting_weight_init: zeros``: p = sigmoid(b) at every position at initialisation, so a bias b0 with
    (M/2 - 1) p0 <= 1 - eps < (M/2) p0 halts every position after exactly M/2 steps (probes/ut2's deep-start ACT
    row); with the default weight, W s moves the starting depth, and the gradient reaches W from zero too."""
    p0 = 0.99 / 5.5  # M = 12: halts at 6
    b0 = float(torch.logit(torch.tensor(p0, dtype=torch.float64)))
    x = torch.randn(3, 10, D, generator=torch.Generator().manual_seed(0)) * 4.0
    with pytest.raises(ValueError, match="halting_weight_init"):
        build_encoder_stack({"name": "ut_act", "halting_weight_init": "small"}, spec(), 2)
    options = {"name": "ut_act", "act_max_steps": 12, "halting_bias_init": b0}
    torch.manual_seed(0)
    enc = build_encoder_stack({**options, "halting_weight_init": "zeros"}, spec(), 2)
    assert torch.equal(enc.halting_unit.weight, torch.zeros_like(enc.halting_unit.weight))
    out, aux = enc(x)
    assert torch.equal(aux["steps"], torch.full((3, 10), 6.0))
    (out.square().mean() + aux["loss/ponder"]).backward()
    assert enc.halting_unit.weight.grad.abs().sum() > 0, "W starts at zero but still learns"
    torch.manual_seed(0)
    _, default_aux = build_encoder_stack(options, spec(), 2)(x)
    assert not torch.equal(default_aux["steps"], torch.full((3, 10), 6.0)), "the default W moves the depth"
