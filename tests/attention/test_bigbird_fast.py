"""BigBird fast kernels (blocked CPU path, FlexAttention) equal the reference in value and gradient."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import AttentionError, build_attention
from attnlab.attention.kernels.blocksparse_blocked import blocked_blocksparse_attention
from attnlab.attention.kernels.blocksparse_flex import flex_blocksparse_attention
from attnlab.attention.kernels.blocksparse_reference import blocksparse_attention

from .conftest import D_MODEL, HEADS
from .test_bigbird import _LargestTensor


def _plan(causal, length, block_size=4, max_len=64, heads=HEADS, **options):
    """A per-head plan (one random plan per head) of a module with ``heads`` heads."""
    m = build_attention("bigbird", d_model=D_MODEL, num_heads=heads, max_len=max_len, causal=causal,
                        block_size=block_size, num_random_blocks=options.pop("num_random_blocks", 1),
                        dense_fallback_len=0, **options)
    return m.plan_for_length(length)


def _inputs(b, h, length, d, dtype, extra, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, length, d, dtype=dtype, generator=g, requires_grad=True) for _ in range(3))
    ek = ev = None
    if extra:
        ek, ev = (torch.randn(h, extra, d, dtype=dtype, generator=g, requires_grad=True) for _ in range(2))
    return q, k, v, ek, ev


def _padding(b, length, *, left=0):
    """Right padding of 0 and 7 positions; with ``left``, batch row 1 also starts with padding, which
    leaves causal query rows whose keys are all padding (the 'dead row' convention)."""
    lengths = torch.tensor([length, length - 7])[:b]
    pad = torch.arange(length)[None] >= lengths[:, None]
    if left and b > 1:
        pad[1, :left] = True
    return pad


@pytest.mark.parametrize("save_probs", [True, False])
@pytest.mark.parametrize("extra", [0, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_blocked_gradcheck_float64(causal, extra, save_probs):
    length = 16
    plan = _plan(causal, length, block_size=2, heads=1)  # 8 blocks, rows of at most 6: short rows and filler
    q, k, v, ek, ev = _inputs(2, 1, length, 2, torch.float64, extra)
    pad = _padding(2, length, left=3)
    tensors = [t for t in (q, k, v, ek, ev) if t is not None]

    def fn(*ts):
        q_, k_, v_, *rest = ts
        ek_, ev_ = rest if rest else (None, None)
        return blocked_blocksparse_attention(q_, k_, v_, plan, key_padding_mask=pad, extra_k=ek_, extra_v=ev_,
                                             chunk_bytes=128, save_probs=save_probs)

    assert torch.autograd.gradcheck(fn, tensors, eps=1e-6, atol=1e-5, fast_mode=True)


@pytest.mark.parametrize("chunk_bytes", [1 << 10, 1 << 22])
@pytest.mark.parametrize("extra", [0, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_blocked_equals_reference_value_and_gradient_with_padding(causal, extra, chunk_bytes):
    length = 40
    plan = _plan(causal, length)
    ins = _inputs(2, HEADS, length, 8, torch.float64, extra)
    pad = _padding(2, length, left=6)
    tensors = [t for t in ins if t is not None]
    q, k, v, ek, ev = ins
    kw = dict(key_padding_mask=pad, extra_k=ek, extra_v=ev, scale=0.3)
    ref = blocksparse_attention(q, k, v, plan, **kw)
    workers = 3 if chunk_bytes < 1 << 20 else 1  # several chunks over 3 worker threads, or one in-thread
    out = blocked_blocksparse_attention(q, k, v, plan, chunk_bytes=chunk_bytes, workers=workers, **kw)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)  # padded rows included
    grad_out = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(ref, tensors, grad_out), torch.autograd.grad(out, tensors, grad_out)):
        torch.testing.assert_close(b, a, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_blocked_equals_reference_at_paper_sizes_float32(causal):
    """Paper configuration (block 64, window 3, 2 global, 3 random) at L=768, head dim 64, with padding."""
    length = 768
    plan = _plan(causal, length, block_size=64, max_len=length, num_random_blocks=3, heads=2)
    assert plan.key_blocks.shape[1:] == (12, 8) if causal else (10, 8)
    q, k, v, _, _ = _inputs(2, 2, length, 64, torch.float32, 0)
    pad = _padding(2, length)
    ref = blocksparse_attention(q, k, v, plan, key_padding_mask=pad)
    out = blocked_blocksparse_attention(q, k, v, plan, key_padding_mask=pad)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    grad_out = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(ref, (q, k, v), grad_out), torch.autograd.grad(out, (q, k, v), grad_out)):
        torch.testing.assert_close(b, a, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_module_impls_agree_in_training_with_padding(causal):
    """The whole layer (projections, padding to blocks, unpadding) with impl=reference vs blocked."""
    torch.manual_seed(0)
    kw = dict(d_model=D_MODEL, num_heads=HEADS, max_len=64, causal=causal, block_size=4, num_random_blocks=1,
              dense_fallback_len=0)
    ref = build_attention("bigbird", impl="reference", **kw).train()
    fast = build_attention("bigbird", impl="blocked", **kw).train()
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(2, 37, D_MODEL)
    pad = torch.arange(37)[None] >= torch.tensor([37, 30])[:, None]
    y_ref, y_fast = ref(x, key_padding_mask=pad), fast(x, key_padding_mask=pad)
    torch.testing.assert_close(y_fast, y_ref, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(y_ref)
    y_ref.backward(g)
    y_fast.backward(g)
    for (name, a), b in zip(ref.named_parameters(), fast.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("causal", [False, True])
def test_blocked_training_step_never_materialises_a_length_squared_tensor(causal):
    length = 512
    plan = _plan(causal, length, block_size=8, max_len=length, heads=2)
    q, k, v, _, _ = _inputs(1, 2, length, 8, torch.float32, 0)
    with _LargestTensor() as probe:
        out = blocked_blocksparse_attention(q, k, v, plan)
        out.sum().backward()
    assert probe.largest < length * length


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_flex_block_mask_equals_reference(causal, padded):
    """Eager (uncompiled) FlexAttention with the plan's BlockMask; real (non-dead) rows must agree."""
    length = 32
    plan = _plan(causal, length, block_size=16, max_len=length, num_random_blocks=0, num_global_blocks=1,
                 window_blocks=1, heads=2)
    q, k, v = (t.detach() for t in _inputs(2, 2, length, 8, torch.float32, 0)[:3])
    pad = _padding(2, length) if padded else None
    with torch.no_grad():
        ref = blocksparse_attention(q, k, v, plan, key_padding_mask=pad)
        out = flex_blocksparse_attention(q, k, v, plan, key_padding_mask=pad, compiled=False)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_impl_option_routing_and_refusals():
    kw = dict(d_model=D_MODEL, num_heads=HEADS, max_len=64, block_size=4, num_random_blocks=1)
    auto = build_attention("bigbird", **kw)
    assert auto.options.impl == "auto"
    assert auto.kernel_for(torch.device("cpu"), need_grad=True) == "blocked"
    assert auto.kernel_for(torch.device("cpu"), need_grad=False) == "blocked"
    flex = build_attention("bigbird", impl="flex", **kw)
    assert flex.kernel_for(torch.device("cpu"), need_grad=False) == "flex"
    with pytest.raises(AttentionError) as err:
        flex.kernel_for(torch.device("cpu"), need_grad=True)
    assert "\n" not in str(err.value)
    for bad in ({"impl": "cuda"}, {"num_global_tokens": 2}):
        with pytest.raises(AttentionError):
            build_attention("bigbird", **kw, **bad)
    # impl=triton needs tl.dot's shapes (powers of two >= 16): blocks of 4 are refused in one line
    with pytest.raises(AttentionError, match="block_size 4 is not a power of two >= 16") as err:
        build_attention("bigbird", impl="triton", **kw).kernel_for(torch.device("cpu"), need_grad=True)
    assert "\n" not in str(err.value)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_flex_on_cuda_equals_reference_in_value_and_gradient(causal):
    dev = torch.device("cuda")
    length = 1024
    plan = _plan(causal, length, block_size=64, max_len=length, num_random_blocks=3).to(dev)
    q, k, v = (t.detach().to(dev).requires_grad_() for t in _inputs(1, 4, length, 64, torch.float32, 0)[:3])
    ref = blocksparse_attention(q, k, v, plan)
    out = flex_blocksparse_attention(q, k, v, plan)
    torch.testing.assert_close(out, ref, atol=1e-3, rtol=1e-3)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(ref, (q, k, v), g), torch.autograd.grad(out, (q, k, v), g)):
        torch.testing.assert_close(b, a, atol=2e-3, rtol=2e-3)


