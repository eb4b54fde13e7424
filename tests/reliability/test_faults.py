"""NaN/Inf losses, storage faults and sweeps with a failing job, through the real CLI (in-process)."""

from __future__ import annotations

import errno
import importlib
import json
import math
import sys

import torch

from attnlab.cli.train import main as train_main
from attnlab.results.record import read_record, validate_record
from attnlab.training.checkpointing import LAST, load_checkpoint_file
from attnlab.training.modules import Seq2SeqModule
from tests.conftest import TINY, TINY_ALGO
from tests.reliability.helpers import one_clear_line, run_cli

SHORT = [*TINY, *TINY_ALGO, "trainer.max_steps=6", "trainer.val_check_interval=2", "logger=csv"]


def _poison_loss(monkeypatch, at_step: int, value: float = math.nan, times: int = 1) -> None:
    """Make the training loss non-finite for ``times`` batches from update ``at_step`` on, as a diverging run would."""
    original = Seq2SeqModule.compute_loss
    left = {"n": times}

    def compute_loss(self, batch):
        loss, aux, tokens = original(self, batch)
        if self.training and self.trainer.global_step >= at_step and left["n"] > 0:
            left["n"] -= 1
            loss = loss * value
        return loss, aux, tokens

    monkeypatch.setattr(Seq2SeqModule, "compute_loss", compute_loss)


def test_nan_loss_stops_with_one_line_keeps_the_good_checkpoint_and_records_failure(tmp_path, monkeypatch,
                                                                                      capsys):
    monkeypatch.chdir(tmp_path)
    _poison_loss(monkeypatch, at_step=3)
    run_dir = tmp_path / "run"
    code, err = run_cli(train_main, [*SHORT, f"hydra.run.dir={run_dir}"], capsys)
    line = one_clear_line(err)
    assert code == 1
    assert "non-finite loss at step 3" in line and "nll=nan" in line and "loss=nan" in line, line
    last = load_checkpoint_file(run_dir / "checkpoints" / LAST)
    assert last["global_step"] == 2  # the validation checkpoint before the fault
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values())
    record = read_record(run_dir / "results.json")
    assert record["status"] == "failed" and "non-finite loss at step 3" in record["error"]
    assert validate_record(record) == []
    assert not (tmp_path / "results").exists()


def test_nan_policy_skip_drops_bad_batches_up_to_the_limit(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _poison_loss(monkeypatch, at_step=3, value=math.inf)
    run_dir = tmp_path / "skip"
    train_main([*SHORT, "nan_policy=skip", "max_skipped_batches=2", f"hydra.run.dir={run_dir}"])
    record = read_record(run_dir / "results.json")
    assert record["status"] == "completed" and record["extra"]["skipped_batches"] == 1
    assert record["cost"]["steps"] == 6  # a skipped batch changes no weight but counts as a step (Lightning)
    weights = load_checkpoint_file(run_dir / "checkpoints" / LAST)["state_dict"]
    assert all(torch.isfinite(v).all() for v in weights.values())

    _poison_loss(monkeypatch, at_step=2, times=3)  # three bad batches in a row, limit 2
    code, err = run_cli(train_main, [*SHORT, "nan_policy=skip", "max_skipped_batches=2",
                                     f"hydra.run.dir={tmp_path / 'limit'}"], capsys)
    assert code == 1 and "2 batches already skipped (max_skipped_batches=2)" in one_clear_line(err)


def test_disk_full_before_training_is_reported_and_writes_no_checkpoint(tmp_path, monkeypatch, capsys):
    import shutil

    storage = importlib.import_module("attnlab.training.storage")
    real = shutil.disk_usage
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda p: real(p)._replace(free=4096))
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    code, err = run_cli(train_main, [*SHORT, f"hydra.run.dir={run_dir}"], capsys)
    assert code == 1 and "not enough free disk space" in one_clear_line(err)
    assert not (run_dir / "checkpoints").exists()
    assert read_record(run_dir / "results.json")["status"] == "failed"


