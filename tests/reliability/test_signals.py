"""Stop signals and Ctrl-C at every phase of a run (issue 38.4): before training (data, tokenizer, model),
while testing, between phases, a second Ctrl-C while the first is being recorded. Each leaves an
``interrupted`` record that names the step and checkpoint, and the same command then completes the run.
(Signals inside training and validation: test_checkpoints.py and test_kill_resume.py.)"""

from __future__ import annotations

import importlib
import os
import signal

import lightning as L
import pytest

from attnlab.results.record import read_record, validate_record
from attnlab.training.checkpointing import LAST, Preempted
from attnlab.training.stop_signals import RunSignals, StoppedBySignal, signals_deferred
from tests.reliability.helpers import run_with_callbacks

run_module = importlib.import_module("attnlab.training.run")


def _send(signum: int) -> None:
    os.kill(os.getpid(), signum)


# -- the handler itself ---------------------------------------------------------------------------------
def test_raising_stretch_stops_at_once_and_restores_the_handler_before_the_run():
    def before(signum, frame):
        raise AssertionError("the handler from before the run must not run while the run holds the signal")

    old = signal.signal(signal.SIGUSR1, before)
    try:
        with RunSignals() as signals:
            with pytest.raises(StoppedBySignal) as info, signals.raising("while testing", step=7, checkpoint="c"):
                _send(signal.SIGUSR1)
            assert info.value.signum == signal.SIGUSR1 and info.value.step == 7 and info.value.checkpoint == "c"
            assert str(info.value) \
                == "stopped by SIGUSR1 at step 7 while testing; rerun the same command to resume from c"
            assert info.value.previous_handler is before  # the CLI calls it (submitit requeues) after the record
        assert signal.getsignal(signal.SIGUSR1) is before
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_a_signal_between_stretches_is_held_and_served_at_the_next_one():
    before = signal.getsignal(signal.SIGTERM)
    with RunSignals() as signals:
        _send(signal.SIGTERM)  # e.g. while Lightning sets up training: noted, not fatal
        assert signals.pending == signal.SIGTERM
        with pytest.raises(StoppedBySignal, match="at step 3 while testing"), signals.raising("while testing", step=3):
            raise AssertionError("a held signal stops the run on entry, before the stretch does any work")
    assert signal.getsignal(signal.SIGTERM) == before


def test_deferred_signals_let_a_record_finish():
    with signals_deferred() as noted:
        _send(signal.SIGINT)  # a second Ctrl-C while the first one is being recorded
        _send(signal.SIGTERM)
    assert noted == [signal.SIGINT, signal.SIGTERM]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# -- whole runs -------------------------------------------------------------------------------------------
_run = run_with_callbacks


class _AtFirstTestBatch(L.Callback):
    def __init__(self, action) -> None:
        self.action, self.done = action, False

    def on_test_batch_start(self, *args):
        if not self.done:
            self.done = True
            self.action()


def _interrupted(run_dir):
    record = read_record(run_dir / "results.json")
    assert validate_record(record) == [] and record["status"] == "interrupted"
    return record["extra"].get("preempted") or record["extra"]["interrupted"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2, signal.SIGINT],
                         ids=["SIGTERM", "SIGUSR2", "Ctrl-C"])
def test_a_stop_while_preparing_data_is_recorded_and_the_rerun_completes(signum, tmp_path, monkeypatch):
    original = run_module.build_task_data

    def build_then_stop(cfg):  # the signal lands while the data (and tokenizer) are being prepared
        task = original(cfg)
        _send(signum)
        return task

    monkeypatch.setattr(run_module, "build_task_data", build_then_stop)
    with pytest.raises(Preempted) as info:
        _run(tmp_path)
    assert "at step 0" in str(info.value) and "no checkpoint was written yet" in str(info.value)
    said = _interrupted(tmp_path)
    assert said["signal"] == signal.Signals(signum).name and said["step"] == 0 and said["checkpoint"] is None
    assert said["phase"] == "before training" and said["resume_with"] == "pytest"
    assert not (tmp_path / "checkpoints").exists()
    monkeypatch.setattr(run_module, "build_task_data", original)
    assert _run(tmp_path)["status"] == "completed"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_a_stop_while_testing_is_recorded_and_the_rerun_only_tests(signum, tmp_path):
    with pytest.raises(StoppedBySignal) as info:
        _run(tmp_path, callbacks=[_AtFirstTestBatch(lambda: _send(signum))])
    assert "at step 8 while testing" in str(info.value)
    said = _interrupted(tmp_path)
    assert said["signal"] == signal.Signals(signum).name and said["step"] == 8
    assert said["checkpoint"] == str(tmp_path / "checkpoints" / LAST)
    resumed = _run(tmp_path)
    assert resumed["status"] == "completed" and resumed["extra"]["resumed_from"].endswith(LAST)
    assert resumed["cost"]["steps"] == 8


def test_a_second_ctrl_c_while_the_first_is_recorded_still_leaves_the_record(tmp_path, monkeypatch):
    original = run_module.find_resume_checkpoint
    pressed: list[int] = []

    def first_ctrl_c() -> None:
        pressed.append(1)
        _send(signal.SIGINT)

    def impatient(folder):  # once testing was interrupted: Ctrl-C again while the run finds its checkpoint
        if pressed:
            _send(signal.SIGINT)
        return original(folder)

    monkeypatch.setattr(run_module, "find_resume_checkpoint", impatient)
    with pytest.raises(Preempted, match=r"interrupted \(Ctrl-C\) at step 8"):
        _run(tmp_path, callbacks=[_AtFirstTestBatch(first_ctrl_c)])
    said = _interrupted(tmp_path)
    assert said["signal"] == "SIGINT" and said["checkpoint"] == str(tmp_path / "checkpoints" / LAST)
    monkeypatch.setattr(run_module, "find_resume_checkpoint", original)
    assert _run(tmp_path)["status"] == "completed"
