"""What the adversarial corpus of issue 17 broke: each refused config is one line, exit 2, and no run folder;
each fault (a full disk, Ctrl-C, a second run in the same folder) loses nothing and says what happened."""

from __future__ import annotations

import errno
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnlab.cli.train import main as train_main
from attnlab.results.record import read_record, validate_record
from attnlab.training.checkpointing import LAST, CheckpointError, load_checkpoint_file
from attnlab.training.modules import Seq2SeqModule
from attnlab.training.storage import LOCK_FILE, RunFolderLock
from tests.conftest import TINY, TINY_ALGO
from tests.reliability.helpers import one_clear_line, run_cli

FAST = [*TINY, *TINY_ALGO, "logger=csv"]
SHORT = [*FAST, "trainer.max_steps=6", "trainer.val_check_interval=2"]

# (overrides, fragment of the one line): refused before Hydra makes any folder.
REFUSED = [
    # 17.1: non-finite and out-of-range numbers, seeds, interpolations resolved before checking
    (["optim.lr=nan"], "optim.lr=nan must be a finite number"),
    (["optim.lr=inf"], "optim.lr=inf must be a finite number"),
    (["optim.betas=[1.5,0.9]"], "optim.betas=[1.5, 0.9] must be two numbers in [0, 1)"),
    (["trainer.limit_val_batches=-1"], "trainer.limit_val_batches=-1 must be non-negative"),
    ([f"seed={2**64}"], "must be an integer in [0, 4294967295]"),
    (["seed=abc"], "seed='abc' must be an integer"),
    (["seed=${oc.env:HOME}"], "must be an integer"),
    (["trainer.max_steps=${oc.env:HOME}"], "trainer.max_steps='"),
    # siblings: other float keys, other ranges
    (["optim.eps=nan"], "optim.eps=nan must be a finite number"),
    (["optim.weight_decay=-inf"], "optim.weight_decay=-inf must be a finite number"),
    (["model.dropout=nan"], "model.dropout=nan must be a finite number"),
    (["optim.grad_clip=inf"], "optim.grad_clip=inf must be a finite number"),
    (["optim.min_lr_ratio=2"], "optim.min_lr_ratio=2 must be in [0, 1]"),
    (["optim.betas=[0.9]"], "must be two numbers"),
    (["optim.eps=0"], "optim.eps=0 must be positive"),
    (["trainer.limit_train_batches=1.5"], "a fraction must be at most 1.0"),
    (["task.decoding.length_penalty_alpha=nan"], "task.decoding.length_penalty_alpha=nan must be a finite"),
    (["task.decoding.beam_size=0"], "task.decoding.beam_size=0 must be at least 1"),
    (["seed=-1"], "seed=-1 must be an integer in [0"),
    (["seed=1.5"], "seed=1.5 must be an integer"),
    (["callbacks.checkpoint.save_top_k=-2"], "save_top_k=-2"),
    (["model.attention.name=vanilla", "+model.attention.g0=nan"], "model.attention"),
    # 17.6 and siblings: an empty split is refused up front
    (["task.train_size=0"], "task.train_size=0 leaves a split empty"),
    (["task.test_size=0"], "task.test_size=0 leaves a split empty"),
    (["trainer.limit_train_batches=0"], "trainer.limit_train_batches=0 must be positive"),
    (["trainer.limit_test_batches=0.0"], "trainer.limit_test_batches=0.0 must be positive"),
    (["task=qa/babi", "task.val_fraction=0"], "task.val_fraction=0 must be in (0, 1)"),
    (["task=lm/wikitext2", "task.max_train_tokens=0"], "task.max_train_tokens=0 leaves a split empty"),
    # 17.7: options the attention variant refuses, found without data and without building the model
    (["model/attention=bigbird", "model.attention.window_blocks=2"], "a bidirectional window is centred"),
    (["model/attention=bigbird", "model.attention.impl=flex"], "impl=flex cannot serve this call on cpu"),
    (["model/attention=synth_dense", "model.cross_attention={name:synth_dense}"], "cannot be used for cross-attention"),
    # 17.8: a name the file system cannot hold
    (["paths.run_id=" + "x" * 300], "the file system allows"),
    # 17.2: group choices never leave the config tree, and the line lists only valid presets
    (["experiment=../../proc/self"], "valid options of experiment: "),
    (["experiment=../train"], "no '..' or absolute paths"),
    (["model/attention=../../../../etc/passwd"], "valid options of model/attention: bigbird"),
    (["experiment=/etc/passwd"], "no '..' or absolute paths"),
    # 17.13: a path with a space, unquoted
    (["paths.data_root=/my", "data"], "a value with spaces must be quoted"),
]


def _id(case) -> str:
    return " ".join(case[0])[:60]


