"""The run record (``results.json``) built from a run's trainer, module and callbacks, or from its config alone when
the run failed or stopped before those existed, and the writers that put it in the run folder. The record's
schema, hashing and file format are ``results/record.py``; this module fills it in from training state: provenance
(``git_state``), metrics, cost, and how the run stopped. It also holds what finds a run's record again: the hash of
the config as asked (``asked_config_hash``) and a completed record of that hash (``completed_twin``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

import attnlab
from attnlab.results.lookup import find_completed, search_roots, skip_existing_requested
from attnlab.results.record import (
    CHECKPOINTS_DIR,
    RECORD_FILENAME,
    AttentionCoverage,
    Cost,
    Extra,
    Metrics,
    ParamCount,
    read_record,
    record_header,
    write_record,
)
from attnlab.tasks import TaskData
from attnlab.training.build import run_flavours
from attnlab.training.callbacks import BestMetrics, RunCost, Throughput
from attnlab.training.checkpointing import Preempted, checkpoint_step, find_resume_checkpoint
from attnlab.training.config_hash import asked_config_hash
from attnlab.training.data import example_length
from attnlab.training.modules import TaskModule, count_parameters
from attnlab.training.nonfinite_guard import NonFiniteGuard
from attnlab.training.perf import MFUCallback, mfu
from attnlab.training.sparsity import coverage_summary, dense_coverage, sparse_modules
from attnlab.training.stop_signals import Interrupted, StoppedBySignal, signals_deferred
from attnlab.training.storage import StorageError, storage_failure

log = logging.getLogger("attnlab")


class RunClock(NamedTuple):
    """When a run started: wall time (``time.time``) and this process's CPU time (``time.process_time``; a
    launcher worker runs several jobs, so the CPU clock is read per run, not since the process started)."""

    wall: float
    cpu: float


def git_state(source: Path | None = None) -> dict[str, Any]:
    """Commit and dirty flag of the source tree attnlab runs from (None outside a git checkout).

    ``dirty`` ignores ``results/``: the reproduce targets regenerate the committed tables there after each sweep,
    so a clean worktree that has already run one table would otherwise mark every later record dirty although
    nothing that decides what runs (code, configs, Makefile) has changed."""
    src = (source or Path(attnlab.__file__)).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no", "--",
                                     ":(top)", ":(top,exclude)results"],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
        return {"commit": commit, "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _finite(value: Any) -> float | None:
    v = float(value)
    return v if math.isfinite(v) else None


def collect_metrics(trainer: L.Trainer) -> dict[str, float | None]:
    keep = ("val/", "test", "model/")
    return {k: _finite(v) for k, v in sorted(trainer.callback_metrics.items()) if k.startswith(keep)}


def mfu_summary(callbacks: list) -> dict[str, Any]:
    """The MFU callback's run summary (``mfu``, ``flops_per_token``, ``peak_flops``, ``peak_source``), or
    ``mfu: None`` when ``callbacks.mfu`` is off."""
    found = next((c for c in callbacks if isinstance(c, MFUCallback)), None)
    return found.summary() if found is not None else {"mfu": None}


def steady_summary(throughput, callbacks: list, world_size: int) -> dict[str, Any]:
    """The steady-state figures (``Throughput.steady_state``) and the MFU at that speed (per device)."""
    steady = throughput.steady_state(world_size)
    summary = mfu_summary(callbacks)
    tps = steady["steady_tokens_per_s"]
    steady["steady_mfu"] = (mfu(summary["flops_per_token"], tps / max(world_size, 1), summary["peak_flops"])
                            if tps and summary.get("flops_per_token") else None)
    return steady


def peak_memory_mb(device: torch.device | None = None) -> float | None:
    if torch.cuda.is_available() and device is not None and device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource  # Unix only: elsewhere the peak is unknown

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss / 1024 if sys.platform != "darwin" else rss / 2**20
    except (ImportError, OSError):
        return None


def run_record(cfg: DictConfig, run_dir: Path, command: str, trainer: L.Trainer, module: TaskModule,
            callbacks: list, task: TaskData, started: RunClock, *, status: str, config_hash: str | None,
            flavours: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """The record of a run that trained: what the callbacks measured; ``flavours`` adds metric flavours (the test
    weights), ``extra`` fields of :class:`Extra` (the test checkpoint, how the run was stopped)."""
    throughput = next(c for c in callbacks if isinstance(c, Throughput))
    best = next(c for c in callbacks if isinstance(c, BestMetrics))
    guard = next(c for c in callbacks if isinstance(c, NonFiniteGuard))
    cost = next((c for c in callbacks if isinstance(c, RunCost)), None)
    totals = cost.totals() if cost is not None else RunCost(started.wall, started.cpu).totals()
    wandb_id = next((lg.experiment.id for lg in trainer.loggers if lg.__class__.__name__ == "WandbLogger"), None)
    return record_header(
        config_value(cfg), status=status, config_hash=config_hash, git=git_state(), run_dir=str(run_dir.resolve()),
        command=command, created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        metrics=Metrics(final=collect_metrics(trainer) if status == "completed" else {}, best=dict(best.best)),
        params=ParamCount(**count_parameters(module.model)),
        # every segment of a resumed run (RunCost); the clock of this one where the callback is not there
        cost=Cost(wall_s=round(totals["wall_s"], 2), cpu_s=round(totals["cpu_s"], 2), segments=totals["segments"],
                  torch_threads=torch.get_num_threads(), tokens_per_s=throughput.average_tokens_per_s(),
                  step_s=throughput.average_step_s(), peak_mem_mb=peak_memory_mb(module.device),
                  steps=trainer.global_step,
                  startup_s=round(throughput.first_batch_at - started.wall, 2) if throughput.first_batch_at else None,
                  # callbacks.mfu: against the matmul peak measured in the same process on CPU (the datasheet
                  # peak on listed GPUs); see training/perf.py
                  **mfu_summary(callbacks), **steady_summary(throughput, callbacks, trainer.world_size)),
        metric_flavours={**run_flavours(cfg, task), **(flavours or {})},
        wandb_run_id=wandb_id,
        versions={"python": platform.python_version(), "torch": torch.__version__, "lightning": L.__version__,
                  "attnlab": attnlab.__version__},
        extra=Extra(debug=cfg.get("debug_mode"), skipped_batches=guard.skipped, **_attention_coverage(module, task),
                    **attention_kernels(module), **extra),
    )


def config_value(cfg: DictConfig):
    """``config_value(key)`` for :func:`attnlab.results.record.record_header`: the resolved value of a dotted key,
    None where it is absent or cannot be resolved (a run can fail on a broken config, and its failure record is
    still written); the precision as a string, as Lightning's names are."""

    def value(key: str) -> Any:
        try:
            found = OmegaConf.select(cfg, key)
        except Exception:  # noqa: BLE001 - a broken config must still yield a failure record
            found = None
        return str(found) if key == "hardware.precision" else found

    return value


