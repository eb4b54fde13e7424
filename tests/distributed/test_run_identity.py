"""Every rank of a launch names the same run folder, and the cluster environment follows the launcher that
started the ranks (issue 50.3)."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta

import pytest

from attnlab.training.launch import launched_by, shared_run_id
from tests.conftest import REPO, TINY, compose

SBATCH = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NTASKS": "1", "SLURM_PROCID": "0",
          "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
TORCHRUN = {"TORCHELASTIC_RUN_ID": "none", "RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}


def test_the_launcher_that_started_the_ranks_names_the_environment():
    assert launched_by({**SBATCH, **TORCHRUN}) == "torchelastic"  # torchrun inside an sbatch job
    assert launched_by({**SBATCH, "SLURM_NTASKS": "4", "SLURM_PROCID": "3"}) == "slurm"  # srun, one task per rank
    assert launched_by(SBATCH) is None  # one process in an sbatch job
    assert launched_by({}) is None


def test_srun_ranks_share_the_job_step_name_and_a_requeue_keeps_it():
    srun = {**SBATCH, "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"}
    names = {shared_run_id({**srun, "SLURM_PROCID": str(rank)}) for rank in range(4)}
    assert names == {"slurm4242.0"}
    assert shared_run_id({**srun, "SLURM_STEP_ID": "1"}) == "slurm4242.1"  # the job's next srun: a new run
    assert shared_run_id({**srun, "ATTNLAB_RUN_ID": "mine"}) == "mine"
    assert shared_run_id({}, clock=lambda: 0.0) == time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(0.0))


def test_paths_run_id_resolves_through_the_shared_name(monkeypatch):
    monkeypatch.setenv("ATTNLAB_RUN_ID", "launch-7")
    cfg = compose(TINY)
    assert cfg.paths.run_id == "launch-7"


_RANK = """
import json, os, sys, time
from attnlab.training.launch import shared_run_id
print(json.dumps({"own": time.strftime("%Y-%m-%d_%H-%M-%S"), "shared": shared_run_id()}))
"""


def test_torchrun_ranks_started_across_a_second_boundary_name_one_run(tmp_path):
    """Two ranks of a torchrun launch (the agent's store stood up here), the second started after the clock
    has passed a second boundary: each rank's own clock names another folder, the shared name is one."""
    from torch.distributed import TCPStore

    agent = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    env = {**TORCHRUN, "MASTER_PORT": str(agent.port), "PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}
    seen = []
    for rank in (0, 1):
        if rank:
            boundary = int(time.time()) + 1
            time.sleep(max(0.0, boundary - time.time()) + 0.05)
        out = subprocess.run([sys.executable, "-c", _RANK], env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        seen.append(__import__("json").loads(out.stdout.strip().splitlines()[-1]))
    assert seen[0]["own"] != seen[1]["own"]
    assert seen[0]["shared"] == seen[1]["shared"] == seen[0]["own"]


@pytest.mark.parametrize("launcher", ["torchrun_in_sbatch", "srun"])
def test_the_trainer_takes_its_ranks_from_the_launcher(launcher, monkeypatch, tmp_path):
    from lightning.pytorch.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    from attnlab.training.run import build_trainer

    for name in [*SBATCH, *TORCHRUN]:
        monkeypatch.delenv(name, raising=False)
    env = {**SBATCH, **TORCHRUN} if launcher == "torchrun_in_sbatch" else SBATCH
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cfg = compose([*TINY, "hardware=cpu"])
    trainer = build_trainer(cfg, tmp_path, callbacks=[], loggers=[])
    expected = TorchElasticEnvironment if launcher == "torchrun_in_sbatch" else SLURMEnvironment
    assert type(trainer._accelerator_connector.cluster_environment) is expected
