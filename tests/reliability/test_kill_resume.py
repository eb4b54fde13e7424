"""Slow tier: a training run in a subprocess is killed at a random step (SIGKILL: no chance to save;
SIGTERM: it saves and exits), then the same command is run again. The resumed run must end with exactly
the final metrics, weights and CSV log of an uninterrupted run (CPU, deterministic mode)."""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.reliability.helpers import same_weights

pytestmark = pytest.mark.slow

ARGS = ["model=transformer_tiny", "task=algo/copy", "task.at_scale.cpu.train_size=96", "task.at_scale.cpu.val_size=16",
        "task.at_scale.cpu.test_size=16", "task.at_scale.cpu.train_max_len=8", "task.at_scale.cpu.test_max_len=12",
        "batch.sentences_per_update=8", "batch.eval_batch_size=16", "optim.warmup_steps=4",
        "trainer.max_steps=48", "trainer.val_check_interval=10", "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false", "trainer.deterministic=true", "model.dropout=0.1",
        "model.attention_dropout=0.1", "callbacks.checkpoint.every_n_steps=3", "logger=csv", "seed=11"]
TRIALS = 3
OUTCOMES: list[dict] = []


def _start(run_dir: Path, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"}
    return subprocess.Popen([sys.executable, "-m", "attnlab.train", *ARGS, f"hydra.run.dir={run_dir}"], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, timeout: int = 900) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def _saved_step(run_dir: Path) -> int:
    try:
        return int(torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"])
    except Exception:  # noqa: BLE001 - not written yet, or being replaced right now
        return -1


def _csv(run_dir: Path) -> list[dict]:
    with (run_dir / "csv" / "metrics.csv").open() as f:
        return [{k: v for k, v in row.items() if v and not k.startswith("perf/")} for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    code, err = _finish(_start(run_dir, run_dir.parent))
    assert code == 0, err[-3000:]
    return run_dir


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("trial", range(TRIALS))
def test_killed_and_resumed_run_matches_an_uninterrupted_one(signum, trial, reference, tmp_path):
    rng = random.Random(1000 * trial + signum)
    target = rng.randint(4, 40)  # the update after which the signal is sent (approximately: see below)
    run_dir = tmp_path / "run"
    proc = _start(run_dir, tmp_path)
    deadline = time.time() + 600
    while _saved_step(run_dir) < target - 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 0.6))  # land anywhere: mid-update, mid-validation, mid-save
    if proc.poll() is not None:
        pytest.fail(f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}")
    proc.send_signal(signum)
    code, err = _finish(proc)
    saved = _saved_step(run_dir)
    if signum == signal.SIGTERM:
        assert code == 128 + signal.SIGTERM, err[-3000:]
        assert "stopped by SIGTERM at step" in err and "Traceback" not in err, err[-3000:]
        assert json.loads((run_dir / "results.json").read_text())["status"] == "interrupted"
    else:
        assert code == -signal.SIGKILL
    assert not list((run_dir / "checkpoints").glob("*.tmp-*")) or signum == signal.SIGKILL

    code, err = _finish(_start(run_dir, tmp_path))  # the same command again resumes
    assert code == 0, err[-3000:]
    ours = json.loads((run_dir / "results.json").read_text())
    ref = json.loads((reference / "results.json").read_text())
    matched = {
        "metrics": ours["metrics"] == ref["metrics"],
        "weights": same_weights(run_dir / "checkpoints" / "last.ckpt", reference / "checkpoints" / "last.ckpt"),
        "csv": _csv(run_dir) == _csv(reference),
    }
    OUTCOMES.append({"signal": signal.Signals(signum).name, "trial": trial, "resumed_from_step": saved,
                     **matched})
    print(f"\n{signal.Signals(signum).name} trial {trial}: resumed from step {saved}; matched: {matched}")
    assert ours["status"] == "completed" and ours["cost"]["steps"] == 48
    assert all(matched.values()), matched


def test_report_kill_and_resume_outcomes():
    """Runs last in this module: how many trials matched exactly (the issue's closing note asks for it)."""
    if not OUTCOMES:
        pytest.skip("no kill-and-resume trial ran in this session")
    exact = sum(all(o[k] for k in ("metrics", "weights", "csv")) for o in OUTCOMES)
    print(f"\nkill-and-resume: {exact} of {len(OUTCOMES)} trials matched the uninterrupted run exactly")
    for o in OUTCOMES:
        print(f"  {o}")
    assert exact == len(OUTCOMES)
