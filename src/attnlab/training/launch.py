"""Which process of a multi-process launch this one is, read before any process group exists.

A DDP run is several processes running the same command: Lightning's subprocess launcher starts local ranks
1..n-1 itself (``LOCAL_RANK``, and ``NODE_RANK``/``GROUP_RANK`` on the other nodes), torchrun starts every rank
(``RANK``), SLURM starts one task per rank (``SLURM_PROCID``). Only global rank 0 owns the run folder: it takes
the folder lock, writes the config, the record, failure records and the log ``train.log``; every other rank
trains and writes nothing of its own but ``train.<position>.log`` (``log_file_name``). Imports neither torch
nor Lightning, so the command-line preflight can ask before a run starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def _as_int(value: str | None) -> int:
    try:
        return int(value) if value not in (None, "") else 0
    except ValueError:
        return 0


def launch_position(environ: Mapping[str, str] | None = None) -> str:
    """Where this process sits in the launch: ``""`` for global rank 0, else ``rank<N>`` (torchrun, SLURM) or
    ``node<K>-local<J>`` (Lightning's launcher, whose global rank needs the device count; only zero or not
    matters here)."""
    env = os.environ if environ is None else environ
    for name in ("RANK", "SLURM_PROCID"):
        if env.get(name) not in (None, ""):
            rank = _as_int(env.get(name))
            return f"rank{rank}" if rank else ""
    node = _as_int(env.get("NODE_RANK", env.get("GROUP_RANK")))
    local = _as_int(env.get("LOCAL_RANK"))
    return f"node{node}-local{local}" if (node or local) else ""


def is_launch_rank_zero(environ: Mapping[str, str] | None = None) -> bool:
    return launch_position(environ) == ""


def log_file_name(environ: Mapping[str, str] | None = None) -> str:
    """``train.log`` for rank 0, ``train.<position>.log`` for the others: one writer per file."""
    position = launch_position(environ)
    return f"train.{position}.log" if position else "train.log"


def processes_started_outside(environ: Mapping[str, str] | None = None) -> bool:
    """True when torchrun or SLURM started this job's processes (Lightning then spawns none of its own)."""
    env = os.environ if environ is None else environ
    return "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env) or _as_int(
        env.get("SLURM_NTASKS")) > 1


def launched_by(environ: Mapping[str, str] | None = None) -> str | None:
    """Which launcher started this process's ranks: ``"torchelastic"`` (torchrun, also inside an sbatch job,
    where SLURM's variables are present too but describe the job, not the ranks), ``"slurm"`` (srun started
    one task per rank), or None (one process, or Lightning's own launcher)."""
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchelastic"
    if env.get("SLURM_PROCID") not in (None, "") and _as_int(env.get("SLURM_NTASKS")) > 1:
        return "slurm"
    return None


# The run id of a launch, once agreed: every resolution in this process returns it.
_AGREED: dict[str, str] = {}
STORE_KEY = "attnlab/run_id"
STORE_TIMEOUT_S = 120.0


def shared_run_id(environ: Mapping[str, str] | None = None, *, clock=None, store=None) -> str:
    """The name of this launch's run, the same in every rank (``${attnlab_run_id:}``, the default
    ``paths.run_id`` and multirun folder).

    - ``ATTNLAB_RUN_ID`` when set (by hand, or inherited).
    - torchrun: the first rank to ask sets the current time (``YYYY-mm-dd_HH-MM-SS``) in the launch agent's
      store (``MASTER_ADDR:MASTER_PORT``, ``compare_set``: atomic), every rank reads it back; a worker group
      restarted by torchrun reads the same name, so it resumes its run.
    - ranks started by srun: ``slurm<job id>.<step id>``: the same in every task of the step, new for each srun
      of a job, and again the same after SLURM requeues the job (which then resumes).
    - otherwise (one process; Lightning's launcher passes rank 0's folder to the ranks it starts): the time.

    Each process started its clock on its own, so naming from the time in every rank could split a launch that
    straddles a second over two folders (on resume only rank 0 found the checkpoint).
    """
    env = os.environ if environ is None else environ
    if env.get("ATTNLAB_RUN_ID"):
        return env["ATTNLAB_RUN_ID"]
    import time

    now = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(clock() if clock else None))
    launcher = launched_by(env)
    if launcher == "slurm":
        return f"slurm{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_STEP_ID', '0')}"
    if launcher != "torchelastic":
        return now
    key = f"{env.get('TORCHELASTIC_RUN_ID')}@{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"
    if key not in _AGREED:
        if store is None:
            store = _agent_store(env)
        _AGREED[key] = _as_text(store.compare_set(STORE_KEY, "", now))
    return _AGREED[key]


def _agent_store(env: Mapping[str, str]):
    """A client of the torchrun agent's TCP store (the one its workers rendezvous through)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    host, port = env.get("MASTER_ADDR"), _as_int(env.get("MASTER_PORT"))
    if not host or not port:
        raise RuntimeError("torchrun started this process without MASTER_ADDR/MASTER_PORT; set paths.run_id so "
                           "that every rank names the run the same")
    return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=STORE_TIMEOUT_S))


def _as_text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
