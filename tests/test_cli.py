"""The command line: help, one-line refusals of bad input (exit 2, no traceback, nothing written)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.cli.train import main as train_main


def _run_cli(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        train_main(argv)
    err = capsys.readouterr().err
    return info.value.code, err


BAD_INPUTS = [
    (["model/attention=nonexistent"], "valid options of model/attention: "),
    (["task=algo/nope"], "valid options of task: algo/addition, algo/copy, algo/reverse"),
    (["hardware=tpu"], "valid options of hardware"),
    (["model.d_modl=64"], "model.d_modl"),
    (["trainer.max_step=3"], "trainer.max_step"),
    (["model.d_model=wide"], "model.d_model"),
    (["trainer.max_steps=-1"], "trainer.max_steps=-1 must be positive"),
    (["model.d_model=100", "model.num_heads=8"], "not divisible by model.num_heads=8"),
    (["batch.sentences_per_update=0"], "batch.sentences_per_update=0 must be positive"),
    (["model.positions=rotary"], "valid: sinusoidal, learned, none"),
    (["seed=1", "model="], "model"),
]


@pytest.mark.parametrize(("argv", "fragment"), BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_fails_with_one_clear_line(argv, fragment, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = _run_cli([*argv, f"paths.runs_dir={tmp_path / 'runs'}"], capsys)
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert fragment in lines[0], lines[0]
    assert not (tmp_path / "runs").exists(), "a refused run must not create a run folder"
    assert not (tmp_path / "results").exists()


def test_console_script_help_and_bad_input_in_a_subprocess(tmp_path):
    """The installed entry point itself (not just the function): --help works, bad input exits 2."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    exe = [sys.executable, "-m", "attnlab.train"]
    ok = subprocess.run([*exe, "--help"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert ok.returncode == 0 and "model/attention" in ok.stdout
    bad = subprocess.run([*exe, "model.num_heads=7", "model.d_model=64"], capture_output=True, text=True,
                         timeout=120, env=env, cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "not divisible" in bad.stderr
    assert not Path(tmp_path, "runs").exists()


@pytest.mark.parametrize("module", ["attnlab.train", "attnlab.evaluate", "attnlab.table"])
def test_python_dash_m_entry_points_exist(module):
    import importlib

    assert callable(importlib.import_module(module).main)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("hardware", ["hardware=gpu1", "hardware=gpu8"])
def test_a_gpu_preset_without_a_gpu_is_refused_in_one_line(hardware, capsys, tmp_path, monkeypatch):
    """Issue 38: exit 1 after a 24-line Hydra traceback, with a run folder left behind."""
    monkeypatch.chdir(tmp_path)
    code, err = _run_cli([hardware, "model=transformer_tiny", f"paths.runs_dir={tmp_path / 'runs'}"], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "no CUDA GPU" in lines[0] and "hardware=cpu" in lines[0]
    assert not (tmp_path / "runs").exists()