def attention_kernels(module: TaskModule) -> dict[str, Any]:
    """``attention_kernels``: the kernels that served the attention modules that can choose one (BigBird's
    ``impl``: triton, flex, blocked, reference, or dense under its fallback rule), as they ran in this process
    (``impl=auto`` decides at the run's shapes); nothing where no module chooses."""
    used = [m.kernels_used for m in module.model.modules() if isinstance(getattr(m, "kernels_used", None), set)]
    return {"attention_kernels": sorted(set().union(*used))} if used else {}


def _attention_coverage(module: TaskModule, task: TaskData) -> dict[str, Any]:
    """``attention_coverage``: the sparse attention's attended fraction over the test split's lengths
    (training/sparsity.py); 1.0 for a bidirectional encoder's dense attention; nothing for other dense models."""
    test = task.datasets.get(next(iter(task.eval_splits.values()), "test"))
    if test is None:
        return {}
    lengths = (example_length(test[i]) for i in range(len(test)))
    if not sparse_modules(module.model):
        dense = dense_coverage(module.model, lengths)
        return {"attention_coverage": AttentionCoverage(**dense)} if dense else {}
    summary = coverage_summary(module.model, lengths)
    if summary is None:
        return {}
    log.info("sparse attention attends %.1f%% of the keys on average (max %.1f%%) over test lengths %d-%d",
             100 * summary["attended_fraction_mean"], 100 * summary["attended_fraction_max"],
             summary["lengths"]["min"], summary["lengths"]["max"])
    return {"attention_coverage": AttentionCoverage(**summary)}