def _flex_and_reference(max_len=512):
    kw = dict(d_model=128, num_heads=2, max_len=max_len, block_size=64, num_random_blocks=2, dense_fallback_len=0)
    torch.manual_seed(0)
    flex = build_attention("bigbird", impl="flex", **kw).eval()
    ref = build_attention("bigbird", impl="reference", **kw).eval()
    ref.load_state_dict(flex.state_dict())
    return flex, ref


@pytest.mark.slow
def test_compiled_flex_module_equals_reference_over_length_buckets():
    """The compiled path (CPU forward) with per-head plans, at lengths of two buckets, with padding: it
    follows the sparse plan (a dense BlockMask would differ from the reference by far more than 1e-4)."""
    from attnlab.attention.kernels.blocksparse_flex import flex_bucket

    flex, ref = _flex_and_reference()
    assert flex_bucket(3, 8) == 4 and flex_bucket(5, 8) == 8 and flex_bucket(8, 8) == 8
    for length in (130, 450):
        x = torch.randn(2, length, 128)
        pad = torch.arange(length)[None] >= torch.tensor([length, length - 50])[:, None]
        with torch.no_grad():
            torch.testing.assert_close(flex(x, key_padding_mask=pad)[~pad], ref(x, key_padding_mask=pad)[~pad],
                                       atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_flex_past_the_recompile_limit_logs_once_and_stays_sparse(caplog, monkeypatch):
    """Issue 13.5: once dynamo would fall back to the unfused L x L kernel, the module logs one warning and
    serves the call with the blocked kernel, still equal to the reference."""
    import logging

    from attnlab.attention.kernels import blocksparse_flex

    monkeypatch.setattr(blocksparse_flex, "_FALLEN_BACK", set())
    torch._dynamo.reset()
    blocksparse_flex._compiled.cache_clear()
    flex, ref = _flex_and_reference()
    with torch._dynamo.config.patch(recompile_limit=1), caplog.at_level(logging.WARNING), torch.no_grad():
        for length in (130, 450, 300, 450):
            x = torch.randn(1, length, 128)
            torch.testing.assert_close(flex(x), ref(x), atol=1e-4, rtol=1e-4)
    warnings = [r for r in caplog.records if "recompile limit" in r.getMessage()]
    assert len(warnings) == 1
    torch._dynamo.reset()
    blocksparse_flex._compiled.cache_clear()


def _auto_on_cpu(monkeypatch, flex_kernel):
    """``impl=auto`` with the CPU treated as a FlexAttention device and ``flex_kernel`` as its kernel, so the
    self-test's decisions are exercised without a GPU."""
    import attnlab.attention.bigbird as bigbird

    monkeypatch.setattr(bigbird, "FLEX_AUTO_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(bigbird, "flex_available", lambda device, need_grad: True)
    monkeypatch.setattr(bigbird, "flex_blocksparse_attention", flex_kernel)
    monkeypatch.setattr(bigbird, "FLEX_SELF_TESTS", {})
    kw = dict(d_model=D_MODEL, num_heads=HEADS, max_len=64, block_size=4, num_random_blocks=1, dense_fallback_len=0)
    torch.manual_seed(0)
    return build_attention("bigbird", **kw)


def _failing_backward(q, k, v, plan, **kw):
    class NoBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise RuntimeError("NoValidChoicesError: no valid backward tile for Q_BLOCK_SIZE=64\nmore detail")

    return NoBackward.apply(blocksparse_attention(q, k, v, plan, **kw))


@pytest.mark.parametrize(("kernel", "verdict"), [
    ("correct", "flex"), ("crashes_in_backward", "blocked"), ("wrong_values", "blocked")])
def test_auto_uses_flex_only_after_its_self_test_passes_at_the_run_shape(kernel, verdict, monkeypatch, caplog):
    """Issue 42.5: a FlexAttention backward that cannot compile used to fail inside loss.backward(), where no
    fallback could catch it; impl=auto now runs forward + backward once per shape and logs its choice."""
    import logging

    import attnlab.attention.bigbird as bigbird

    fakes = {"correct": blocksparse_attention, "crashes_in_backward": _failing_backward,
             "wrong_values": lambda q, k, v, plan, **kw: 1.1 * blocksparse_attention(q, k, v, plan, **kw)}
    module = _auto_on_cpu(monkeypatch, fakes[kernel]).train()
    reference = build_attention("bigbird", impl="reference", d_model=D_MODEL, num_heads=HEADS, max_len=64,
                                block_size=4, num_random_blocks=1, dense_fallback_len=0).train()
    reference.load_state_dict(module.state_dict())
    x = torch.randn(2, 30, D_MODEL, requires_grad=True)
    with caplog.at_level(logging.INFO, logger="attnlab.attention.bigbird"):
        assert module.kernel_for(torch.device("cpu"), True, dtype=torch.float32, length=30, padded=False) == verdict
        out = module(x)  # the same shape again: no second self-test, and the chosen kernel serves it
        out.sum().backward()
    lines = [r.getMessage() for r in caplog.records if "impl=auto" in r.getMessage()]
    assert len(lines) == 1 and len(bigbird.FLEX_SELF_TESTS) == 1, lines
    assert ("self-test passed" in lines[0]) == (verdict == "flex")
    if kernel == "crashes_in_backward":
        assert "NoValidChoicesError" in lines[0] and "more detail" not in lines[0]
    if kernel == "wrong_values":
        assert "output differs from the reference" in lines[0]
    torch.testing.assert_close(out, reference(x), atol=1e-5, rtol=1e-5)
    # a forward-only call is another shape: tested on its own (the crashing backward is not needed there)
    with torch.no_grad():
        forward_only = module.kernel_for(torch.device("cpu"), False, dtype=torch.float32, length=30, padded=False)
    assert forward_only == ("blocked" if kernel == "wrong_values" else "flex")


@pytest.mark.slow
def test_auto_falls_back_when_compiled_flex_has_no_backward_on_this_device(monkeypatch):
    """The real failure, on CPU: torch's compiled FlexAttention has no CPU backward."""
    module = _auto_on_cpu(monkeypatch, flex_blocksparse_attention)
    assert module.kernel_for(torch.device("cpu"), True, dtype=torch.float32, length=64, padded=True) == "blocked"


@pytest.mark.gpu
@pytest.mark.parametrize("length", [512, 1500, 2048, 4096])  # Table 1, an odd length, Table 10's two
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_auto_on_cuda_at_the_paper_block_trains_in_each_dtype_and_equals_the_reference(causal, dtype, length):
    """Blocks of 64 (the paper's), per-head plans, padding, fp32 and bf16, the lengths the presets use:
    ``impl=auto`` must never crash and whichever kernel it picks must match the reference (issue 35: Hopper's
    default flex tiles are 128)."""
    kw = dict(d_model=256, num_heads=4, max_len=4096, block_size=64, num_random_blocks=3, causal=causal,
              dense_fallback_len=0)
    torch.manual_seed(0)
    auto = build_attention("bigbird", **kw).cuda().train()
    reference = build_attention("bigbird", impl="reference", **kw).cuda().train()
    reference.load_state_dict(auto.state_dict())
    x = torch.randn(2, length, 256, device="cuda")
    shorter = length - length // 4
    pad = torch.arange(length, device="cuda")[None] >= torch.tensor([length, shorter], device="cuda")[:, None]
    grads = []
    for module in (auto, reference):
        inputs = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            out = module(inputs, key_padding_mask=pad)
        out.float()[~pad].square().sum().backward()
        grads.append((out.float()[~pad], inputs.grad))
    tolerance = 2e-3 if dtype == torch.float32 else 6e-2
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=tolerance, rtol=tolerance)


def test_blocked_kernel_launch_settings_per_device():
    """Issue 42.6: on CUDA one thread and large chunks (a thread per core and cache-sized chunks meant ~20k
    launches a step); on CPU cache-sized chunks over the intra-op threads, as measured there."""
    from attnlab.attention.kernels import blocksparse_blocked as blocked

    assert blocked.launch_settings(torch.device("cuda"), None, None) == (blocked.CUDA_CHUNK_BYTES, 1)
    assert blocked.launch_settings(torch.device("cpu"), None, None) == (blocked.DEFAULT_CHUNK_BYTES,
                                                                         torch.get_num_threads())
    assert blocked.launch_settings(torch.device("cuda"), 1 << 20, 4) == (1 << 20, 4)  # explicit values win
    assert blocked.CUDA_CHUNK_BYTES >= 64 * blocked.DEFAULT_CHUNK_BYTES


@pytest.mark.parametrize("tile_blocks", [2, 4])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_block_mask_in_kernel_tiles_larger_than_the_plan_block_is_exactly_the_plan(causal, padded, tile_blocks):
    """Issue 35: compiled FlexAttention on Hopper only tiles by 128, BigBird's blocks are 64. A BlockMask of
    2 x 2 (or 4 x 4) plan blocks per tile, full or partial by the plan, must attend exactly the plan's keys,
    also where the sequence (9 blocks) ends mid-tile. Checked against the reference in value and gradient,
    with eager FlexAttention (which evaluates mask_mod everywhere) and with the tile tables themselves."""
    from torch.nn.attention.flex_attention import flex_attention

    from attnlab.attention.kernels.blocksparse_flex import plan_to_block_mask

    bs, length = 4, 36
    plan = _plan(causal, length, block_size=bs, max_len=64, num_random_blocks=2, heads=2)
    q, k, v = _inputs(2, 2, length, 8, torch.float32, 0)[:3]
    pad = _padding(2, length) if padded else None
    mask = plan_to_block_mask(plan, pad, 2, tile=tile_blocks * bs)
    tile_shape = tuple(mask.BLOCK_SIZE)
    assert tile_shape == (tile_blocks * bs, tile_blocks * bs)
    ref = blocksparse_attention(q, k, v, plan, key_padding_mask=pad)
    with torch.no_grad():  # torch has no FlexAttention backward on CPU, eager or compiled
        flex_out = flex_attention(q.detach(), k.detach(), v.detach(), block_mask=mask)
        torch.testing.assert_close(flex_out, ref.detach(), atol=1e-5, rtol=1e-5)
    # What the fused kernel computes: keys of full tiles, keys of partial tiles where mask_mod allows, nothing
    # elsewhere; as a masked dense softmax with autograd, equal to the reference in value and gradient.
    visits = torch.zeros(2, 2, length, length, dtype=torch.bool)
    tiles = mask.to_dense()[0].bool()  # (P, tiles, tiles): partial or full
    full_tiles = torch.zeros_like(tiles)
    for p in range(tiles.shape[0]):
        for row in range(tiles.shape[1]):
            n = int(mask.full_kv_num_blocks[0, p, row])
            full_tiles[p, row, mask.full_kv_indices[0, p, row, :n].long()] = True
    t = tile_blocks * bs
    pos = torch.arange(length)
    for b in range(2):
        for h in range(2):
            p = h if tiles.shape[0] > 1 else 0
            tile_of = tiles[p][pos[:, None] // t, pos[None] // t]
            full_of = full_tiles[p][pos[:, None] // t, pos[None] // t]
            by_mod = mask.mask_mod(torch.tensor(b), torch.tensor(h), pos[:, None], pos[None])
            visits[b, h] = full_of | (tile_of & by_mod)
    scores = (q @ k.transpose(-1, -2)) * 8**-0.5
    real = visits.any(-1)  # rows whose keys are all masked are outside the contract (module doc)
    dense = torch.softmax(scores.masked_fill(~visits, float("-inf")), -1).nan_to_num() @ v
    g = torch.randn_like(ref) * real[..., None]
    torch.testing.assert_close(dense[real], ref[real], atol=1e-5, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(ref, (q, k, v), g), torch.autograd.grad(dense, (q, k, v), g)):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    # The tile tables alone (what the fused kernel visits): every plan block lies in a listed tile, and a
    # "full" tile (no mask_mod) holds plan blocks only, never a block outside the plan or past the sequence.
    dense = mask.to_dense()[0]  # (P, tiles, tiles): 1 where the tile is visited, full or partial
    fine = plan.block_mask()
    f, nb = tile_blocks, plan.num_blocks
    for p in range(fine.shape[0]):
        for i in range(nb):
            for j in range(nb):
                if fine[p, i, j] and not (causal and j > i):
                    assert dense[p, i // f, j // f]
    full = torch.zeros_like(dense, dtype=torch.bool)
    counts, index = mask.full_kv_num_blocks[0], mask.full_kv_indices[0]
    for p in range(full.shape[0]):
        for row in range(full.shape[1]):
            full[p, row, index[p, row, : counts[p, row]].long()] = True
    for p, ti, tj in full.nonzero().tolist():
        blocks = fine[p, ti * f: (ti + 1) * f, tj * f: (tj + 1) * f]
        assert blocks.shape == (f, f) and bool(blocks.all())
        assert not (causal and ti == tj) and pad is None


def test_kernel_tile_is_128_on_cuda_when_it_holds_whole_plan_blocks():
    from attnlab.attention.kernels.blocksparse_flex import kernel_tile

    assert kernel_tile(_plan(False, 128, block_size=64, max_len=128), torch.device("cuda")) == 128
    assert kernel_tile(_plan(False, 96, block_size=32, max_len=96), torch.device("cuda")) == 128
    assert kernel_tile(_plan(False, 96, block_size=48, max_len=96), torch.device("cuda")) == 48  # 128 % 48
    assert kernel_tile(_plan(False, 256, block_size=128, max_len=256), torch.device("cuda")) == 128
    assert kernel_tile(_plan(False, 128, block_size=64, max_len=128), torch.device("cpu")) == 64
