"""Multi-process launches: which process owns the run folder, and sweeps that would start processes."""

from __future__ import annotations

import pytest

from attnlab.cli.train import main as train_main
from attnlab.training.launch import is_launch_rank_zero, launch_position, log_file_name, processes_started_outside
from attnlab.training.storage import RunFolderLock

# (environment a launcher sets, position, rank zero)
LAUNCHES = [
    ({}, "", True),  # a plain single-process run
    ({"LOCAL_RANK": "0", "NODE_RANK": "0", "WORLD_SIZE": "2"}, "", True),  # Lightning's parent, after spawning
    ({"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"}, "node0-local1", False),  # Lightning's child
    ({"NODE_RANK": "1"}, "node1-local0", False),  # the first process of node 1 (Lightning, multi-node)
    ({"GROUP_RANK": "2", "LOCAL_RANK": "0"}, "node2-local0", False),
    ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8"}, "", True),  # torchrun
    ({"RANK": "9", "LOCAL_RANK": "1", "WORLD_SIZE": "16"}, "rank9", False),  # torchrun, LOCAL_RANK not global
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, "", True),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "3"}, "rank3", False),
]


@pytest.mark.parametrize(("env", "position", "zero"), LAUNCHES, ids=[p or "zero" for _, p, _ in LAUNCHES])
def test_launch_position_from_each_launchers_variables(env, position, zero):
    assert launch_position(env) == position
    assert is_launch_rank_zero(env) is zero
    assert log_file_name(env) == ("train.log" if zero else f"train.{position}.log")


def test_processes_started_outside_lightning():
    assert not processes_started_outside({})
    assert not processes_started_outside({"LOCAL_RANK": "1", "WORLD_SIZE": "2"})  # Lightning's own child
    assert processes_started_outside({"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "2"})
    assert processes_started_outside({"SLURM_NTASKS": "8", "SLURM_PROCID": "0"})
    assert not processes_started_outside({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"})  # one task: Lightning spawns


@pytest.mark.parametrize("hardware", ["hardware=ddp_sim", "hardware=cpu,ddp_sim", "hardware.devices=1,2"])
def test_a_sweep_that_would_spawn_processes_is_refused_in_one_line(hardware, tmp_path, monkeypatch, capsys):
    """Lightning starts a DDP child by rerunning the command: inside -m that child reruns the whole sweep."""
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", "SLURM_NTASKS", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        train_main(["-m", hardware, "seed=1,2", f"paths.runs_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "cannot run hardware=" in lines[0] and "torchrun" in lines[0], err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "multirun").exists()


def test_a_rank_other_than_zero_trains_in_rank_zeros_folder_and_writes_nothing(tmp_path, monkeypatch):
    """Lightning's child finds the folder locked by rank 0 (its parent): it must train there, not refuse,
    and never take the lock, save the config or write a record (before issue 42 it exited 'in use').
    No ``capsys`` here: Hydra's job logging would bind a console handler to capsys's stream, which is closed
    after the test, and every later log line of this worker would fail."""
    import attnlab.training.run as run_module

    run_dir = tmp_path / "run"
    held = RunFolderLock(run_dir).acquire()  # rank 0, alive
    calls = []

    def fake_run(cfg, *, run_dir, command, cli_overrides):
        calls.append(run_dir)
        return {"metrics": {"final": {}}, "run_dir": run_dir}

    monkeypatch.setattr(run_module, "run", fake_run)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("NODE_RANK", "0")
    try:
        train_main(["model=transformer_tiny", f"hydra.run.dir={run_dir}", "hydra.output_subdir=null"])
    finally:
        held.release()
    assert calls == [str(run_dir)]
    assert not (run_dir / "results.json").exists() and not (run_dir / ".hydra").exists()
    assert (run_dir / "train.node0-local1.log").is_file() and not (run_dir / "train.log").exists()
