"""Slow tier: real multi-process and end-to-end runs (``make test-slow``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.results.record import read_record

pytestmark = pytest.mark.slow

SMALL = ["model=transformer_tiny", "trainer.max_steps=6", "trainer.val_check_interval=3",
         "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false", "batch.sentences_per_update=16",
         "task.at_scale.cpu.train_size=128", "task.at_scale.cpu.val_size=16", "task.at_scale.cpu.test_size=16",
         "task.at_scale.cpu.train_max_len=8", "task.at_scale.cpu.test_max_len=16"]


def _train(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "attnlab.train", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_multirun_sweep_writes_one_record_per_job(tmp_path):
    sweep = tmp_path / "sweep"
    proc = _train(["-m", *SMALL, "seed=1,2", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = sorted(sweep.glob("*/results.json"))
    assert len(records) == 2
    assert {json.loads(p.read_text())["seed"] for p in records} == {1, 2}


def test_copy_task_is_learned_at_training_length(tmp_path):
    """A real (short) training run: the demo model learns to copy strings of its training lengths."""
    run_dir = tmp_path / "run"
    proc = _train(["experiment=demo/copy", "trainer.max_steps=600", "trainer.val_check_interval=300",
                   "trainer.enable_progress_bar=false", "logger=csv", f"hydra.run.dir={run_dir}"], tmp_path,
                  timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_record(run_dir / "results.json")
    assert record["metrics"]["final"]["test_train_len/char_acc"] > 0.9


@pytest.mark.timeout(600)
def test_ponder_heatmap_notebook_runs(tmp_path, monkeypatch):
    """The notebook draws a UT+ACT run's ponder-time heatmap inline, from the run's files (it never trains)."""
    nbformat = pytest.importorskip("nbformat", reason="notebooks need the dev extras (nbformat, nbclient)")
    from nbclient import NotebookClient

    run_dir = tmp_path / "run"
    (run_dir / "ponder").mkdir(parents=True)
    lines = [{"step": s, "encoder/steps": [[1, 2, 3, 0], [2, 2, 4, 1]], "decoder/steps": [[3, 1, 0, 0], [2, 3, 1, 1]]}
             for s in (50, 100)]  # the format PonderStats writes: per example, per position, ACT steps (0 = pad)
    (run_dir / "ponder" / "steps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    monkeypatch.setenv("ATTNLAB_RUN_DIR", str(run_dir))
    path = Path(__file__).resolve().parents[1] / "notebooks" / "ponder_heatmaps.ipynb"
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2  # the heatmaps and the mean ponder time, shown inline
    assert sorted(p.name for p in run_dir.rglob("*")) == ["ponder", "steps.jsonl"]  # nothing trained or written


def test_configs_work_from_an_installed_wheel(tmp_path):
    """A non-editable install carries its configs: compose from the wheel, outside the source tree."""
    repo = Path(__file__).resolve().parents[1]
    wheel_dir, target = tmp_path / "wheel", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheel_dir), str(repo)], check=True, capture_output=True, timeout=600)
    wheel = next(wheel_dir.glob("attnlab-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=600)
    code = ("import attnlab; from attnlab.training.compose import compose_checked; "
            "cfg = compose_checked('train', ['experiment=demo/copy', 'model/recurrence=ut_act', 'paths.run_dir=x']); "
            "print(attnlab.__file__); print(cfg.model.recurrence.name)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(target)})
    assert out.returncode == 0, out.stderr[-2000:]
    installed_at, recurrence = out.stdout.split()[-2:]
    assert installed_at.startswith(str(target)) and recurrence == "ut_act"
