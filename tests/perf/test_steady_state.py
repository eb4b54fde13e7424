"""Steady-state throughput (issue 50.2): the record's training figures without the warm-up steps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attnlab.training.callbacks import Throughput, warmup_steps


class _Clock:
    """``time.perf_counter`` stand-in that each step advances by the step's duration."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _drive(step_seconds: list[float], tokens_per_step: int, monkeypatch, world_size: int = 1,
           device_counts: bool = False) -> Throughput:
    clock = _Clock()
    monkeypatch.setattr("attnlab.training.callbacks.time.perf_counter", clock)
    throughput = Throughput(log=False)
    trainer = SimpleNamespace(global_step=0, log_every_n_steps=1000, world_size=world_size,
                              max_steps=len(step_seconds))
    # device_counts: token counts as tensors (as TaskModule keeps them on the device), added to in place
    module = SimpleNamespace(_tokens_seen=torch.zeros((), dtype=torch.long) if device_counts else 0,
                             device=torch.device("cpu"), log=lambda *a, **k: None)
    for seconds in step_seconds:
        throughput.on_train_batch_start(trainer, module, None, 0)
        clock.now += seconds
        module._tokens_seen = module._tokens_seen + tokens_per_step  # a new value, as TaskModule does
        trainer.global_step += 1
        throughput.on_train_batch_end(trainer, module, None, None, 0)
    return throughput


@pytest.mark.parametrize("device_counts", [False, True], ids=["int_counts", "tensor_counts"])
def test_steady_state_leaves_out_the_warm_up_steps(monkeypatch, device_counts):
    """30 steps: the first holds a 60 s compile, the rest take 0.1 s. The whole-run average is 20x too slow;
    the steady state (after the warm-up of 3 steps) is the true speed. Token counts kept as tensors (added
    to in place) give the same, as a plain float."""
    throughput = _drive([60.0] + [0.1] * 29, 1000, monkeypatch, world_size=2, device_counts=device_counts)
    assert warmup_steps(30) == 3
    steady = throughput.steady_state(world_size=2)
    assert steady["steady_steps"] == 27
    assert abs(steady["steady_step_s"] - 0.1) < 1e-9
    assert type(steady["steady_tokens_per_s"]) is float
    assert abs(steady["steady_tokens_per_s"] - 2 * 1000 / 0.1) < 1e-6
    assert throughput.average_step_s() > 2.0  # (60 + 2.9) / 30


def test_a_run_shorter_than_its_warm_up_has_no_steady_figure(monkeypatch):
    throughput = _drive([1.0], 10, monkeypatch)
    assert throughput.steady_state() == {"steady_tokens_per_s": None, "steady_step_s": None, "steady_steps": 0}
    assert warmup_steps(None) == 10 and warmup_steps(10_000) == 50 and warmup_steps(5) == 2


def test_the_record_reports_steady_mfu_per_device(monkeypatch):
    from attnlab.training.perf import MFUCallback
    from attnlab.training.record_writers import steady_summary

    throughput = _drive([5.0] + [0.5] * 19, 100, monkeypatch, world_size=2)
    mfu = MFUCallback(measure_peak=False)
    mfu.flops_per_token, mfu.peak = 1e6, 1e9
    steady = steady_summary(throughput, [mfu], world_size=2)
    # per device: 100 tokens / 0.5 s * 1e6 FLOPs per token / 1e9 peak
    assert abs(steady["steady_mfu"] - 0.2) < 1e-9
    assert steady_summary(throughput, [], world_size=2)["steady_mfu"] is None