def test_disk_filling_up_mid_run_leaves_the_last_checkpoint_intact(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    real_save = torch.save
    calls = {"n": 0}

    def save(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] >= 2:  # the first checkpoint fits, the disk is full for the second
            f.write(b"PK\x03\x04partial")
            raise OSError(errno.ENOSPC, "No space left on device", str(getattr(f, "name", f)))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    run_dir = tmp_path / "run"
    code, err = run_cli(train_main, [*SHORT, "callbacks.checkpoint.save_top_k=0", f"hydra.run.dir={run_dir}"],
                        capsys)
    monkeypatch.setattr(torch, "save", real_save)
    line = one_clear_line(err)
    assert code == 1 and "No space left on device" in line and "intact" in line, line
    files = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert files == [LAST], files  # no partial temp file next to it
    assert load_checkpoint_file(run_dir / "checkpoints" / LAST)["global_step"] == 2
    assert read_record(run_dir / "results.json")["status"] == "failed"


def test_unexpected_error_in_one_sweep_job_is_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    original = Seq2SeqModule.compute_loss
    state = {"calls": 0}

    def flaky(self, batch):
        state["calls"] += 1
        if state["calls"] == 2:  # the first job's second batch: a bug, not bad input
            raise RuntimeError("boom in the model")
        return original(self, batch)

    monkeypatch.setattr(Seq2SeqModule, "compute_loss", flaky)
    sweep = tmp_path / "sweep"
    code, err = run_cli(train_main, ["-m", *TINY, *TINY_ALGO, "trainer.max_steps=2", "logger=wandb", "seed=1,2",
                                     f"hydra.sweep.dir={sweep}"], capsys)
    assert code == 1, err  # the sweep went on, then says which job failed
    summary = err[err.index("1 job(s) of the sweep failed"):]
    assert "RuntimeError: boom in the model" in summary and str(next(sweep.glob("0-*"))) in summary, summary
    records = {json.loads(p.read_text())["seed"]: json.loads(p.read_text()) for p in sweep.glob("*/results.json")}
    assert records[1]["status"] == "failed" and records[1]["error"] == "RuntimeError: boom in the model"
    assert records[2]["status"] == "completed"
    assert all(validate_record(r) == [] for r in records.values())
    assert sys.modules["wandb"].run is None, "the failed job's wandb run must be closed"
    assert "Traceback" in (next(sweep.glob("0-*")) / "train.log").read_text()  # the bug's traceback is kept


DEFERRED = ["hardware.fused_optimizer=true", "hardware.nan_check=deferred"]


def test_a_deferred_check_skips_on_the_device_exactly_as_the_host_check_skips(tmp_path, monkeypatch):
    """hardware.nan_check=deferred (the GPU default) never reads the loss on the host in a step: the fused
    optimizer skips the update itself. Its run must end at the very weights of the host-checked run (a flag
    that never reached the optimizer would let the Inf into the weights; one read a step late would skip the
    wrong update)."""
    monkeypatch.chdir(tmp_path)
    ends = {}
    for check in ("every_step", "deferred"):
        _poison_loss(monkeypatch, at_step=3, value=math.inf)
        run_dir = tmp_path / check
        train_main([*SHORT, "nan_policy=skip", "max_skipped_batches=2", "hardware.fused_optimizer=true",
                    f"hardware.nan_check={check}", "trainer.log_every_n_steps=4", f"hydra.run.dir={run_dir}"])
        record = read_record(run_dir / "results.json")
        assert record["status"] == "completed" and record["extra"]["skipped_batches"] == 1, check
        ends[check] = load_checkpoint_file(run_dir / "checkpoints" / LAST)
    host, device = ends["every_step"], ends["deferred"]
    assert all(torch.isfinite(v).all() for v in device["state_dict"].values())
    assert all(torch.equal(device["state_dict"][k], v) for k, v in host["state_dict"].items())
    moments = [s["exp_avg"] for s in device["optimizer_states"][0]["state"].values()]
    assert all(torch.isfinite(m).all() for m in moments)


def test_a_deferred_check_stops_at_its_next_read_naming_the_first_bad_step(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _poison_loss(monkeypatch, at_step=3)
    run_dir = tmp_path / "run"
    code, err = run_cli(train_main, [*SHORT, *DEFERRED, "trainer.log_every_n_steps=5", f"hydra.run.dir={run_dir}"],
                        capsys)
    line = one_clear_line(err)
    assert code == 1
    assert "non-finite loss at step 3" in line and "nll=nan" in line and "no checkpoint holds an update" in line
    record = read_record(run_dir / "results.json")
    assert record["status"] == "failed" and "non-finite loss at step 3" in record["error"]
    last = load_checkpoint_file(run_dir / "checkpoints" / LAST)
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values())


def test_a_deferred_check_without_an_optimizer_that_can_skip_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(train_main, [*SHORT, "hardware.nan_check=deferred", "hardware.fused_optimizer=false",
                                     f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2 and "hardware.nan_check=deferred needs" in one_clear_line(err)


def test_a_deferred_check_acts_on_unread_counts_before_a_checkpoint_is_written():
    """A non-finite loss noted on the device but not yet read when a checkpoint is written (a validation or a
    periodic save between two log steps) must be acted on then: folded unread into the saved ``skipped``, a run
    resumed from that checkpoint (after a preemption) went on past it under nan_policy=stop."""
    import types

    import pytest

    from attnlab.training.nonfinite_guard import NonFiniteGuard, NonFiniteLoss

    trainer = types.SimpleNamespace(global_step=3, log_every_n_steps=5, world_size=1)
    module = types.SimpleNamespace(trainer=trainer, log=lambda *a, **k: None)
    guard = NonFiniteGuard("stop", check="deferred")
    guard.check(module, torch.tensor(math.nan), {"loss": torch.tensor(math.nan)})
    trainer.global_step = 4
    with pytest.raises(NonFiniteLoss, match="non-finite loss at step 3"):
        guard.state_dict()  # the checkpoint at step 4 is not written

    skip = NonFiniteGuard("skip", max_skipped=1, check="deferred")
    for _ in range(2):  # two bad batches, limit 1
        skip.check(module, torch.tensor(math.inf), {"loss": torch.tensor(math.inf)})
    with pytest.raises(NonFiniteLoss, match="max_skipped_batches=1"):
        skip.state_dict()
    within = NonFiniteGuard("skip", max_skipped=2, check="deferred")
    within.check(module, torch.tensor(math.inf), {"loss": torch.tensor(math.inf)})
    assert within.state_dict() == {"skipped": 1} and within._pending()[0] == 0  # counted once, not again later