@pytest.mark.parametrize(("args", "fragment"), REFUSED, ids=[_id(c) for c in REFUSED])
def test_bad_config_is_one_line_exit_2_and_no_run_folder(args, fragment, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNLAB_RUNS_DIR", str(tmp_path / "runs"))  # the default run folder, named from the seed
    base = TINY if any(a.startswith("task=") for a in args) else FAST
    started = time.monotonic()
    code, err = run_cli(train_main, [*base, *args], capsys)
    line = one_clear_line(err)
    assert code == 2, err
    assert fragment in line, line
    assert len(line) < 20_000, line  # never a listing of machine paths
    assert time.monotonic() - started < 60
    assert not (tmp_path / "runs").exists(), "a refused config must not leave a run folder"
    assert not (tmp_path / "outputs").exists()


def test_missing_logger_package_is_refused_in_the_preflight(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("tensorboard", "tensorboardX") else real(name, *a))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNLAB_RUNS_DIR", str(tmp_path / "runs"))
    for logger in ("tensorboard", "many"):
        code, err = run_cli(train_main, [*FAST, f"logger={logger}"], capsys)
        assert code == 2 and "pip install 'attnlab[tensorboard]'" in one_clear_line(err), err
    assert not (tmp_path / "runs").exists()


def test_logger_tensorboard_trains_and_writes_event_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    train_main([*FAST, "trainer.max_steps=2", "logger=tensorboard", f"hydra.run.dir={run_dir}"])
    assert read_record(run_dir / "results.json")["status"] == "completed"
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))


# -- 17.4: one run per folder -------------------------------------------------------------------------------
HOLD = ("import sys, time; from attnlab.training.storage import RunFolderLock; RunFolderLock(sys.argv[1]).acquire(); "
        "print('held', flush=True); time.sleep(120)")


def test_a_second_run_in_a_live_run_folder_is_refused_and_touches_nothing(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = run_dir / "results.json"
    record.write_text('{"status": "completed"}\n')
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.chdir(tmp_path)
        code, err = run_cli(train_main, [*FAST, f"hydra.run.dir={run_dir}"], capsys)
        line = one_clear_line(err)
        assert code == 2 and "is in use by another attnlab-train" in line and f"pid {holder.pid}" in line, line
        assert record.read_text() == '{"status": "completed"}\n'
        assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE, "results.json"]  # no .hydra, no log
        # the in-run check (a race past the preflight) refuses too and writes no record
        with pytest.raises(Exception, match="in use by another attnlab-train"):
            RunFolderLock(run_dir).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the owner died without cleaning up: its lock is stale and the next run takes it over
    assert (run_dir / LOCK_FILE).exists() and RunFolderLock.owner(run_dir) is None
    lock = RunFolderLock(run_dir).acquire()
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (run_dir / LOCK_FILE).exists()


