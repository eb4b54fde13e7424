"""One training run from a composed config: build task, module and trainer, fit, test, write the record.

``cli/train.py`` is a thin Hydra entry point over ``run``; tests and tools call ``build_module`` and
``build_datamodule`` directly.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

import attnlab
from attnlab.tasks import TaskData, build_task
from attnlab.training.callbacks import BestMetrics, PonderStats, Throughput
from attnlab.training.config import ConfigError, validate
from attnlab.training.data import TaskDataModule
from attnlab.training.modules import MODULES, TaskModule, count_parameters

log = logging.getLogger("attnlab")


# -- config helpers ------------------------------------------------------------------------------------
def apply_scale(cfg: DictConfig, cli_overrides: list[str] | tuple[str, ...] = ()) -> None:
    """Merge each section's ``at_scale.<scale.name>`` block into it (model and task carry one).

    A preset states its paper-size values as plain keys and its laptop-size values under
    ``at_scale.cpu``; keys the user set on the command line win over both.
    """
    explicit = {o.split("=", 1)[0].lstrip("+~") for o in cli_overrides if "=" in o}
    scale = cfg.scale.name
    with open_dict(cfg):
        for section in ("model", "task"):
            node = cfg[section]
            block = OmegaConf.select(node, f"at_scale.{scale}")
            if not block:
                continue
            for key, value in block.items():
                if f"{section}.{key}" not in explicit:
                    node[key] = value


def derive_batching(cfg: DictConfig) -> tuple[int, int]:
    """(micro-batch per device, gradient accumulation) so that one update sees
    ``batch.sentences_per_update`` sentences whatever the hardware."""
    world = cfg.hardware.devices * cfg.hardware.num_nodes
    per_update = cfg.batch.sentences_per_update
    accumulate = math.ceil(per_update / (cfg.hardware.max_batch_per_device * world))
    micro, rest = divmod(per_update, world * accumulate)
    if rest or micro == 0:
        raise ConfigError(
            f"batch.sentences_per_update={per_update} cannot be split evenly over {world} device(s) with "
            f"micro-batches <= hardware.max_batch_per_device={cfg.hardware.max_batch_per_device}; "
            f"use a multiple of {world * accumulate}"
        )
    return micro, accumulate


def build_task_data(cfg: DictConfig) -> TaskData:
    task_cfg = OmegaConf.to_container(cfg.task, resolve=True)
    task_cfg.setdefault("data_root", cfg.paths.data_root)
    return build_task(task_cfg, int(cfg.seed))


def model_config(cfg: DictConfig, task: TaskData) -> dict[str, Any]:
    """The model section as a plain dict, with what only the data knows filled in."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.pop("at_scale", None)
    if model.get("max_len") is None:
        model["max_len"] = task.max_len
    elif task.max_len > model["max_len"]:
        raise ConfigError(
            f"the task needs sequences of length {task.max_len} but model.max_len={model['max_len']}; "
            f"raise model.max_len or shorten the task"
        )
    attention = model["attention"]
    if "train_length_p975" in attention and attention["train_length_p975"] is None and task.train_lengths:
        lengths = torch.tensor(task.train_lengths, dtype=torch.float64)
        attention["train_length_p975"] = float(torch.quantile(lengths, 0.975))
    return model


def task_info(task: TaskData) -> dict[str, Any]:
    return {
        "kind": task.kind,
        "vocab_size": task.vocab_size,
        "src_vocab_size": task.src_vocab_size or task.vocab_size,
        "pad_id": task.pad_id,
        "bos_id": task.bos_id,
        "eos_id": task.eos_id,
        "num_classes": task.num_classes,
        "eval_splits": dict(task.eval_splits),
    }


def decoding_config(cfg: DictConfig) -> dict[str, Any]:
    dec = cfg.task.get("decoding")
    defaults = {"strategy": "greedy", "beam_size": 4, "length_penalty_alpha": 0.6, "max_len_a": 1.0,
                "max_len_b": 10, "decode_in_validation": True}
    return {**defaults, **(OmegaConf.to_container(dec, resolve=True) if dec else {})}


def build_module(cfg: DictConfig, task: TaskData | None = None) -> TaskModule:
    task = task or build_task_data(cfg)
    module_cls = MODULES[task.kind]
    module = module_cls(model_config(cfg, task), OmegaConf.to_container(cfg.optim, resolve=True), task_info(task),
                        decoding_config(cfg))
    if task.score_text is not None:
        module.text_scorer, module.detokenize, module.references = task.score_text, task.detokenize, task.references
    return module


def build_datamodule(cfg: DictConfig, task: TaskData | None = None) -> TaskDataModule:
    task = task or build_task_data(cfg)
    micro, _ = derive_batching(cfg)
    return TaskDataModule(task, micro_batch=micro, eval_batch=cfg.batch.eval_batch_size,
                          num_workers=cfg.hardware.num_workers, shuffle_seed=int(cfg.seed))


