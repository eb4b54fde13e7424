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