def test_a_run_releases_its_folder_lock_when_it_ends(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    train_main([*FAST, "trainer.max_steps=2", f"hydra.run.dir={run_dir}"])
    assert not (run_dir / LOCK_FILE).exists()
    train_main([*FAST, "trainer.max_steps=3", f"hydra.run.dir={run_dir}"])  # resume=auto in the same folder
    assert read_record(run_dir / "results.json")["cost"]["steps"] == 3


# -- 17.3: the disk fills up mid-run --------------------------------------------------------------------------
def _disk_full_after_first_checkpoint(monkeypatch, *, records_too: bool) -> None:
    """torch writes the second checkpoint into a full device (/dev/full: torch raises its own RuntimeError, as
    on a full tmpfs); with ``records_too`` not even a run record fits any more."""
    import attnlab.results.record as record_module

    real_save = torch.save
    calls = {"n": 0}

    def save(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] >= 2:
            with open("/dev/full", "wb") as full:
                return real_save(obj, full, *args, **kwargs)
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    if records_too:
        real_write = record_module.atomic_write_text

        def write(path, text):
            if calls["n"] >= 2:
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            return real_write(path, text)

        monkeypatch.setattr(record_module, "atomic_write_text", write)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("records_too", [False, True], ids=["record-fits", "nothing-fits"])
def test_disk_full_mid_run_is_one_line_keeps_the_checkpoint_and_records_if_it_can(records_too, tmp_path,
                                                                                   monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _disk_full_after_first_checkpoint(monkeypatch, records_too=records_too)
    run_dir = tmp_path / "run"
    code, err = run_cli(train_main, [*SHORT, "callbacks.checkpoint.save_top_k=0", f"hydra.run.dir={run_dir}"],
                        capsys)
    monkeypatch.undo()
    line = one_clear_line(err)
    assert code == 1 and "No space left on device" in line and "intact" in line, line
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [LAST]
    assert load_checkpoint_file(run_dir / "checkpoints" / LAST)["global_step"] == 2
    if records_too:
        assert "no run record could be written" in line, line
        assert not (run_dir / "results.json").exists()
    else:
        record = read_record(run_dir / "results.json")
        assert record["status"] == "failed" and "No space left on device" in record["error"]
    assert not list(run_dir.rglob("*.tmp*")), "partial files left behind"


# -- 17.10: Ctrl-C ---------------------------------------------------------------------------------------------
def test_ctrl_c_writes_an_interrupted_record_and_says_how_to_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    original = Seq2SeqModule.compute_loss

    def compute_loss(self, batch):
        if self.training and self.trainer.global_step == 3:
            raise KeyboardInterrupt
        return original(self, batch)

    monkeypatch.setattr(Seq2SeqModule, "compute_loss", compute_loss)
    run_dir = tmp_path / "run"
    code, err = run_cli(train_main, [*SHORT, f"hydra.run.dir={run_dir}"], capsys)
    monkeypatch.undo()
    line = [ln for ln in err.splitlines() if "error:" in ln][-1]
    assert code == 130 and "Traceback" not in err, err
    assert "interrupted (Ctrl-C) at step 3" in line and "rerun the same command to resume" in line, line
    record = read_record(run_dir / "results.json")
    assert validate_record(record) == []
    assert record["status"] == "interrupted"
    assert record["extra"]["interrupted"]["step"] == 3
    assert record["extra"]["interrupted"]["checkpoint"].endswith(LAST)
    train_main([*SHORT, f"hydra.run.dir={run_dir}"])  # the rerun resumes and completes
    assert read_record(run_dir / "results.json")["status"] == "completed"


# -- 17.6: a run that trained nothing is never completed -------------------------------------------------------
def test_a_run_that_trained_zero_steps_is_not_completed(tmp_path, monkeypatch):
    from attnlab.tasks import DataError
    from tests.conftest import compose

    run_module = importlib.import_module("attnlab.training.run")  # the package exports a function of that name

    monkeypatch.setattr(run_module, "validate", lambda cfg: None)  # as if a new way to an empty split slipped by
    cfg = compose([*FAST, "trainer.limit_train_batches=0"], run_dir=tmp_path / "run")
    with pytest.raises(DataError, match="trained 0 steps"):
        run_module.run(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run" / "results.json").exists()


def test_an_empty_evaluation_split_is_refused_before_training():
    from attnlab.tasks import DataError, TaskData
    from attnlab.training.build import check_splits_not_empty

    task = TaskData(kind="lm", datasets={"train": [1, 2], "val": [1], "test": []}, collate=list, vocab_size=4,
                    pad_id=0, max_len=4)
    with pytest.raises(DataError, match="split test of the task is empty"):
        check_splits_not_empty(task)


# -- 17.9: an unsafe checkpoint --------------------------------------------------------------------------------
class Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_payload_is_reported_as_unsafe_and_never_runs(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "payload.ckpt"
    torch.save({"state_dict": {}, "callbacks": Payload(str(marker))}, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint_file(path)
    message = str(info.value)
    assert "is unsafe and was not loaded" in message and "system" in message, message
    assert "corrupt" not in message
    assert not marker.exists()


# -- 17.5 and 17.11: data lines --------------------------------------------------------------------------------
def test_lines_split_at_newlines_only(tmp_path):
    from attnlab.tasks.sources import read_lines

    path = tmp_path / "train.en"
    path.write_text("one\u2028sentence\r\ntwo\x0cfeed\u0085 next\nthree\u2029end\n", encoding="utf-8")
    assert read_lines(path) == ["one\u2028sentence", "two\x0cfeed\u0085 next", "three\u2029end"]


def test_a_huge_line_is_refused_naming_file_and_line(tmp_path):
    from attnlab.tasks import DataError
    from attnlab.tasks.sources import MAX_LINE_CHARS, read_lines

    path = tmp_path / "train.en"
    path.write_text("short\n" + "x" * (MAX_LINE_CHARS + 1) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"train.en:2: line of {MAX_LINE_CHARS + 1} characters"):
        read_lines(path)


# -- 17.13: a sweep with failed jobs exits non-zero, whatever the launcher -------------------------------------
@pytest.mark.slow
def test_a_parallel_sweep_with_failed_jobs_exits_1_and_lists_them(tmp_path):
    """Jobs in joblib's worker processes: the summary comes from their failed records under the sweep folder,
    which attnlab names up front when the command does not."""
    env = {**os.environ, "ATTNLAB_RUNS_DIR": str(tmp_path / "runs"), "HYDRA_FULL_ERROR": "0",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    (tmp_path / "empty").mkdir()
    done = subprocess.run([sys.executable, "-m", "attnlab.train", "-m", *TINY, "task=lm/wikitext2",
                           f"paths.data_root={tmp_path / 'empty'}", "seed=1,2", "logger=csv",
                           "hydra/launcher=joblib_attnlab", "hydra.launcher.n_jobs=2", "hardware.torch_threads=1"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    summary = done.stderr[done.stderr.index("2 job(s) of the sweep failed"):]
    assert summary.count("not found under") == 2, summary
    assert str(tmp_path / "runs" / "multirun") in summary, summary
