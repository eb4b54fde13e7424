"""BigBird's Triton block-sparse kernel equals the reference in value and gradient (issue 50).

On a machine without CUDA these run the kernels in Triton's interpreter (``TRITON_INTERPRET=1``, set by
tests/conftest.py before triton is imported), at small sizes: blocks of 16 (``tl.dot``'s smallest), 2-4
heads of 16-32, 8-10 blocks. Two references: ``blocksparse_attention`` (the plan's own reference) and dense
attention under the element mask ``bigbird_reference_allowed`` written out from the plan, which shares no
code with either kernel's lists, so a wrong list, a missing global column or a causal off-by-one shows.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")

from attnlab.attention import build_attention  # noqa: E402
from attnlab.attention.bigbird import bigbird_reference_allowed, build_bigbird_plan, draw_random_blocks  # noqa: E402
from attnlab.attention.kernels import blocksparse_triton as bt  # noqa: E402
from attnlab.attention.kernels.blocksparse_reference import BlockSparsePlan, blocksparse_attention  # noqa: E402

if bt.triton_unavailable(torch.device("cuda" if torch.cuda.is_available() else "cpu")):
    pytest.skip("no CUDA and no Triton interpreter", allow_module_level=True)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BLOCK = 16


def bigbird_plan(num_blocks, *, heads=2, causal=False, globals_=2, window=3, random=1, seed=1):
    randoms = draw_random_blocks(num_blocks, heads=heads, window_blocks=window, num_global_blocks=globals_,
                                 num_random_blocks=random, causal=causal,
                                 generator=torch.Generator().manual_seed(seed))
    return build_bigbird_plan(randoms, num_blocks, block_size=BLOCK, window_blocks=window,
                              num_global_blocks=globals_, causal=causal).to(DEVICE)


def inputs(batch, heads, length, head_dim, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, length, head_dim, generator=g).to(DEVICE, dtype).requires_grad_()
            for _ in range(3)]


def dense_masked(q, k, v, plan: BlockSparsePlan, lengths=None, causal_shift=0):
    """Dense fp32 attention under the plan's element mask (and key lengths): the independent reference.
    ``causal_shift`` 1 lets a causal query see one key of its future (an off-by-one mask)."""
    length = q.shape[2]
    allowed = bigbird_reference_allowed(plan, length)[None]  # (1, P, L, L)
    if causal_shift:
        blocks = plan.block_mask().repeat_interleave(BLOCK, 1).repeat_interleave(BLOCK, 2)
        allowed = (blocks & torch.ones(length, length, dtype=torch.bool, device=q.device).tril(causal_shift))[None]
    if lengths is not None:
        allowed = allowed & (torch.arange(length, device=q.device) < lengths[:, None, None, None])
    s = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) * q.shape[-1] ** -0.5
    p = torch.softmax(s.masked_fill(~allowed, -math.inf), dim=-1)
    return torch.einsum("bhqk,bhkd->bhqd", p, v.float())


def value_and_grads(fn, q, k, v, grad_out, **kw):
    out = fn(q, k, v, **kw)
    return [out.detach().float(), *(g.float() for g in torch.autograd.grad(out, (q, k, v), grad_out))]


def assert_equal_in_value_and_grad(got, expected, atol=2e-5, what=""):
    for name, a, b in zip(("output", "dQ", "dK", "dV"), got, expected):
        torch.testing.assert_close(a, b, atol=atol, rtol=atol, msg=lambda m, n=name: f"{what} {n}: {m}")


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_per_head_plans_equal_both_references_in_value_and_gradient(causal):
    plan = bigbird_plan(8, heads=2, causal=causal)
    assert plan.plan_heads == 2 and (causal or plan.dense_rows.numel() == 2)
    q, k, v = inputs(1, 2, 8 * BLOCK, 32)
    grad_out = torch.randn_like(q)
    got = value_and_grads(bt.triton_blocksparse_attention, q, k, v, grad_out, plan=plan)
    assert_equal_in_value_and_grad(got, value_and_grads(blocksparse_attention, q, k, v, grad_out, plan=plan))
    assert_equal_in_value_and_grad(got, value_and_grads(dense_masked, q, k, v, grad_out, plan=plan))


def test_one_plan_shared_by_every_head_serves_them_all():
    plan = bigbird_plan(8, heads=1, random=2, seed=3)
    q, k, v = inputs(1, 3, 8 * BLOCK, 16, seed=1)
    grad_out = torch.randn_like(q)
    got = value_and_grads(bt.triton_blocksparse_attention, q, k, v, grad_out, plan=plan)
    assert_equal_in_value_and_grad(got, value_and_grads(dense_masked, q, k, v, grad_out, plan=plan))


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_padded_lengths_mask_keys_and_real_rows_match(causal):
    """Per-sequence lengths (one mid-block, one at a block edge); padded query rows are outside the contract
    (their output gradient is zero, as the model's slicing makes it)."""
    plan = bigbird_plan(8, heads=2, causal=causal, seed=4)
    length = 8 * BLOCK
    lengths = torch.tensor([length - 21, length - BLOCK], device=DEVICE)
    pad = torch.arange(length, device=DEVICE)[None] >= lengths[:, None]
    q, k, v = inputs(2, 2, length, 16, seed=2)
    grad_out = torch.randn_like(q).masked_fill(pad[:, None, :, None], 0)
    got = value_and_grads(bt.triton_blocksparse_attention, q, k, v, grad_out, plan=plan, lengths=lengths)
    expected = value_and_grads(blocksparse_attention, q, k, v, grad_out, plan=plan, key_padding_mask=pad)
    real = ~pad[:, None, :, None]
    got[0], expected[0] = got[0] * real, expected[0] * real
    assert_equal_in_value_and_grad(got, expected)
    assert bt.lengths_from_padding(pad, 2, length, DEVICE).tolist() == lengths.tolist()
    left = pad.clone()
    left[0, 0] = True  # padding before a real key: not a suffix, the kernel cannot express it
    assert bt.lengths_from_padding(left, 2, length, DEVICE) is None


@pytest.mark.parametrize(("causal", "length"), [(False, 97), (True, 131)], ids=["bidirectional", "causal"])
def test_module_at_odd_lengths_equals_the_reference_module(causal, length):
    """Through BigBirdAttention (impl=triton): lengths that are not a multiple of the block, a padding mask on
    one sequence, the module's own per-head plans; input gradients and parameter gradients."""
    kw = dict(d_model=64, num_heads=2, max_len=160, block_size=BLOCK, num_random_blocks=1, causal=causal,
              dense_fallback_len=0)
    torch.manual_seed(0)
    triton_module = build_attention("bigbird", impl="triton", **kw).to(DEVICE).train()
    reference = build_attention("bigbird", impl="reference", **kw).to(DEVICE).train()
    reference.load_state_dict(triton_module.state_dict())
    x = torch.randn(2, length, 64, device=DEVICE, requires_grad=True)
    pad = torch.zeros(2, length, dtype=torch.bool, device=DEVICE)
    pad[1, length - 10:] = True
    outs = []
    for module in (triton_module, reference):
        out = module(x, key_padding_mask=pad)
        (out * ~pad[..., None]).square().sum().backward()
        outs.append((out[~pad].detach(), x.grad.clone(), module.q_proj.weight.grad.clone()))
        x.grad = None
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=5e-5)
    assert triton_module.kernels_used == {"triton"}


