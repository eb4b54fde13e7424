"""Resuming a run folder with a changed configuration: refused when it changes the experiment, said when not."""

from __future__ import annotations

import json
import shutil

from attnlab.cli.train import main as train_main
from attnlab.training.config import resume_config_changes
from tests.conftest import TINY, TINY_ALGO, train_cli

from .helpers import one_clear_line, run_cli


def test_which_changes_forbid_resuming():
    before = {"optim": {"lr": 1e-3}, "trainer": {"max_steps": 4}, "hardware": {"devices": 1},
              "paths": {"run_dir": "a"}, "model": {"d_model": 64}}
    after = {"optim": {"lr": 0.5}, "trainer": {"max_steps": 8}, "hardware": {"devices": 2},
             "paths": {"run_dir": "b"}, "model": {"d_model": 64, "extra": 1}}
    forbidden, allowed = resume_config_changes(before, after)
    assert forbidden == [("model.extra", None, 1), ("optim.lr", 1e-3, 0.5)]
    assert allowed == [("hardware.devices", 1, 2), ("trainer.max_steps", 4, 8)]  # paths: not the experiment


def test_resuming_with_another_learning_rate_is_refused_and_touches_nothing(trained_run, tmp_path, capsys):
    """Issue 38: the run resumed at its last checkpoint with the new rate, silently; its record then described
    one run made of two configurations."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    before = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    argv = [*TINY, *TINY_ALGO, "logger=csv", "seed=3", f"hydra.run.dir={run_dir}"]
    code, err = run_cli(train_main, [*argv, "optim.lr=0.5"], capsys)
    assert code == 2
    line = one_clear_line(err)
    assert "optim.lr" in line and "0.5" in line and "paths.run_id" in line
    after = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert after == before


def test_resuming_to_train_longer_is_allowed_and_said(trained_run, tmp_path):
    """No ``capsys`` in a test that runs Hydra's job: its console log handler would keep capsys's stream, closed
    after the test, and every later log line of the worker would fail."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    argv = [*TINY, *TINY_ALGO, "logger=csv", "seed=3", f"hydra.run.dir={run_dir}"]
    train_cli(tmp_path, [*argv, "trainer.max_steps=6"])
    # Said where the user reads it: the check runs before Hydra sets up logging (a line logged then reached no
    # console and no file), so the job says it, into the console and train.log.
    assert "with trainer.max_steps 4 -> 6 changed" in (run_dir / "train.log").read_text()
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "completed" and record["cost"]["steps"] == 6


def test_a_sweep_resuming_its_folder_with_another_learning_rate_is_refused_and_touches_nothing(trained_run, tmp_path,
                                                                                                capsys):
    """Issue 38.3, sweeps: a resubmitted sweep (the same hydra.sweep.dir) resumes each job's folder; a changed
    training key is refused before Hydra rewrites any job's .hydra/config.yaml."""
    from tests.conftest import compose

    argv = [*TINY, *TINY_ALGO, "logger=csv", "seed=3"]
    sweep_dir = tmp_path / "sweep"
    job_dir = sweep_dir / f"0-{compose(argv).run_name}-s3"  # hydra.sweep.subdir of job 0 (conf/train.yaml)
    shutil.copytree(trained_run, job_dir)
    before = {p.relative_to(job_dir): p.read_bytes() for p in job_dir.rglob("*") if p.is_file()}
    code, err = run_cli(train_main, ["-m", *argv, "optim.lr=0.5,1e-3", f"hydra.sweep.dir={sweep_dir}"], capsys)
    line = one_clear_line(err)
    assert code == 2 and "sweep job 0" in line and "optim.lr" in line and "0.5" in line, line
    after = {p.relative_to(job_dir): p.read_bytes() for p in job_dir.rglob("*") if p.is_file()}
    assert after == before and sorted(p.name for p in sweep_dir.iterdir()) == [job_dir.name]
