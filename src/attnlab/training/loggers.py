"""The loggers (CSV, TensorBoard, wandb) a run's trainer gets: the built-in ones the config chooses and the ones a
config file adds by ``_target_`` (docs/extending.md); the trainer's callbacks are chosen in ``callbacks.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import DictConfig

from attnlab.training.checkpointing import checkpoint_step
from attnlab.training.config_targets import instantiate_own
from attnlab.training.resumable_csv import ResumableCSVLogger
from attnlab.training.wandb_run import build_wandb_logger, wants_wandb


def build_loggers(cfg: DictConfig, run_dir: Path, *, resume_ckpt: dict[str, Any] | None = None,
                  wandb_id: str | None = None) -> list:
    """CSV, TensorBoard and wandb loggers; when resuming, the CSV log keeps the rows up to the checkpoint
    and the wandb logger continues the same run."""
    loggers: list = []
    if cfg.logger.get("csv") is not None:
        loggers.append(ResumableCSVLogger(save_dir=str(run_dir), name="csv", version="",
                                          keep_through_step=_logged_through(resume_ckpt)))
    if cfg.logger.get("tensorboard") is not None:
        loggers.append(TensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version=""))
    if wants_wandb(cfg):
        wandb_logger = build_wandb_logger(cfg, run_dir, run_id=wandb_id)
        if wandb_logger is not None:
            loggers.append(wandb_logger)
    return loggers + instantiate_own(cfg.logger, "logger", save_dir=str(run_dir))


def _logged_through(ckpt: dict[str, Any] | None) -> int | None:
    """The last logger step a checkpoint's state had logged (rows after it are logged again on resume)."""
    if ckpt is None:
        return None
    loop = ckpt.get("loops", {}).get("fit_loop", {}).get("epoch_loop.state_dict", {})
    return int(loop.get("_batches_that_stepped", checkpoint_step(ckpt)))