# -- loggers and callbacks ------------------------------------------------------------------------------
def build_loggers(cfg: DictConfig, run_dir: Path) -> list:
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    loggers: list = []
    if cfg.logger.get("csv") is not None:
        loggers.append(CSVLogger(save_dir=str(run_dir), name="csv", version=""))
    if cfg.logger.get("tensorboard") is not None:
        loggers.append(TensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version=""))
    if cfg.logger.get("wandb") is not None:
        wandb_logger = build_wandb_logger(cfg, run_dir)
        if wandb_logger is not None:
            loggers.append(wandb_logger)
    return loggers


def build_wandb_logger(cfg: DictConfig, run_dir: Path):
    """A WandbLogger, offline unless the user set WANDB_MODE; any failure is logged and training goes on."""
    w = cfg.logger.wandb
    try:
        from lightning.pytorch.loggers import WandbLogger

        offline = w.offline and os.environ.get("WANDB_MODE") in (None, "", "offline")
        if offline:
            os.environ.setdefault("WANDB_MODE", "offline")
        return WandbLogger(
            project=w.project, entity=w.entity, group=w.group or cfg.get("experiment_name") or cfg.run_name,
            tags=list(w.tags), save_dir=str(run_dir), offline=offline, log_model=w.log_model,
            config=OmegaConf.to_container(cfg, resolve=True), name=cfg.run_name,
            settings=_wandb_settings(),
        )
    except Exception as exc:  # noqa: BLE001 - a logging backend must never stop training
        log.warning("wandb logger disabled: %s: %s", exc.__class__.__name__, str(exc).splitlines()[0])
        return None


def _wandb_settings():
    import wandb

    return wandb.Settings(silent=True, console="off", x_disable_stats=True)


def build_callbacks(cfg: DictConfig, run_dir: Path) -> list:
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    c = cfg.callbacks
    callbacks: list = [Throughput(), BestMetrics()]
    if c.get("checkpoint"):
        ck = c.checkpoint
        callbacks.append(ModelCheckpoint(
            dirpath=str(run_dir / "checkpoints"), monitor=ck.monitor, mode=ck.mode, save_last=ck.save_last,
            save_top_k=ck.save_top_k, filename="step{step:07d}", auto_insert_metric_name=False,
        ))
    has_logger = any(cfg.logger.get(k) is not None for k in ("csv", "wandb", "tensorboard"))
    if c.get("lr_monitor") and has_logger:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    if c.get("ponder_stats") and cfg.model.recurrence.name.endswith("act"):
        callbacks.append(PonderStats(str(run_dir), sample_size=c.ponder_stats.sample_size))
    return callbacks


def build_trainer(cfg: DictConfig, run_dir: Path, *, callbacks: list, loggers: list) -> L.Trainer:
    t, hw = cfg.trainer, cfg.hardware
    _, accumulate = derive_batching(cfg)
    strategy = hw.strategy
    if strategy == "ddp" and hw.accelerator == "cpu":
        from lightning.pytorch.strategies import DDPStrategy

        strategy = DDPStrategy(process_group_backend="gloo", start_method="popen")
    return L.Trainer(
        accelerator=hw.accelerator,
        devices=hw.devices,
        num_nodes=hw.num_nodes,
        strategy=strategy,
        precision=hw.precision,
        max_steps=t.max_steps,
        max_epochs=-1,
        val_check_interval=t.val_check_interval,
        check_val_every_n_epoch=None,
        limit_train_batches=t.limit_train_batches,
        limit_val_batches=t.limit_val_batches,
        limit_test_batches=t.limit_test_batches,
        log_every_n_steps=t.log_every_n_steps,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=cfg.optim.grad_clip or None,
        deterministic=t.deterministic,
        fast_dev_run=t.fast_dev_run,
        overfit_batches=t.overfit_batches,
        num_sanity_val_steps=t.num_sanity_val_steps,
        detect_anomaly=t.detect_anomaly,
        profiler=t.profiler,
        enable_progress_bar=t.enable_progress_bar,
        enable_model_summary=False,
        callbacks=callbacks,
        logger=loggers or False,
        default_root_dir=str(run_dir),
    )


