"""Hostile environments (issue 38.6): a runs folder that is a file, an unusable HOME, wandb switched off, paths
with spaces and quotes, a sweep with a mistyped choice, the hub without network."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from attnlab.cli.train import main as train_main
from attnlab.tasks import sources
from tests.conftest import TINY, TINY_ALGO, train_cli

from .helpers import one_clear_line, run_cli


def test_a_runs_folder_that_is_a_file_is_one_line_and_no_folder(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "runs"
    runs.write_text("not a folder")
    monkeypatch.setenv("ATTNLAB_RUNS_DIR", str(runs))
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(train_main, [*TINY, *TINY_ALGO], capsys)
    line = one_clear_line(err)
    assert code == 2 and f"{runs} is a file" in line, line


def test_an_unusable_home_gives_matplotlib_a_temporary_folder_quietly(tmp_path):
    home = tmp_path / "home"
    home.write_text("a file where HOME should be")  # as a read-only or missing HOME on a cluster node
    env = {k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "XDG_CONFIG_HOME")}
    out = subprocess.run([sys.executable, "-c", "import attnlab.cli.common, os, matplotlib; "
                          "print(os.environ['MPLCONFIGDIR'])"],
                         env={**env, "HOME": str(home)}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr == "", out.stderr  # matplotlib printed two lines here before
    assert os.path.isdir(out.stdout.strip()) and "attnlab-matplotlib-" in out.stdout


def test_wandb_switched_off_and_a_run_folder_with_spaces_and_quotes(tmp_path, monkeypatch):
    """logger=wandb under WANDB_MODE=disabled trains with its CSV log and records no wandb run; a folder named
    with a space and both quotes is made as named, and the record's command pastes back into a shell."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run_dir = tmp_path / "my runs" / "it's \"one\""
    train_cli(tmp_path, [*TINY, *TINY_ALGO, "logger=wandb", f"hydra.run.dir='{run_dir}'".replace("'s", "\\'s")])
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "completed" and record["wandb_run_id"] is None
    assert not (run_dir / "wandb").exists() and (run_dir / "csv" / "metrics.csv").is_file()
    argv = shlex.split(record["command"])
    assert argv[0] == "attnlab-train" and "logger=wandb" in argv


def test_a_sweep_with_a_mistyped_choice_is_refused_before_any_job(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    code, err = run_cli(train_main, ["-m", *TINY, *TINY_ALGO, "model/attention=vanilla,synth_dens",
                                     f"hydra.sweep.dir={sweep}"], capsys)
    line = one_clear_line(err)
    assert code == 2 and "sweep choice model/attention=synth_dens" in line and "synth_dense" in line, line
    assert "no job was started" in line and not sweep.exists()


def test_without_network_a_hub_dataset_is_refused_in_seconds(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens, as offline
    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(sources, "_HUB_REACHABLE", {})
    monkeypatch.setattr(sources, "maybe_cached", lambda hub_id: False)
    started = time.monotonic()
    with pytest.raises(sources.HubUnavailable) as info:
        sources.load_hub_dataset("nyu-mll/glue", "cola", local_hint="use task.source=local")
    assert time.monotonic() - started < sources.HUB_PROBE_TIMEOUT_S + 2
    message = str(info.value)
    assert "\n" not in message and "no connection to http://127.0.0.1:9" in message and "task.source=local" in message


def test_without_network_a_cached_hub_dataset_is_read_in_offline_mode(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    for key in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):  # "0": not offline, and monkeypatch undoes the switch
        monkeypatch.setenv(key, "0")
    if "datasets" in sys.modules:  # imported by another test: the switch also sets its settings; restore them
        import datasets
        import huggingface_hub

        for module, name in ((datasets.config, "HF_DATASETS_OFFLINE"), (datasets.config, "HF_HUB_OFFLINE"),
                             (huggingface_hub.constants, "HF_HUB_OFFLINE")):
            monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.setattr(sources, "_HUB_REACHABLE", {})
    monkeypatch.setattr(sources, "maybe_cached", lambda hub_id: True)
    sources.go_offline_if_unreachable("nyu-mll/glue", "nyu-mll/glue/cola", "use task.source=local")
    assert os.environ["HF_DATASETS_OFFLINE"] == "1" and os.environ["HF_HUB_OFFLINE"] == "1"