def test_long_global_rows_and_columns_are_split_over_several_items():
    """With 10 blocks and sparse rows of 4 blocks, the two dense rows and the global key columns each need
    several items; their merge (log-sum-exp, sum) is exact."""
    plan = bigbird_plan(10, heads=2, globals_=2, window=1, random=1, seed=5)
    layout = bt.layout_for(plan)
    assert layout.seg == 4
    assert layout.forward.multi_blocks.tolist() == plan.dense_rows.tolist()
    assert set(plan.dense_rows.tolist()) <= set(layout.transposed.multi_blocks.tolist())
    q, k, v = inputs(1, 2, 10 * BLOCK, 16, seed=3)
    grad_out = torch.randn_like(q)
    got = value_and_grads(bt.triton_blocksparse_attention, q, k, v, grad_out, plan=plan)
    assert_equal_in_value_and_grad(got, value_and_grads(dense_masked, q, k, v, grad_out, plan=plan))


def test_work_lists_match_a_loop_over_the_incidence():
    """Independent construction: every (head, output block) lists exactly its inputs, in order, across its items."""
    g = torch.Generator().manual_seed(0)
    incidence = torch.rand(3, 7, 9, generator=g) < 0.4
    incidence[:, 2] = True  # a long row: split
    incidence[1, 4] = False  # an empty row in one head only
    work = bt.work_list(incidence, seg=3)
    for p in range(3):
        for block in range(7):
            items = [i for i in range(work.item_block.numel()) if work.item_block[i] == block]
            listed = [int(x) for i in items for x in work.lists[p, i, : work.counts[p, i]]]
            assert listed == torch.nonzero(incidence[p, block]).flatten().tolist()
    long_rows = [o for o in range(7) if int(incidence[:, o].sum(1).max()) > 3]
    assert 2 in long_rows and work.multi_blocks.tolist() == long_rows


