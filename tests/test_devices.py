"""The same training step and the same decoding on another device or precision as on the CPU in fp32.

The ``gpu`` tier (``make test-gpu``, issue 35.2) runs every registered attention variant x {stacked, ut, ut_act}
one training step on CUDA in fp32 and in bf16-mixed against the CPU fp32 step (loss and every gradient), and
greedy and beam decoding with the cache on CUDA against the CPU. The default tier runs the same comparison
against CPU bf16 autocast for a few variants, so the harness itself is tested where there is no GPU.

Tolerances: fp32 on CUDA (TF32 off) differs from the CPU only by summation order (loss 1e-4 relative, gradient
vector 1e-3 relative in L2); bf16 keeps 8 mantissa bits (loss 2e-2, gradients 6e-2). ACT's halting and QKNorm's
scale are computed in fp32 under autocast, so the halting decisions match and bf16 stays within these bounds.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import available
from tests.conftest import TINY, TINY_ALGO, compose

RECURRENCES = ("stacked", "ut", "ut_act")
TOLERANCE = {"fp32": (1e-4, 1e-3), "bf16": (2e-2, 6e-2)}  # (loss, gradient) relative
# Exact and small: no dropout, BigBird in blocks of 2 with a random block, so the sparse path runs.
STEP = [*TINY, *TINY_ALGO, "model.dropout=0", "model.attention_dropout=0", "model.activation_dropout=0"]


def _case(attention: str, recurrence: str) -> list[str]:
    extra = ["model.attention.block_size=2", "model.attention.dense_fallback_len=0"] if attention == "bigbird" else []
    if recurrence == "ut_act":
        extra.append("model.recurrence.act_max_steps=3")
    return [*STEP, f"model/attention={attention}", f"model/recurrence={recurrence}", *extra]


_TASKS: dict = {}


def one_step(overrides: list[str], device: str, precision: str, first: int = 0) -> tuple[float, torch.Tensor]:
    """Loss and the flattened gradient (fp32, on the CPU) of one training step of a freshly seeded module."""
    from attnlab.training.build import build_module, build_task_data

    cfg = compose(overrides)
    key = (cfg.task.name, cfg.seed)
    if key not in _TASKS:
        _TASKS[key] = build_task_data(cfg)
    task = _TASKS[key]
    torch.manual_seed(0)
    module = build_module(cfg, task).to(device).train()
    batch = task.collate([task.datasets["train"][i] for i in range(first, first + 8)])
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    dev = torch.device(device).type
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=precision == "bf16"):
        total, _, _, _ = module.total_loss(batch)
    total.backward()
    grads = [p.grad.detach().float().cpu().flatten() for p in module.parameters() if p.grad is not None]
    return float(total.detach()), torch.cat(grads)


def assert_same_step(overrides: list[str], device: str, precision: str) -> None:
    assert_close_steps(one_step(overrides, device, precision), one_step(overrides, "cpu", "fp32"), precision)


def assert_close_steps(step: tuple[float, torch.Tensor], reference: tuple[float, torch.Tensor], precision: str):
    (loss, grad), (loss_ref, grad_ref) = step, reference
    loss_tol, grad_tol = TOLERANCE[precision]
    assert loss == pytest.approx(loss_ref, rel=loss_tol), (loss, loss_ref)
    error = float((grad - grad_ref).norm() / grad_ref.norm().clamp_min(1e-12))
    assert error <= grad_tol, f"gradient differs by {error:.2e} (relative L2), allowed {grad_tol:.0e}"


@pytest.mark.parametrize("recurrence", RECURRENCES)
@pytest.mark.parametrize("attention", ["vanilla", "bigbird", "qknorm"])
def test_cpu_bf16_step_matches_cpu_fp32(attention, recurrence):
    """The harness on CPU: bf16 autocast against fp32, within the bf16 tolerances."""
    assert_same_step(_case(attention, recurrence), "cpu", "bf16")


def test_the_harness_fails_on_a_step_that_differs():
    """Another batch through the same model must not pass as the same step, even at the loose bf16 tolerances."""
    reference = one_step(_case("vanilla", "ut"), "cpu", "fp32")
    with pytest.raises(AssertionError):
        assert_close_steps(one_step(_case("vanilla", "ut"), "cpu", "fp32", first=8), reference, "bf16")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("recurrence", RECURRENCES)
@pytest.mark.parametrize("attention", available())
def test_cuda_step_matches_the_cpu(attention, recurrence, precision):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    assert_same_step(_case(attention, recurrence), "cuda", precision)


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_cuda_decoding_with_the_cache_equals_the_cpu(strategy):
    """Beam search and cached greedy decoding on CUDA give the CPU's outputs (fp32, a seeded model)."""
    from attnlab.decoding.search import beam_search, greedy_decode
    from attnlab.training.build import build_module, build_task_data

    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = compose(STEP)
    task = build_task_data(cfg)
    outputs = []
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        module = build_module(cfg, task).to(device).eval()
        src = task.collate([task.datasets["test"][i] for i in range(8)])["src"].to(device)
        t = module.task_info
        with torch.no_grad():
            if strategy == "greedy":
                out = greedy_decode(module.model, src, bos_id=t["bos_id"], eos_id=t["eos_id"], max_len=12)
            else:
                out = beam_search(module.model, src, bos_id=t["bos_id"], eos_id=t["eos_id"], max_len=12,
                                  beam_size=3, alpha=0.6)
        outputs.append(out.cpu())
    assert torch.equal(outputs[0], outputs[1])
