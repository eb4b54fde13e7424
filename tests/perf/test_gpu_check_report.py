"""``make gpu-check`` measures what it claims within its budget (issue 50.2): the gpu tier collected from its
own files, a time box per section, the report written as each row finishes (a SIGTERM keeps every measured
row), a failed run's folder and stderr tail kept, and the training goals judged on the steady state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO))
from benchmarks import gpu_check  # noqa: E402


def test_the_gpu_tier_is_collected_from_the_files_that_hold_it():
    files = gpu_check.gpu_test_files()
    assert {"tests/attention/test_bigbird_fast.py", "tests/attention/test_bigbird_triton.py",
            "tests/test_devices.py"} <= set(files)
    assert "tests/test_cli.py" not in files
    assert all("mark.gpu" in (REPO / f).read_text() for f in files)


def test_each_section_gets_its_share_of_the_time_left():
    budget = gpu_check.Budget(1000)
    boxes = {s: budget.box(s, list(gpu_check.SECTIONS[i:])).seconds for i, s in enumerate(gpu_check.SECTIONS)}
    assert boxes["tests"] == pytest.approx(200, abs=1)
    # with nothing spent, the later sections' boxes are their share of what is left after the earlier ones
    assert boxes["laptop"] == pytest.approx(1000, abs=1)  # the last section gets all that is left
    assert budget.box("laptop", ["training", "laptop"]).seconds == pytest.approx(1000 * 0.15 / 0.5, abs=1)


def test_rows_are_on_disk_as_they_finish_and_a_sigterm_keeps_them(tmp_path, monkeypatch):
    """Row 1 measured, row 2 raises (kept as its own error, the section goes on), row 3 is interrupted by
    SIGTERM: the report on disk holds rows 1 and 2 and says the check did not finish."""
    calls = []

    def fake_row(device, length, causal, **kw):
        calls.append(length)
        on_disk = json.loads((tmp_path / "dry-run.json").read_text())
        assert len((on_disk.get("kernels") or {}).get("rows", [])) == len(calls) - 1  # written before this row
        if len(calls) == 2:
            raise RuntimeError("CUDA out of memory\nmore")
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return {"length": length, "causal": causal, "batch": 1, "kernel": "blocked", "ideal": 1.0, "kernels": {},
                "error": "not run"}

    monkeypatch.setattr(gpu_check, "kernel_row", fake_row)
    with pytest.raises(SystemExit) as stopped:
        gpu_check.main(["--dry-run", "--only", "kernels", "--out", str(tmp_path)])
    assert stopped.value.code == 128 + signal.SIGTERM
    report = json.loads((tmp_path / "dry-run.json").read_text())
    rows = report["kernels"]["rows"]
    assert [r["length"] for r in rows] == [256, 512] and rows[1]["error"] == "RuntimeError: CUDA out of memory"
    assert report["finished"] is False
    assert "did not finish" in (tmp_path / "dry-run.md").read_text()


def test_a_failed_run_keeps_its_folder_and_the_tail_of_its_stderr(tmp_path, monkeypatch):
    def fake_run(cmd, **kw):
        run_dir = next(a.split("=", 1)[1] for a in cmd if a.startswith("hydra.run.dir="))
        os.makedirs(run_dir)
        (tmp_path / "runs" / os.path.basename(run_dir) / "train.log").write_text("step 0\n")
        stderr = "\n".join(f"line {i}" for i in range(100))
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr=stderr)

    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    (tmp_path / "runs").mkdir()
    result = gpu_check.train(["experiment=x"], tmp_path / "runs", timeout=60, failed_runs=tmp_path / "failed")
    assert result["error"] == "line 99"
    assert result["stderr_tail"] == [f"line {i}" for i in range(60, 100)]
    assert (tmp_path / "failed").is_dir() and (gpu_check.Path(result["folder"]) / "train.log").read_text() == "step 0\n"
    md = gpu_check._training_lines({"training": {"row": result}})
    assert "line 99" in "\n".join(md) and result["folder"] in "\n".join(md)


def test_training_goals_read_the_steady_state_and_say_the_whole_run_average():
    full = {"tokens_per_s": 100.0, "steady_tokens_per_s": 120.0, "mfu": 0.2, "steady_mfu": 0.45}
    itc = {"tokens_per_s": 60.0, "steady_tokens_per_s": 180.0}
    report = {"dry_run": False, "training": {"full attention, 4096": full, "BigBird-ITC, 4096": itc}}
    goals = {g["key"]: g for g in gpu_check.goals_of(report)}
    assert goals["35.table10.4096"]["measured"] == pytest.approx(1.5) and goals["35.table10.4096"]["met"] is True
    assert "whole-run averages 0.60x" in goals["35.table10.4096"]["note"]
    assert goals["36.mfu.full attention, 4096"]["measured"] == pytest.approx(0.45)
