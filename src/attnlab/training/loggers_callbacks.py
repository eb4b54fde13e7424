"""The loggers (CSV, TensorBoard, wandb) and callbacks a run's trainer gets, the built-in ones chosen by the
config and the ones a config file adds by ``_target_`` (docs/extending.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from attnlab.errors import ConfigError
from attnlab.results.record import CHECKPOINTS_DIR
from attnlab.training.acceleration import nan_check
from attnlab.training.callbacks import BestMetrics, MetricsLine, PonderStats, Throughput
from attnlab.training.checkpointing import LastCheckpoint, RandomState, checkpoint_step
from attnlab.training.nonfinite_guard import NonFiniteGuard
from attnlab.training.resumable_csv import ResumableCSVLogger
from attnlab.training.wandb_run import build_wandb_logger, wants_wandb


def build_loggers(cfg: DictConfig, run_dir: Path, *, resume_ckpt: dict[str, Any] | None = None,
                  wandb_id: str | None = None) -> list:
    """CSV, TensorBoard and wandb loggers; when resuming, the CSV log keeps the rows up to the checkpoint
    and the wandb logger continues the same run."""
    from lightning.pytorch.loggers import TensorBoardLogger

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


def instantiate_own(section: DictConfig, path: str, **defaults: Any) -> list:
    """The entries of ``section`` that name their own class with ``_target_`` (a logger or callback added
    by a config file, docs/extending.md), instantiated with the arguments written beside it; each of
    ``defaults`` (a logger's ``save_dir``: the run folder) is passed where the class takes it and the
    config leaves it out."""
    import inspect

    from hydra.utils import get_object, instantiate

    built = []
    for key, node in section.items_ex(resolve=False):
        if isinstance(node, DictConfig) and "_target_" in node:
            try:
                params = inspect.signature(get_object(node._target_)).parameters
                extra = {k: v for k, v in defaults.items() if k in params and k not in node}
                built.append(instantiate(node, **extra))
            except Exception as exc:  # noqa: BLE001 - whatever the user's class raises, one line names it
                cause = exc.__cause__ or exc
                raise ConfigError(f"{path}.{key}: cannot build {node._target_}: {one_line_of(cause)}") from exc
    return built


def one_line_of(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{exc.__class__.__name__}: {lines[0]}" if lines else exc.__class__.__name__


def _logged_through(ckpt: dict[str, Any] | None) -> int | None:
    """The last logger step a checkpoint's state had logged (rows after it are logged again on resume)."""
    if ckpt is None:
        return None
    loop = ckpt.get("loops", {}).get("fit_loop", {}).get("epoch_loop.state_dict", {})
    return int(loop.get("_batches_that_stepped", checkpoint_step(ckpt)))


def build_callbacks(cfg: DictConfig, run_dir: Path) -> list:
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    c = cfg.callbacks
    mfu = bool(c.get("mfu")) and not cfg.get("debug_mode")
    callbacks: list = [Throughput(log=not mfu), BestMetrics(), RandomState(),
                       NonFiniteGuard(cfg.get("nan_policy", "stop"), int(cfg.get("max_skipped_batches", 0)),
                                      check=nan_check(cfg)),
                       MetricsLine(cfg.trainer.log_every_n_steps)]
    if c.get("checkpoint"):
        ck = c.checkpoint
        if ck.save_top_k:
            callbacks.append(ModelCheckpoint(
                dirpath=str(run_dir / CHECKPOINTS_DIR), monitor=ck.monitor, mode=ck.mode, save_last=False,
                save_top_k=ck.save_top_k, filename="step{step:07d}", auto_insert_metric_name=False,
            ))
        # After ModelCheckpoint in the list (Lightning keeps that order), so last.ckpt records the newest best.
        if ck.save_last:
            callbacks.append(LastCheckpoint(run_dir / CHECKPOINTS_DIR, every_n_steps=ck.get("every_n_steps"),
                                            handle_signals=ck.get("on_signal", True)))
    has_logger = any(v is not None for v in cfg.logger.values())
    if c.get("lr_monitor") and has_logger:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    if mfu:  # perf/mfu against the datasheet peak, or the matmul peak measured at fit start on CPU
        from attnlab.training.perf import MFUCallback

        callbacks.append(MFUCallback(log_every=cfg.trainer.log_every_n_steps))
    from attnlab.models.recurrence import emits_ponder_steps

    if c.get("ponder_stats") and emits_ponder_steps(cfg.model.recurrence.name):
        callbacks.append(PonderStats(str(run_dir), sample_size=c.ponder_stats.sample_size))
    if cfg.optim.get("plateau") is not None:
        from attnlab.training.plateau import PlateauDecay, PlateauOptions

        options = PlateauOptions(**OmegaConf.to_container(cfg.optim.plateau, resolve=True))
        callbacks.append(PlateauDecay(options, warmup_steps=cfg.optim.warmup_steps))
    if c.get("record_attention"):
        from attnlab.training.attention_capture import AttentionWeightsHistogram

        callbacks.append(AttentionWeightsHistogram(str(run_dir), sample_size=c.get("record_attention_sample_size", 8)))
    return callbacks + instantiate_own(c, "callbacks")

