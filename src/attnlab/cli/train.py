"""``attnlab-train``: the Hydra entry point over ``attnlab.training.run``; it parses, calls and reports.

Before Hydra starts a single run, the config is composed and checked once (``training.preflight``), so bad input
gets one line, exit code 2, and no run folder. Whatever goes wrong after that is written to the run
record (``status: failed`` and why) and wandb is closed, so a multirun goes on with its next job:

- bad input found late (data, checkpoint files): one line, exit 2;
- a NaN/Inf loss or a run folder that cannot take the files: one line, exit 1;
- a stop signal (SIGTERM, SIGUSR1, SIGUSR2): checkpoint saved, one line, exit 128+signal, or submitit's
  handler requeues the job;
- anything unexpected: recorded, then re-raised with its traceback (a bug to report); in a multirun the
  traceback goes to the job's log and the sweep goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import sys
import time
from pathlib import Path

import hydra
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from omegaconf import Container, DictConfig, OmegaConf

from attnlab.cli.common import (
    HYDRA_FLAGS,
    REPORTED,
    USER_ERRORS,
    exit_code,
    fail,
    failures_reported,
    one_line,
    quiet_lightning,
)
from attnlab.results.record import RECORD_FILENAME
from attnlab.training.compose import check_group_choices, compose_shown
from attnlab.training.launch import is_launch_rank_zero
from attnlab.training.preflight import (
    RUN_DIR_PARTS,
    check_no_spawned_processes,
    check_resume_keeps_the_config,
    check_run_folder,
    check_sweep,
    planned_dir,
)
from attnlab.training.scale import save_config_that_runs
from attnlab.training.storage import RunFolderLock, StorageError, check_inside, check_run_folder_entries
from attnlab.training.sweeps import failed_sweep_records, optimized_value, sweep_resume_hint

log = logging.getLogger("attnlab")


@hydra.main(config_path="pkg://attnlab.conf", config_name="train", version_base="1.3")
def hydra_main(cfg: DictConfig) -> float | None:
    """One run; returns its ``optimized_metric`` (for a sweeper such as Optuna's), or None where none is asked."""
    record = train_job(cfg)
    return optimized_value(record, cfg.get("optimized_metric")) if record is not None else None


def train_job(cfg: DictConfig) -> dict | None:
    """The job of one run: its record, or None where the job failed inside a sweep (reported at the end)."""
    from attnlab.training.checkpointing import Preempted  # torch and Lightning: not for --cfg job or a refusal
    from attnlab.training.record_writers import record_failure
    from attnlab.training.run import run
    from attnlab.training.wandb_run import close_wandb

    quiet_lightning()
    while _SAY_WHEN_LOGGING:
        log.info("%s", _SAY_WHEN_LOGGING.pop(0))
    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    # Shell-quoted, so the record's command (and "resume_with") can be pasted back: a path with a space or a
    # quote stays one argument. Plain overrides come out unquoted, as they were typed.
    command = shlex.join(["attnlab-train", *overrides])
    multirun = hc.mode.name == "MULTIRUN"
    out = hc.runtime.output_dir
    if not is_launch_rank_zero():
        # Another process of a DDP run (Lightning's child, a torchrun or SLURM rank): global rank 0 owns the
        # folder (lock, config, records); this one trains and writes nothing of its own but its log.
        _run_as_other_rank(cfg, out, command, overrides)
        return
    if multirun:
        try:  # main() refused such a sweep already; this catches a choice it could not expand (a range)
            check_no_spawned_processes(cfg)
        except USER_ERRORS as exc:
            log.error("job failed: %s", exc)
            _FAILED_JOBS[out] = str(exc)
            return
    try:
        if multirun:  # main() checked a single run's folder before Hydra made it
            check_inside(out, hc.sweep.dir, RUN_DIR_PARTS, "hydra.sweep.dir")
        check_run_folder_entries(out)
        lock = RunFolderLock(out).acquire()  # one run per folder; released however this job ends
    except StorageError as exc:  # a live owner, a planted link, a job folder outside: write nothing there
        if multirun:
            log.error("job failed: %s", exc)
            _FAILED_JOBS[out] = str(exc)
            return
        fail(str(exc))
    if hc.output_subdir is not None:
        save_config_that_runs(cfg, overrides, Path(out) / hc.output_subdir)
    try:
        record = run(cfg, run_dir=out, command=command, cli_overrides=overrides)
    except Preempted as exc:
        log.warning("%s%s", exc, sweep_resume_hint(hc, multirun))
        if callable(exc.previous_handler):
            exc.previous_handler(exc.signum, None)  # e.g. submitit: requeue this job, then exit
        fail(f"{exc}{sweep_resume_hint(hc, multirun)}", code=128 + int(exc.signum))
    except KeyboardInterrupt:  # a Ctrl-C that run() could not turn into a record (a second one, mid-shutdown)
        fail(f"interrupted (Ctrl-C); rerun the same command to resume from the newest checkpoint in "
             f"{Path(out) / 'checkpoints'}, if there is one{sweep_resume_hint(hc, multirun)}", code=130)
    except REPORTED as exc:
        reason = record_failure(cfg, out, command, one_line(exc))
        if multirun:
            log.error("job failed: %s", reason)
            _FAILED_JOBS[out] = reason
            return
        fail(reason, code=exit_code(exc))
    except Exception as exc:
        reason = record_failure(cfg, out, command, f"{exc.__class__.__name__}: {one_line(exc)}")
        if multirun:
            log.exception("job failed: %s", reason)  # the traceback lands in the job's train.log
            _FAILED_JOBS[out] = reason
            return
        raise
    finally:
        close_wandb()
        lock.release()
    metrics = record["metrics"]["final"]
    shown = {k: v for k, v in metrics.items() if k.startswith(("test", "val/"))}
    log.info("run record: %s/%s", record["run_dir"], RECORD_FILENAME)
    for key, value in shown.items():
        log.info("  %-28s %s", key, "n/a" if value is None else f"{value:.4f}")
    return record


def _run_as_other_rank(cfg: DictConfig, out: str, command: str, overrides: list[str]) -> None:
    """A DDP process other than global rank 0: train in rank 0's folder without taking its lock or writing
    a record; bad input or a fault ends this process with its one line (rank 0 reports and records it)."""
    from attnlab.training.checkpointing import Preempted
    from attnlab.training.run import run

    try:
        with failures_reported():
            run(cfg, run_dir=out, command=command, cli_overrides=overrides)
    except Preempted as exc:
        fail(str(exc), code=128 + int(exc.signum))


# Jobs of a sweep that failed in this process ({run folder: reason}); jobs of other launchers (joblib, SLURM)
# are found by their failed records. A sweep with any exits non-zero after listing them.
_FAILED_JOBS: dict[str, str] = {}
# What the checks before Hydra allowed and say so (INFO, e.g. a resumed run's changed keys): logged by the job, into
# its console and train.log (Hydra configures logging only when the job starts).
_SAY_WHEN_LOGGING: list[str] = []


def show_config(argv: list[str]) -> bool:
    """Hydra's ``--cfg job|all`` (with ``--resolve`` and ``-p PACKAGE``), printed as Hydra prints it but
    with the scale applied, so it shows the config the run will use. False: not such a call, Hydra's own
    handling applies (``--cfg hydra`` is unaffected by the scale; other flag mixes get Hydra's answer)."""
    try:
        args = get_args_parser().parse_args(argv)
    except SystemExit:
        return False  # Hydra reports the bad flags itself
    others = (args.help, args.hydra_help, args.run, args.multirun, args.shell_completion, args.info,
              args.config_path, args.config_name, args.config_dir, args.experimental_rerun)
    if args.cfg not in ("job", "all") or any(others):
        return False
    package = None if args.package == "_global_" else args.package
    with failures_reported():
        shown = compose_shown(args.overrides, job_only=args.cfg == "job", package=package)
    if shown is None:
        sys.stderr.write(f"package '{package}' not found in config\n")
        raise SystemExit(1)
    if not isinstance(shown, Container):
        print(shown)
        return True
    if package is not None:
        print(f"# @package {package}")
    if args.resolve:
        OmegaConf.resolve(shown)
    sys.stdout.write(OmegaConf.to_yaml(shown))
    return True


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    _SAY_WHEN_LOGGING.clear()
    with failures_reported():
        check_group_choices(argv)
    if show_config(argv):
        return
    plain_run = not any(a in HYDRA_FLAGS or a.startswith(tuple(f + "=" for f in HYDRA_FLAGS)) for a in argv)
    if plain_run and is_launch_rank_zero():  # other ranks use the folder rank 0 holds
        with failures_reported(before_run=True):
            checked, run_dir = check_run_folder(argv)
        with failures_reported():
            _SAY_WHEN_LOGGING.extend(check_resume_keeps_the_config(checked, run_dir))
    multirun = any(a in ("-m", "--multirun") for a in argv)
    if multirun and is_launch_rank_zero():
        with failures_reported(before_run=True):
            _SAY_WHEN_LOGGING.extend(check_sweep(argv))
    if multirun and not any(a.startswith("hydra.sweep.dir=") for a in argv):
        # Name the sweep folder now (as Hydra would), to find its failed jobs afterwards; where the command is
        # wrong, Hydra itself reports it.
        with contextlib.suppress(*USER_ERRORS):
            argv = [*argv, f'hydra.sweep.dir="{planned_dir(argv, "sweep")}"']
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    sys.argv = [sys.argv[0], *argv]
    _FAILED_JOBS.clear()
    started = time.time()
    hydra_main()
    if multirun:
        failed = {str(Path(k).resolve()): v for k, v in (*failed_sweep_records(argv, since=started).items(),
                                                           *_FAILED_JOBS.items())}
        if failed:
            print(f"attnlab-train: error: {len(failed)} job(s) of the sweep failed:", file=sys.stderr)
            for folder, reason in sorted(failed.items()):
                print(f"  {folder}: {reason}", file=sys.stderr)
            raise SystemExit(1)


if __name__ == "__main__":
    main()
