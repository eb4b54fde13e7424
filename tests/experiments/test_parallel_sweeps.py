"""Sweeps fill the machine: the reproduce targets run JOBS jobs at once with cores/JOBS threads each."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.experiments.paper_presets import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _train_line(*make_args: str) -> str:
    dry = subprocess.run(["make", "-n", "reproduce-ut-table4", "STAMP=", *make_args],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    return next(line for line in dry.stdout.splitlines() if "attnlab-train -m" in line)


def test_cpu_sweeps_run_jobs_in_parallel_with_cores_split_between_them():
    train = _train_line("CORES=8", "JOBS=4")
    assert "hydra/launcher=joblib_attnlab" in train
    assert "hydra.launcher.n_jobs=4" in train
    assert "hardware.torch_threads=2" in train  # 4 jobs x 2 threads = 8 cores


def test_more_jobs_than_cores_still_gets_one_thread_each():
    assert "hardware.torch_threads=1" in _train_line("CORES=2", "JOBS=3")


def test_gpu_and_explicit_launchers_are_left_alone():
    gpu = _train_line("HARDWARE=gpu8")
    assert "hydra/launcher" not in gpu and "torch_threads" not in gpu
    basic = _train_line("LAUNCHER=basic")
    assert "hydra/launcher=basic" in basic and "n_jobs" not in basic


def test_the_joblib_launcher_composes_with_the_thread_setting():
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="attnlab.conf", version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=joblib_attnlab", "hydra.launcher.n_jobs=2",
                                          "hardware.torch_threads=1"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher")
    assert cfg.hydra.launcher.n_jobs == 2
    assert cfg.hardware.torch_threads == 1


def test_thread_count_does_not_change_the_config_hash():
    """A parallel rerun must find the records of a sequential run (skip-existing) and pool with them."""
    from attnlab.results.record import config_hash

    base = {"model": {"d_model": 128}, "hardware": {"name": "cpu", "torch_threads": None}, "seed": 1}
    threaded = {**base, "hardware": {"name": "cpu", "torch_threads": 1}}
    assert config_hash(base) == config_hash(threaded)


@pytest.mark.slow
def test_parallel_sweep_gives_the_same_metrics_as_a_sequential_one(tmp_path: Path):
    """The same two seeds through joblib (2 jobs x 1 thread) and through the basic launcher (1 thread)."""
    metrics = {}
    for launcher in ("basic", "joblib_attnlab"):
        runs = tmp_path / launcher
        cmd = [sys.executable, "-m", "attnlab.train", "-m", "experiment=demo/copy", "seed=1,2",
               "trainer.max_steps=30", "trainer.val_check_interval=30", "task.train_size=512",
               "task.test_size=32", "task.val_size=32", "hardware.torch_threads=1", "logger=csv",
               f"hydra/launcher={launcher}", f"hydra.sweep.dir={runs}"]
        if launcher == "joblib_attnlab":
            cmd.append("hydra.launcher.n_jobs=2")
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
        for record in sorted(runs.rglob("results.json")):
            data = json.loads(record.read_text())
            metrics[(launcher, data["seed"])] = data["metrics"]["final"]
    for seed in (1, 2):
        assert metrics[("basic", seed)] == metrics[("joblib_attnlab", seed)]
