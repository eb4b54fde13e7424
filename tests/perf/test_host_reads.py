"""A training step must not wait for the accelerator (issue 36): every read of a tensor's value on the host
(``.item()``, ``bool()``, ``float()``, ``int()``, ``.tolist()``, ``.cpu()``, ``.numpy()``) makes the host
wait for the device, and a small model's GPU then idles while the host prepares the next step.

On CPU a read costs nothing, so it is counted instead of timed: a torch function mode sees every read from
the first batch's end to the run's end, window by window, in a run with the GPU's settings (fused optimizer,
deferred non-finite check). Reads are allowed where the run logs or saves (every ``log_every_n_steps``, a
checkpoint), in the first batch (BigBird builds its block plan for a length once) and in the one step whose
FLOPs are counted. ACT's halting loop
reads on purpose: it stops when every position has halted, which is the compute ACT saves.
"""

from __future__ import annotations

import collections
import traceback

import lightning as L
import pytest
from torch.overrides import TorchFunctionMode

from attnlab.training.modules import TaskModule
from tests.reliability.helpers import run_with_callbacks

READS = {"item", "__bool__", "__float__", "__int__", "__index__", "tolist", "cpu", "numpy"}
LOG_EVERY = 4


class _HostReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.where: collections.Counter = collections.Counter()
        self.batch_on_host = False  # inside on_before_batch_transfer: the batch is still in host memory

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in READS and not self.batch_on_host:
            caller = traceback.extract_stack(limit=2)[0]  # the line that reads
            self.where[f"{func.__name__} at {caller.filename.rsplit('/', 2)[-1]}:{caller.lineno}"] += 1
        return func(*args, **(kwargs or {}))


class _ReadsPerStep(L.Callback):
    """Host reads between one batch's start and the next one's, keyed by the update count at its end."""

    def __init__(self) -> None:
        self.mode: _HostReads | None = None
        self.steps: list[tuple[int, int, collections.Counter]] = []

    def _close(self, trainer, batch_idx: int) -> None:
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.steps.append((batch_idx, trainer.global_step, self.mode.where))
            self.mode = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._close(trainer, batch_idx - 1)
        self.mode = _HostReads()
        self.mode.__enter__()

    def on_train_end(self, trainer, pl_module):
        self._close(trainer, -1)


@pytest.mark.parametrize("model", [[], ["model/attention=bigbird"]], ids=["transformer", "bigbird"])
def test_steps_that_neither_log_nor_save_read_nothing_on_the_host(tmp_path, model, monkeypatch):
    probe = _ReadsPerStep()
    # The padding flags are read from the batch before it is copied to the device: host memory, no wait.
    before_transfer = TaskModule.on_before_batch_transfer

    def on_host(self, batch, dataloader_idx):
        if probe.mode is not None:
            probe.mode.batch_on_host = True
        try:
            return before_transfer(self, batch, dataloader_idx)
        finally:
            if probe.mode is not None:
                probe.mode.batch_on_host = False

    monkeypatch.setattr(TaskModule, "on_before_batch_transfer", on_host)
    gpu_settings = ["hardware.fused_optimizer=true", "hardware.nan_check=deferred"]
    quiet_run = ["trainer.max_steps=12", f"trainer.log_every_n_steps={LOG_EVERY}", "trainer.val_check_interval=50",
                 "callbacks.checkpoint.every_n_steps=50"]
    run_with_callbacks(tmp_path / "run", extra=[*model, *gpu_settings, *quiet_run], callbacks=[probe])
    # The throughput callbacks log after update 4k (Lightning's cadence) and MFU after update 4k - 1; MFU
    # counts FLOPs once, in an eager pass of its own before update 2.
    quiet = [(step, where) for batch, step, where in probe.steps
             if batch > 0 and step % LOG_EVERY not in (0, LOG_EVERY - 1) and step != 2]
    assert len(quiet) >= 3
    assert all(not where for _, where in quiet), quiet


class _TargetTokens(L.Callback):
    """The target tokens of every training batch, counted from the batch (not from the module's loss)."""

    def __init__(self) -> None:
        self.tokens = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.tokens += int(batch["tgt_out"].ne(pl_module.task_info["pad_id"]).sum())


def test_device_token_counts_still_count_every_batch(tmp_path):
    """Token counts stay on the device; the throughput in the record must still cover every batch (an in-place
    ``+=`` on the running count once made every batch after the first count zero tokens)."""
    from attnlab.results.record import read_record
    from attnlab.training.callbacks import Throughput

    counted = _TargetTokens()
    seen: list[Throughput] = []

    class _Keep(L.Callback):
        def on_fit_start(self, trainer, pl_module):
            seen.extend(c for c in trainer.callbacks if isinstance(c, Throughput))

    run_with_callbacks(tmp_path / "run", extra=["hardware.nan_check=deferred", "hardware.fused_optimizer=true"],
                       callbacks=[counted, _Keep()])
    assert counted.tokens > 0 and int(seen[0].total_tokens) == counted.tokens
    cost = read_record(tmp_path / "run" / "results.json")["cost"]
    assert round(cost["tokens_per_s"] * cost["step_s"] * cost["steps"]) == counted.tokens
