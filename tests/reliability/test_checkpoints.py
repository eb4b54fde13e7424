"""Atomic checkpoint writes, weights-only loading, choosing where to resume, init_from, and the
kill-free half of preemption (SIGTERM delivered in-process): resumed == uninterrupted, exactly."""

from __future__ import annotations

import importlib
import json
import os
import pickle
import shutil
import signal

import lightning as L
import pytest
import torch

from attnlab.results.record import read_record, validate_record
from attnlab.training.checkpointing import (
    LAST,
    CheckpointError,
    Preempted,
    atomic_torch_save,
    find_resume_checkpoint,
    load_checkpoint_file,
)
from tests.reliability.helpers import run_with_callbacks, same_weights

run_module = importlib.import_module("attnlab.training.run")


class Opaque:
    """Not a tensor or a plain container: loading it would need arbitrary unpickling."""


def test_atomic_save_keeps_the_old_file_when_the_write_dies(tmp_path, monkeypatch):
    path = tmp_path / LAST
    atomic_torch_save({"global_step": 1, "w": torch.ones(3)}, path)

    def dying_save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt  # what a kill looks like from inside the process

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        atomic_torch_save({"global_step": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint_file(path)["global_step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == [LAST], "the partial temp file must be removed"


def test_loading_refuses_corrupt_truncated_and_unsafe_files(tmp_path):
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(os.urandom(256))
    good = tmp_path / "good.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(64, 64)}}, good)
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    unsafe = tmp_path / "unsafe.ckpt"
    torch.save({"state_dict": {}, "extra": Opaque()}, unsafe)
    legacy_pickle = tmp_path / "pickle.ckpt"
    legacy_pickle.write_bytes(pickle.dumps({"x": Opaque()}))

    for path, fragment in [(garbage, "corrupt"), (truncated, "corrupt or truncated"),
                           (unsafe, "needs arbitrary unpickling"), (legacy_pickle, "")]:
        with pytest.raises(CheckpointError) as info:
            load_checkpoint_file(path)
        message = str(info.value)
        assert "\n" not in message and str(path) in message and fragment in message, message
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint_file(tmp_path / "missing.ckpt")


def test_newest_complete_checkpoint_skips_a_corrupt_last(tmp_path, caplog):
    atomic_torch_save({"global_step": 4}, tmp_path / "step0000004.ckpt")
    atomic_torch_save({"global_step": 6}, tmp_path / "step0000006.ckpt")
    (tmp_path / LAST).write_bytes(b"\x00" * 100)  # e.g. a disk error after the rename
    (tmp_path / f"{LAST}.tmp-123").write_bytes(b"partial")  # a kill while saving
    path, ckpt = find_resume_checkpoint(tmp_path)
    assert path.name == "step0000006.ckpt" and ckpt["global_step"] == 6
    assert "skipping unusable checkpoint" in caplog.text and LAST in caplog.text
    atomic_torch_save({"global_step": 6}, tmp_path / LAST)
    assert find_resume_checkpoint(tmp_path)[0].name == LAST  # on a tie, last.ckpt (newest state)


class _SignalAt(L.Callback):
    """Sends this process a signal after a given update, as a scheduler would."""

    def __init__(self, step: int, signum: int = signal.SIGTERM) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


_run = run_with_callbacks


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted run that the interrupted ones must match."""
    run_dir = tmp_path_factory.mktemp("reference")
    return run_dir, _run(run_dir)


def _csv_rows(run_dir):
    import csv

    with (run_dir / "csv" / "metrics.csv").open() as f:
        return [{k: v for k, v in row.items() if v and not k.startswith("perf/")} for row in csv.DictReader(f)]


@pytest.mark.parametrize(("step", "signum"), [(5, signal.SIGTERM), (6, signal.SIGUSR1)],
                         ids=["SIGTERM-mid-interval", "SIGUSR1-at-validation"])
def test_signal_saves_stops_and_resume_matches_uninterrupted(step, signum, reference, tmp_path):
    ref_dir, ref = reference
    with pytest.raises(Preempted) as info:
        _run(tmp_path, callbacks=[_SignalAt(step, signum)])
    assert info.value.step == step and info.value.checkpoint == str(tmp_path / "checkpoints" / LAST)
    interrupted = read_record(tmp_path / "results.json")
    assert interrupted["status"] == "interrupted" and interrupted["extra"]["preempted"]["step"] == step
    assert validate_record(interrupted) == []
    assert torch.load(tmp_path / "checkpoints" / LAST, weights_only=True)["global_step"] == step

    saved = torch.load(tmp_path / "checkpoints" / LAST, weights_only=True)["callbacks"]["RunCost"]
    assert saved["segments"] == 1 and 0 < saved["wall_s"] <= interrupted["cost"]["wall_s"]

    resumed = _run(tmp_path)  # the same command again: resume=auto finds last.ckpt
    assert resumed["status"] == "completed" and resumed["cost"]["steps"] == ref["cost"]["steps"]
    # the record's cost spans both segments: the first up to its checkpoint, then the resumed one (issue 52.8)
    assert ref["cost"]["segments"] == 1 and resumed["cost"]["segments"] == 2
    assert resumed["cost"]["wall_s"] > saved["wall_s"] and resumed["cost"]["cpu_s"] > saved["cpu_s"]
    assert resumed["extra"]["resumed_from"].endswith(LAST)
    assert resumed["metrics"] == ref["metrics"]  # final and best, exactly
    assert same_weights(tmp_path / "checkpoints" / LAST, ref_dir / "checkpoints" / LAST)
    assert _csv_rows(tmp_path) == _csv_rows(ref_dir), "the CSV log must continue, not restart or repeat"


def test_a_run_killed_after_its_last_checkpoint_still_logs_its_test_metrics(reference, tmp_path):
    """A kill (SIGKILL: nothing handled) after the final update's checkpoint but before testing: the same
    command resumes at the final step and goes straight to testing. Its test metrics must reach metrics.csv
    (the appending logger dropped every row at or below the checkpoint's step, test rows included)."""
    ref_dir, ref = reference
    shutil.copytree(ref_dir, tmp_path, dirs_exist_ok=True)
    (tmp_path / "results.json").unlink()
    shutil.rmtree(tmp_path / "outputs", ignore_errors=True)
    rows = (tmp_path / "csv" / "metrics.csv").read_text().splitlines(keepends=True)
    kept = [r for r in rows if "test" not in r.split(",", 1)[0] and not _has_test_value(rows[0], r)]
    (tmp_path / "csv" / "metrics.csv").write_text("".join(kept))
    assert not any(k.startswith("test/") for row in _csv_rows(tmp_path) for k in row)

    resumed = _run(tmp_path)
    assert resumed["status"] == "completed" and resumed["metrics"]["final"] == ref["metrics"]["final"]
    logged = {k: v for row in _csv_rows(tmp_path) for k, v in row.items() if k.startswith("test/")}
    expected = {k: v for row in _csv_rows(ref_dir) for k, v in row.items() if k.startswith("test/")}
    assert logged == expected and expected


def _has_test_value(header: str, row: str) -> bool:
    keys = header.strip().split(",")
    return any(k.startswith("test") and v for k, v in zip(keys, row.strip().split(",")))


def test_ckpt_path_resumes_and_init_from_loads_weights_only(reference, tmp_path):
    ref_dir, ref = reference
    best = next(p for p in (ref_dir / "checkpoints").glob("step*.ckpt"))
    source = torch.load(best, weights_only=True)

    seen = {}

    class Probe(L.Callback):
        def on_train_start(self, trainer, pl_module):
            seen["step"] = trainer.global_step
            seen["weights"] = {k: v.clone() for k, v in pl_module.state_dict().items()}
            seen["lr"] = trainer.optimizers[0].param_groups[0]["lr"]

    resumed = _run(tmp_path / "resumed", [f"ckpt_path={best}"], callbacks=[Probe()])
    assert seen["step"] == source["global_step"] > 0 and resumed["cost"]["steps"] == 8

    started = _run(tmp_path / "init", [f"init_from={best}"], callbacks=[Probe()])
    assert seen["step"] == 0 and started["cost"]["steps"] == 8
    assert all(torch.equal(seen["weights"][k], v) for k, v in source["state_dict"].items())
    assert seen["lr"] != source["lr_schedulers"][0]["_last_lr"][0]  # the schedule starts afresh


def test_init_from_a_different_model_is_refused(reference, tmp_path):
    ref_dir, _ = reference
    with pytest.raises(CheckpointError, match="does not match this model"):
        _run(tmp_path, ["model.d_ff=96", f"init_from={ref_dir / 'checkpoints' / LAST}"])


def test_auto_resume_falls_back_when_last_is_corrupt(reference, tmp_path):
    ref_dir, ref = reference
    run_dir = tmp_path / "run"
    shutil.copytree(ref_dir, run_dir)
    ckpts = run_dir / "checkpoints"
    (ckpts / LAST).write_bytes(b"not a checkpoint")  # the final state is lost; the best one (older) is not
    (run_dir / "results.json").unlink()
    resumed = _run(run_dir)
    assert resumed["status"] == "completed"
    assert "step" in resumed["extra"]["resumed_from"] and LAST not in resumed["extra"]["resumed_from"]
    assert resumed["metrics"]["final"] == ref["metrics"]["final"]
    assert same_weights(ckpts / LAST, ref_dir / "checkpoints" / LAST)  # redone from the older state, exactly


def test_resume_never_refuses_a_folder_with_checkpoints(reference, tmp_path):
    from attnlab.errors import ConfigError

    ref_dir, _ = reference
    with pytest.raises(ConfigError, match="resume=never"):
        _run(ref_dir, ["resume=never"])


def test_checkpoints_hold_only_allow_listed_types(reference):
    ref_dir, _ = reference
    for path in (ref_dir / "checkpoints").glob("*.ckpt"):
        ckpt = torch.load(path, weights_only=True)  # raises if anything needs arbitrary unpickling
        assert "RandomState" in ckpt["callbacks"] and "LastCheckpoint" in ckpt["callbacks"]
    json.dumps(torch.load(ref_dir / "checkpoints" / LAST, weights_only=True)["hyper_parameters"])


def test_resumed_run_logs_into_the_same_wandb_run(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the logger config's own offline mode
    with pytest.raises(Preempted):
        _run(tmp_path, ["logger=wandb", "trainer.max_steps=4"], callbacks=[_SignalAt(1)])
    first = (tmp_path / "wandb_run_id").read_text().strip()
    assert torch.load(tmp_path / "checkpoints" / LAST, weights_only=True)["callbacks"]["LastCheckpoint"][
        "wandb_run_id"] == first
    resumed = _run(tmp_path, ["logger=wandb", "trainer.max_steps=4"])
    assert resumed["wandb_run_id"] == first
    assert {p.name.rsplit("-", 1)[-1] for p in (tmp_path / "wandb").glob("offline-run-*")} == {first}