def write_interrupted_record(cfg, run_dir, command, trainer, module, callbacks, task, started,
                              exc: Preempted, config_hash: str | None) -> None:
    """An ``interrupted`` record: the run is unfinished, its checkpoint is on disk, and a rerun resumes it
    (``extra.interrupted`` for Ctrl-C, ``extra.preempted`` for a stop signal)."""
    if not trainer.is_global_zero:
        return
    command = command or shlex.join(sys.argv)
    key = "interrupted" if isinstance(exc, Interrupted) else "preempted"
    record = run_record(cfg, run_dir, command, trainer, module, callbacks, task, started, status="interrupted",
                     config_hash=config_hash, **{key: {"signal": signal.Signals(exc.signum).name, "step": exc.step,
                                                       "checkpoint": exc.checkpoint, "resume_with": command}})
    try:
        with storage_errors(run_dir), signals_deferred():
            write_record(run_dir / RECORD_FILENAME, record)
    except StorageError as failure:
        log.error("%s", failure)  # the stop itself is reported by the caller


def stopped_before_training(cfg: DictConfig, run_dir: Path, command: str | None,
                             exc: StoppedBySignal | KeyboardInterrupt) -> Preempted:
    """Ctrl-C or a stop signal before training started: an ``interrupted`` record made from the config, and
    the exception the CLI reports (a resumed run may have checkpoints: the rerun resumes from the newest)."""
    with signals_deferred():  # a further Ctrl-C may not cut the search short (the record defers its own)
        found = find_resume_checkpoint(run_dir / CHECKPOINTS_DIR)
    step, checkpoint = (checkpoint_step(found[1]), str(found[0])) if found else (0, None)
    if isinstance(exc, KeyboardInterrupt):
        stopped: Preempted = Interrupted(step, checkpoint)
    else:
        stopped = StoppedBySignal(exc.signum, step, checkpoint, exc.where, exc.previous_handler)
    key = "interrupted" if isinstance(stopped, Interrupted) else "preempted"
    command = command or shlex.join(sys.argv)
    write_config_record(cfg, run_dir, command, status="interrupted",
                        extra=Extra(**{key: {"signal": signal.Signals(stopped.signum).name, "step": step,
                                             "checkpoint": checkpoint, "resume_with": command,
                                             "phase": "before training"}}))
    return stopped


@contextlib.contextmanager
def storage_errors(run_dir: Path):
    """Writes in the run folder: a full disk (or a folder gone read-only) becomes one StorageError line."""
    try:
        yield
    except OSError as exc:
        failure = storage_failure(exc, run_dir)
        if failure is None:
            raise
        raise failure from None


def write_failed_record(cfg: DictConfig, run_dir: str | os.PathLike, command: str, error: str) -> bool:
    """A run record with ``status: failed`` and the reason, so sweeps and tables show the failure; False
    when the folder cannot take it (a full disk), with nothing half-written."""
    return write_config_record(cfg, run_dir, command, status="failed", error=error)


def record_failure(cfg: DictConfig, run_dir: str | os.PathLike, command: str, reason: str) -> str:
    """Write the failed record; the reason, plus a note when the folder could not take even that record."""
    if write_failed_record(cfg, run_dir, command, reason):
        return reason
    return f"{reason}; no run record could be written in {run_dir}"


def write_config_record(cfg: DictConfig, run_dir: str | os.PathLike, command: str, *, status: str,
                        error: str | None = None, extra: Extra | None = None) -> bool:
    """A run record made from the config alone (the run failed or stopped before its model or trainer
    existed); False when the folder cannot take it, with nothing half-written. A second Ctrl-C or stop
    signal waits until the record is on disk."""
    record = record_header(config_value(cfg), status=status, error=error, config_hash=asked_config_hash(cfg),
                           git=git_state(), run_dir=str(Path(run_dir).resolve()), command=command,
                           created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           versions={"python": platform.python_version(), "torch": torch.__version__,
                                     "attnlab": attnlab.__version__},
                           **({"extra": extra} if extra is not None else {}))
    try:
        with signals_deferred():
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            write_record(Path(run_dir) / RECORD_FILENAME, record)
    except OSError as exc:
        log.debug("no %s record written in %s: %s", status, run_dir, exc)
        return False
    return True


def completed_twin(cfg: DictConfig) -> dict[str, Any] | None:
    """With ATTNLAB_SKIP_EXISTING=1 (``make reproduce-*`` sets it): the record of a completed run of the
    same config hash under ``paths.runs_dir``, so a re-run of a table trains only what is missing."""
    if not skip_existing_requested():
        return None
    # runs/ and the published results/runs: a clean clone skips what is committed.
    done = find_completed(search_roots(cfg.paths.runs_dir), asked_config_hash(cfg))  # the hash the record carries
    if done is None:
        return None
    log.info("skipping: a completed run with the same config hash exists: %s", done)
    return read_record(done)

