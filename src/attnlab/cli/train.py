"""``attnlab-train``: a thin Hydra entry point over ``attnlab.training.run``.

Before Hydra starts a single run, the config is composed and checked once (``preflight``), so bad input
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

import logging
import os
import sys
import time
import warnings
from pathlib import Path

import hydra
from omegaconf import DictConfig

from attnlab.cli.common import (
    HYDRA_FLAGS,
    check_group_choices,
    compose_checked,
    fail,
    one_line,
    run_errors,
    user_errors,
)

log = logging.getLogger("attnlab")


@hydra.main(config_path="pkg://attnlab.conf", config_name="train", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from attnlab.training.checkpointing import Preempted
    from attnlab.training.run import close_wandb, run
    from attnlab.training.storage import RunFolderBusy, RunFolderLock

    # Importing Lightning resets its loggers to INFO with a handler of their own (start-up tips, "GPU
    # available: False"); keep them at the level the job logging config asks for.
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
        logging.getLogger(name).propagate = True
        for handler in list(logging.getLogger(name).handlers):
            logging.getLogger(name).removeHandler(handler)
    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    command = " ".join(["attnlab-train", *overrides])
    multirun = hc.mode.name == "MULTIRUN"
    out = hc.runtime.output_dir
    try:
        lock = RunFolderLock(out).acquire()  # one run per folder; released however this job ends
    except RunFolderBusy as exc:  # the folder and its record belong to the live run: write nothing
        if multirun:
            log.error("job failed: %s", exc)
            _FAILED_JOBS[out] = str(exc)
            return
        fail(str(exc))
    try:
        record = run(cfg, run_dir=out, command=command, cli_overrides=overrides)
    except Preempted as exc:
        log.warning("%s", exc)
        if callable(exc.previous_handler):
            exc.previous_handler(exc.signum, None)  # e.g. submitit: requeue this job, then exit
        fail(str(exc), code=128 + int(exc.signum))
    except KeyboardInterrupt:  # Ctrl-C before training started (while reading data): nothing to resume
        fail("interrupted (Ctrl-C) before training started; rerun the same command to start again", code=130)
    except user_errors() + run_errors() as exc:
        reason = _record_failure(cfg, out, command, one_line(exc))
        if multirun:
            log.error("job failed: %s", reason)
            _FAILED_JOBS[out] = reason
            return
        fail(reason, code=2 if isinstance(exc, user_errors()) else 1)
    except Exception as exc:
        reason = _record_failure(cfg, out, command, f"{exc.__class__.__name__}: {one_line(exc)}")
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
    log.info("run record: %s/results.json", record["run_dir"])
    for key, value in shown.items():
        log.info("  %-28s %s", key, "n/a" if value is None else f"{value:.4f}")


# Jobs of a sweep that failed in this process ({run folder: reason}); jobs of other launchers (joblib, SLURM)
# are found by their failed records. A sweep with any exits non-zero after listing them.
_FAILED_JOBS: dict[str, str] = {}


def _record_failure(cfg: DictConfig, out: str, command: str, reason: str) -> str:
    """Write the failed record; the reason, plus a note when the folder could not take even that record."""
    from attnlab.training.run import write_failed_record

    if write_failed_record(cfg, out, command, reason):
        return reason
    return f"{reason}; no run record could be written in {out}"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Lightning 2.6 on torch 2.13 warns about a torch-internal pytree API at every fit; it is not ours to fix.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    try:
        check_group_choices(argv)
    except user_errors() as exc:
        fail(one_line(exc))
    if not any(a in HYDRA_FLAGS or a.startswith(tuple(f + "=" for f in HYDRA_FLAGS)) for a in argv):
        from attnlab.training.storage import RunFolderLock, busy_message, check_can_create

        try:
            compose_checked("train", argv)
            run_dir = Path(_planned_run_dir(argv))
            check_can_create(run_dir)
        except user_errors() + run_errors() as exc:
            fail(one_line(exc))
        owner = RunFolderLock.owner(run_dir)
        if owner is not None:
            fail(busy_message(run_dir, owner))
    multirun = any(a in ("-m", "--multirun") for a in argv)
    if multirun and not any(a.startswith("hydra.sweep.dir=") for a in argv):
        try:  # name the sweep folder now (as Hydra would), to find its failed jobs afterwards
            argv = [*argv, f'hydra.sweep.dir="{_planned_dir(argv, "sweep")}"']
        except user_errors():
            pass  # Hydra itself reports what is wrong with the command
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    sys.argv = [sys.argv[0], *argv]
    _FAILED_JOBS.clear()
    started = time.time()
    hydra_main()
    if multirun:
        failed = {str(Path(k).resolve()): v for k, v in (*_failed_records(argv, since=started).items(),
                                                           *_FAILED_JOBS.items())}
        if failed:
            print(f"attnlab-train: error: {len(failed)} job(s) of the sweep failed:", file=sys.stderr)
            for folder, reason in sorted(failed.items()):
                print(f"  {folder}: {reason}", file=sys.stderr)
            raise SystemExit(1)


def _planned_run_dir(argv: list[str]) -> str:
    """Where Hydra will put this single run (timestamps may differ by a second; only the parent matters)."""
    return _planned_dir(argv, "run")


def _planned_dir(argv: list[str], mode: str) -> str:
    """``hydra.run.dir`` or ``hydra.sweep.dir`` as Hydra will resolve it (sweep values and flags left out)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    plain = [a for a in argv if not a.startswith("-")]
    parsed = OverridesParser.create().parse_overrides(plain)
    single = [a for a, o in zip(plain, parsed) if not o.is_sweep_override()]
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="attnlab.conf", version_base="1.3"):
        cfg = compose("train", overrides=single, return_hydra_config=True)
        return str(cfg.hydra.run.dir if mode == "run" else cfg.hydra.sweep.dir)


def _failed_records(argv: list[str], since: float) -> dict[str, str]:
    """{run folder: error} of the failed records written by this sweep (under its ``hydra.sweep.dir``)."""
    import json

    given = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.sweep.dir=")]
    if not given:
        return {}
    failed = {}
    for path in Path(given[-1].strip("'\"")).rglob("results.json"):
        try:
            if path.stat().st_mtime < since:
                continue
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("status") == "failed":
            failed[str(path.parent)] = str(record.get("error"))
    return failed


if __name__ == "__main__":
    main()