@pytest.mark.parametrize("mutation", ["drop_global_column", "causal_off_by_one", "other_plan"])
def test_the_comparison_catches_a_wrong_plan(mutation):
    """The references are sharp enough: a kernel run over a plan missing one global key column, a causal mask
    shifted by one position, or another random draw differs from the reference of the true plan."""
    causal = mutation == "causal_off_by_one"  # compared with a reference whose mask is shifted by one
    plan = bigbird_plan(8, heads=2, causal=causal, seed=6)
    wrong = plan
    if mutation == "drop_global_column":
        keep = plan.key_valid & (plan.key_blocks != 0)
        wrong = BlockSparsePlan(BLOCK, 8, False, plan.row_blocks, plan.key_blocks, keep, plan.dense_rows)
    elif mutation == "other_plan":
        wrong = bigbird_plan(8, heads=2, seed=7)
    q, k, v = inputs(1, 2, 8 * BLOCK, 16, seed=4)
    grad_out = torch.randn_like(q)
    got = value_and_grads(bt.triton_blocksparse_attention, q, k, v, grad_out, plan=wrong)
    expected = value_and_grads(dense_masked, q, k, v, grad_out, plan=plan, causal_shift=int(causal))
    assert max(float((a - b).abs().max()) for a, b in zip(got, expected)) > 1e-2


def test_bf16_stays_within_tolerance_of_the_fp32_reference():
    """bf16 inputs, fp32 softmax and accumulation: output and gradients within 2e-2 of fp32 (the inputs'
    rounding alone moves them by about 1e-2)."""
    plan = bigbird_plan(8, heads=2, seed=8)
    q, k, v = inputs(1, 2, 8 * BLOCK, 32, seed=5)
    grad_out = torch.randn_like(q)
    expected = value_and_grads(dense_masked, q, k, v, grad_out, plan=plan)
    low = [t.detach().to(torch.bfloat16).requires_grad_() for t in (q, k, v)]
    got = value_and_grads(bt.triton_blocksparse_attention, *low, grad_out.to(torch.bfloat16), plan=plan)
    assert got[0].dtype == torch.float32 and low[0].dtype == torch.bfloat16
    for name, a, b in zip(("output", "dQ", "dK", "dV"), got, expected):
        scale = max(1.0, float(b.abs().max()))
        assert float((a - b).abs().max()) <= 3e-2 * scale, name