# -- provenance ----------------------------------------------------------------------------------------
def git_state() -> dict[str, Any]:
    """Commit and dirty flag of the source tree attnlab runs from (None outside a git checkout)."""
    src = Path(attnlab.__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
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


def peak_memory_mb(device: torch.device | None = None) -> float | None:
    if torch.cuda.is_available() and device is not None and device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss / 1024 if sys.platform != "darwin" else rss / 2**20
    except (ImportError, OSError):
        return None


# -- the run -----------------------------------------------------------------------------------------
def run(cfg: DictConfig, *, run_dir: str | os.PathLike | None = None, command: str | None = None,
        cli_overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Train and evaluate one configuration; write and return its run record (``results.json``)."""
    from attnlab.results.record import config_hash, write_record

    started = time.time()
    apply_scale(cfg, cli_overrides)
    validate(cfg)
    run_dir = Path(run_dir or cfg.paths.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    if cfg.hardware.matmul_precision:
        torch.set_float32_matmul_precision(cfg.hardware.matmul_precision)

    task = build_task_data(cfg)
    module = build_module(cfg, task)
    datamodule = build_datamodule(cfg, task)
    loggers = build_loggers(cfg, run_dir)
    callbacks = build_callbacks(cfg, run_dir)
    trainer = build_trainer(cfg, run_dir, callbacks=callbacks, loggers=loggers)
    trainer.fit(module, datamodule=datamodule)
    trainer.test(module, datamodule=datamodule, verbose=False)

    throughput = next(c for c in callbacks if isinstance(c, Throughput))
    best = next(c for c in callbacks if isinstance(c, BestMetrics))
    params = count_parameters(module.model)
    wandb_id = next((lg.experiment.id for lg in loggers if lg.__class__.__name__ == "WandbLogger"), None)
    plain = OmegaConf.to_container(cfg, resolve=True)
    record = {
        "schema_version": 1,
        "status": "completed",
        "error": None,
        "experiment": cfg.get("experiment_name"),
        "row": cfg.get("row"),
        "task": cfg.task.name,
        "model": {"name": cfg.model.name, "attention": cfg.model.attention.name,
                  "recurrence": cfg.model.recurrence.name},
        "seed": int(cfg.seed),
        "scale": cfg.scale.name,
        "config_hash": config_hash(plain),
        "git": git_state(),
        "hardware": {"name": cfg.hardware.name, "accelerator": cfg.hardware.accelerator,
                     "devices": cfg.hardware.devices, "num_nodes": cfg.hardware.num_nodes,
                     "precision": str(cfg.hardware.precision)},
        "metrics": {"final": collect_metrics(trainer), "best": dict(best.best)},
        "params": params,
        "cost": {"wall_s": round(time.time() - started, 2), "tokens_per_s": throughput.average_tokens_per_s(),
                 "peak_mem_mb": peak_memory_mb(module.device), "steps": trainer.global_step},
        "metric_flavours": dict(task.metric_flavours),
        "wandb_run_id": wandb_id,
        "run_dir": str(run_dir.resolve()),
        "command": command or " ".join(sys.argv),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "lightning": L.__version__, "attnlab": attnlab.__version__},
        "extra": {"debug": cfg.get("debug_mode")},
    }
    if trainer.is_global_zero:
        write_record(run_dir / "results.json", record)
    for lg in loggers:
        if lg.__class__.__name__ == "WandbLogger":
            _finish_wandb()
    return record


def write_failed_record(cfg: DictConfig, run_dir: str | os.PathLike, command: str, error: str) -> None:
    """A run record with ``status: failed`` and the reason, so sweeps and tables show the failure."""
    from attnlab.results.record import write_record

    def pick(dotted: str):
        try:
            return OmegaConf.select(cfg, dotted)
        except Exception:  # noqa: BLE001 - a broken config must still yield a failure record
            return None

    record = {
        "schema_version": 1,
        "status": "failed",
        "error": error,
        "experiment": pick("experiment_name"),
        "row": pick("row"),
        "task": pick("task.name"),
        "model": {"name": pick("model.name"), "attention": pick("model.attention.name"),
                  "recurrence": pick("model.recurrence.name")},
        "seed": pick("seed"),
        "scale": pick("scale.name"),
        "git": git_state(),
        "config_hash": _safe_hash(cfg),
        "hardware": {"name": pick("hardware.name"), "accelerator": pick("hardware.accelerator"),
                     "devices": pick("hardware.devices"), "num_nodes": pick("hardware.num_nodes"),
                     "precision": str(pick("hardware.precision"))},
        "metrics": {"final": {}, "best": {}},
        "params": {"total": None, "trainable": None},
        "cost": {"wall_s": None, "tokens_per_s": None, "peak_mem_mb": None},
        "metric_flavours": {},
        "wandb_run_id": None,
        "run_dir": str(Path(run_dir).resolve()),
        "command": command,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "attnlab": attnlab.__version__},
    }
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    write_record(Path(run_dir) / "results.json", record)


def _safe_hash(cfg: DictConfig) -> str | None:
    from attnlab.results.record import config_hash

    try:
        return config_hash(OmegaConf.to_container(cfg, resolve=True))
    except Exception:  # noqa: BLE001 - an unresolvable config is hashed as written
        return config_hash(OmegaConf.to_container(cfg, resolve=False))


def _finish_wandb() -> None:
    try:
        import wandb

        wandb.finish()
    except Exception as exc:  # noqa: BLE001 - closing a logger must not fail a finished run
        log.warning("wandb.finish failed: %s", exc)
