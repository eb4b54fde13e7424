"""The run's wandb side: which wandb run it logs into, the logger, the record published to it, and closing it.

Every function here is best-effort by design: a logging backend must never stop or fail a training run, so
each failure is logged as one warning and training goes on (docs/runs.md, "wandb"). Offline unless the user sets
``WANDB_MODE``.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("attnlab")

# The wandb run id of a run folder, kept beside its checkpoints so a resumed run logs into the same wandb run.
WANDB_ID_FILE = "wandb_run_id"


_SAID_DISABLED: list[bool] = []


def wants_wandb(cfg: DictConfig) -> bool:
    """``logger=wandb`` unless wandb itself is switched off (``WANDB_MODE=disabled`` or ``WANDB_DISABLED``):
    then no wandb run exists, so none is built, named in the record or resumed (said once)."""
    if cfg.logger.get("wandb") is None:
        return False
    disabled = os.environ.get("WANDB_MODE", "").lower() == "disabled" or \
        os.environ.get("WANDB_DISABLED", "").lower() in ("1", "true", "yes")
    if disabled and not _SAID_DISABLED:
        _SAID_DISABLED.append(True)
        log.info("logger=wandb, but wandb is disabled in this environment (WANDB_MODE / WANDB_DISABLED): nothing "
                 "goes to wandb; the CSV log and the run record are complete")
    return not disabled


def wandb_run_id(run_dir: Path, ckpt: dict[str, Any] | None) -> str:
    """The wandb run to log into: the resumed checkpoint's, else this run folder's, else a new one."""
    from attnlab.results.record import atomic_write_text

    state = (ckpt or {}).get("callbacks", {}).get("LastCheckpoint", {})
    file = run_dir / WANDB_ID_FILE
    run_id = state.get("wandb_run_id") or (file.read_text().strip() if file.is_file() else "")
    if not run_id:
        import secrets

        run_id = secrets.token_hex(4)  # wandb's own ids are 8 lowercase alphanumerics
    from lightning.pytorch.utilities import rank_zero_only

    if getattr(rank_zero_only, "rank", 0) == 0:  # only rank 0 logs to wandb, so only it names the run
        atomic_write_text(file, run_id + "\n")
    return run_id


def build_wandb_logger(cfg: DictConfig, run_dir: Path, run_id: str | None = None):
    """A WandbLogger, offline unless the user set WANDB_MODE; any failure is logged and training goes on."""
    w = cfg.logger.wandb
    try:
        from lightning.pytorch.loggers import WandbLogger

        offline = w.offline and os.environ.get("WANDB_MODE") in (None, "", "offline")
        if offline:
            os.environ.setdefault("WANDB_MODE", "offline")
        # wandb's own terminal notes ("Symlinked 1 file into the W&B run directory", a deprecated setting) go to
        # its debug log, not the user's console; our failures are logged as warnings (publish_to_wandb).
        # WANDB_SILENT=false in the environment shows them again.
        os.environ.setdefault("WANDB_SILENT", "true")
        name, tags = wandb_name_and_tags(cfg)
        return WandbLogger(
            project=w.project, entity=w.entity, group=w.group or cfg.get("experiment_name") or cfg.run_name,
            tags=tags, save_dir=str(run_dir), offline=offline, log_model=w.log_model,
            config=OmegaConf.to_container(cfg, resolve=True), name=name, job_type=w.get("job_type") or "train",
            notes=w.get("notes"), settings=wandb_settings(), id=run_id, resume="allow" if run_id else None,
        )
    except Exception as exc:  # noqa: BLE001 - a logging backend must never stop training
        log.warning("wandb logger disabled: %s: %s", exc.__class__.__name__, str(exc).splitlines()[0])
        return None


def wandb_name_and_tags(cfg: DictConfig) -> tuple[str, list[str]]:
    """The run's wandb name (``logger.wandb.name``, else ``<row or run name>-s<seed>``: the seeds of one table
    row differ) and tags (the configured ones plus ``seed:<n>`` and ``row:<row>``)."""
    w = cfg.logger.wandb
    row = cfg.get("row")
    name = w.get("name") or f"{row or cfg.run_name}-s{cfg.seed}"
    tags = [*w.tags, f"seed:{cfg.seed}", *([f"row:{row}"] if row else [])]
    return name, [t[:64] for t in dict.fromkeys(str(t) for t in tags)]  # wandb refuses tags over 64 chars


def publish_to_wandb(record: dict[str, Any], run_dir: Path, outputs_dir: Path) -> None:
    """What a reviewer needs on the wandb run: the run record as summary (``attnlab/record``, which
    ``attnlab-table source=wandb`` reads back) and as a file, the decoded outputs, and the metric flavours
    (sacreBLEU signature, decoding, ...) in the run's config. A failure is logged; the run stays complete."""
    try:
        import wandb

        run = wandb.run
        if run is None:
            return
        run.summary["attnlab/record"] = record
        run.config.update({"metric_flavours": record.get("metric_flavours") or {}}, allow_val_change=True)
        from attnlab.results.record import RECORD_FILENAME

        if os.environ.get("WANDB_SILENT", "").lower() == "true":  # set where the logger is built, unless the user
            wandb.termsetup(wandb.Settings(silent=True), None)  # chose; wandb set its console up before it
        for path in [run_dir / RECORD_FILENAME, *sorted(outputs_dir.glob("*"))]:
            if path.is_file():
                wandb.save(str(path), base_path=str(run_dir), policy="now")
    except Exception as exc:  # noqa: BLE001 - a logging backend must never fail a finished run
        log.warning("wandb: could not publish the run record: %s: %s", exc.__class__.__name__,
                    str(exc).splitlines()[0] if str(exc) else "")


def wandb_settings():
    import wandb

    return wandb.Settings(silent=True, console="off", x_disable_stats=True)


def close_wandb() -> None:
    """Finish a wandb run left open by a failed job (marked failed), so the next job of a sweep starts clean."""
    wandb = sys.modules.get("wandb")
    if wandb is None or getattr(wandb, "run", None) is None:
        return
    try:
        wandb.finish(exit_code=1)
    except Exception as exc:  # noqa: BLE001 - closing a logger must not hide the job's own failure
        log.warning("wandb.finish failed: %s", exc)


def finish_wandb() -> None:
    try:
        import wandb

        wandb.finish()
    except Exception as exc:  # noqa: BLE001 - closing a logger must not fail a finished run
        log.warning("wandb.finish failed: %s", exc)