def test_custom_op_is_opaque_to_dynamo_and_counts_the_plan_flops():
    """fullgraph compile (no graph break once the plan's layout exists), the fake kernel's shapes, and the FLOP
    formula: 4 * B * tiles * block^2 * D forward, 2.5 times that backward, tiles counted from the plan."""
    from torch.utils.flop_counter import FlopCounterMode

    plan = bigbird_plan(6, heads=2, causal=True, seed=9)
    q, k, v = inputs(1, 2, 6 * BLOCK, 16, seed=6)
    bt.layout_for(plan)  # a layout is built outside the graph (a graph break the first time), then a constant
    compiled = torch.compile(lambda q, k, v: bt.triton_blocksparse_attention(q, k, v, plan), fullgraph=True,
                             backend="aot_eager")
    out = compiled(q, k, v)
    torch.testing.assert_close(out, blocksparse_attention(q, k, v, plan), atol=2e-5, rtol=2e-5)
    tiles = int((plan.block_mask() & torch.ones(6, 6, dtype=torch.bool, device=DEVICE).tril()).sum())
    with FlopCounterMode(display=False) as counter:
        out = bt.triton_blocksparse_attention(q, k, v, plan)
        out.sum().backward()
    forward = 4 * 1 * tiles * BLOCK * BLOCK * 16
    counts = counter.get_flop_counts()["Global"]
    assert counts[torch.ops.attnlab.blocksparse_flash] == forward
    assert counts[torch.ops.attnlab.blocksparse_flash_backward] == 2.5 * forward
    torch.library.opcheck(torch.ops.attnlab.blocksparse_flash.default, (
        q.detach(), k.detach(), v.detach(), torch.full((1,), 6 * BLOCK, dtype=torch.int32),
        bt.layout_for(plan).forward.tensors(), bt.layout_for(plan).transposed.tensors(), 0.25, True, BLOCK,
        bt.layout_for(plan).seg, tiles), test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("kernel", ["correct", "wrong_values"])
def test_auto_uses_triton_after_its_self_test_and_the_record_names_it(kernel, monkeypatch, caplog):
    """impl=auto with the CPU treated as a Triton device: the kernel serves after its self-test passed at the
    run's shape (once), a kernel that disagrees with the reference is passed over with its reason, and the run
    record's ``attention_kernels`` names the kernel that ran."""
    import logging
    from types import SimpleNamespace

    import attnlab.attention.bigbird as bigbird
    from attnlab.training.record_writers import attention_kernels

    monkeypatch.setattr(bigbird, "TRITON_AUTO_DEVICES", ("cuda", DEVICE.type))
    monkeypatch.setattr(bigbird, "TRITON_SELF_TESTS", {})
    if kernel == "wrong_values":
        monkeypatch.setattr(bigbird, "triton_blocksparse_attention",
                            lambda *a, **kw: 1.1 * bt.triton_blocksparse_attention(*a, **kw))
    torch.manual_seed(0)
    module = build_attention("bigbird", d_model=32, num_heads=2, max_len=64, block_size=BLOCK, num_random_blocks=1,
                             dense_fallback_len=0).to(DEVICE).train()
    x = torch.randn(1, 40, 32, device=DEVICE, requires_grad=True)
    with caplog.at_level(logging.INFO, logger="attnlab.attention.bigbird"):
        module(x).sum().backward()
        module(x).sum().backward()  # the same shape: no second self-test
    lines = [r.getMessage() for r in caplog.records if "impl=auto" in r.getMessage()]
    assert len(lines) == 1 and len(bigbird.TRITON_SELF_TESTS) == 1, lines
    expected = "triton" if kernel == "correct" else "blocked"
    assert module.kernels_used == {expected}
    assert ("self-test passed" in lines[0]) == (kernel == "correct")
    if kernel == "wrong_values":
        assert "triton kernel" in lines[0] and "output differs from the reference" in lines[0]
    assert attention_kernels(SimpleNamespace(model=torch.nn.Sequential(module))) == {"attention_kernels": [expected]}


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_at_the_paper_block_equals_the_reference(causal, dtype):
    """The compiled kernel on a GPU: blocks of 64, 12 heads of 64, per-head plans with 3 random blocks, 2048
    tokens (32 blocks: split global rows and columns), padded lengths; fp32 within 1e-4 (TF32 off, see
    tests/conftest.py), bf16 within 3e-2 of the fp32 reference."""
    cuda = torch.device("cuda")
    randoms = draw_random_blocks(32, heads=12, window_blocks=3, num_global_blocks=2, num_random_blocks=3,
                                 causal=causal, generator=torch.Generator().manual_seed(0))
    plan = build_bigbird_plan(randoms, 32, block_size=64, window_blocks=3, num_global_blocks=2,
                              causal=causal).to(cuda)
    g = torch.Generator().manual_seed(1)
    q, k, v, grad_out = (torch.randn(2, 12, 2048, 64, generator=g).to(cuda) for _ in range(4))
    lengths = torch.tensor([2048, 2000], device=cuda)
    pad = torch.arange(2048, device=cuda)[None] >= lengths[:, None]
    grad_out = grad_out.masked_fill(pad[:, None, :, None], 0)
    fp32 = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = value_and_grads(blocksparse_attention, *fp32, grad_out, plan=plan, key_padding_mask=pad)
    low = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    got = value_and_grads(bt.triton_blocksparse_attention, *low, grad_out.to(dtype), plan=plan, lengths=lengths)
    real = ~pad[:, None, :, None]
    got[0], expected[0] = got[0] * real, expected[0] * real
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    for name, a, b in zip(("output", "dQ", "dK", "dV"), got, expected):
        assert float((a - b).abs().max()) <= tolerance * max(1.0, float(b.abs().max())), name
