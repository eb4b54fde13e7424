"""One training run from a composed config: check the config, build task, module and trainer, fit, test, write
the record.

``run`` tells that story; each step is done in the module that owns it: ``build.py`` (data, module, batching),
``describe.py`` (the first lines of ``train.log``), ``checkpoint_choice.py`` (which checkpoint a run starts from and
which weights it tests), ``loggers.py`` and ``callbacks.py`` (what the trainer gets), ``checkpointing.py``,
``nonfinite_guard.py``, ``stop_signals.py`` and ``record_writers.py`` (the run record and its writers).
``cli/train.py`` is the Hydra entry point over ``run``. Import a builder or a record writer from the module that
owns it; this one re-exports nothing.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig

from attnlab.results.record import CHECKPOINTS_DIR, OUTPUTS_DIR, RECORD_FILENAME, write_record
from attnlab.tasks import DataError
from attnlab.training.build import (
    build_datamodule,
    build_module,
    build_task_data,
    check_splits_not_empty,
    derive_batching,
)
from attnlab.training.callbacks import RunCost, build_callbacks, build_nonfinite_guard
from attnlab.training.checkpoint_choice import load_test_weights, select_checkpoint
from attnlab.training.checkpointing import (
    AtomicCheckpointIO,
    LastCheckpoint,
    Preempted,
    check_weights_fit,
    checkpoint_bytes,
    checkpoint_step,
    find_resume_checkpoint,
    init_weights_from,
    model_weights,
)
from attnlab.training.config import validate
from attnlab.training.config_hash import asked_config_hash
from attnlab.training.describe import describe_build, describe_config
from attnlab.training.launch import launched_by
from attnlab.training.loggers import build_loggers
from attnlab.training.outputs import write_decoded_outputs
from attnlab.training.record_writers import (
    RunClock,
    completed_twin,
    run_record,
    stopped_before_training,
    storage_errors,
    write_interrupted_record,
)
from attnlab.training.scale import apply_scale
from attnlab.training.stop_signals import Interrupted, RunSignals, StoppedBySignal, signals_deferred
from attnlab.training.storage import check_free_space, check_writable, storage_failure
from attnlab.training.wandb_run import finish_wandb, publish_to_wandb, wandb_run_id, wants_wandb

log = logging.getLogger("attnlab")


def build_trainer(cfg: DictConfig, run_dir: Path, *, callbacks: list, loggers: list,
                  max_len: int | None = None) -> L.Trainer:
    t, hw = cfg.trainer, cfg.hardware
    _, accumulate = derive_batching(cfg, max_len=max_len)
    strategy = hw.strategy
    if strategy == "ddp" and hw.accelerator == "cpu":
        strategy = DDPStrategy(process_group_backend="gloo", start_method="popen")
    plugins: list = [AtomicCheckpointIO()]
    launcher = launched_by()
    if launcher == "torchelastic":
        # torchrun inside an sbatch job: SLURM's variables describe the job, torchrun's the ranks. Lightning
        # would pick SLURMEnvironment whenever SLURM's variables exist and read the wrong ranks.
        plugins.append(TorchElasticEnvironment())
    elif SLURMEnvironment.detect():
        # LastCheckpoint saves on SLURM's signals and submitit requeues; Lightning's own requeue would
        # save a second (non-atomic) checkpoint and requeue the job twice.
        plugins.append(SLURMEnvironment(auto_requeue=False))
    return L.Trainer(
        accelerator=hw.accelerator,
        devices=hw.devices,
        num_nodes=hw.num_nodes,
        strategy=strategy,
        precision=hw.precision,
        max_steps=t.max_steps,
        max_epochs=-1,
        val_check_interval=t.val_check_interval * accumulate,  # Lightning counts batches, we count updates
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
        enable_progress_bar=progress_bar_wanted(t.enable_progress_bar),
        enable_model_summary=False,
        callbacks=callbacks,
        logger=loggers or False,
        default_root_dir=str(run_dir),
        plugins=plugins,
        enable_checkpointing=any(isinstance(c, Checkpoint) for c in callbacks),  # else Lightning adds its own
    )


def progress_bar_wanted(asked: bool) -> bool:
    """A progress bar only on a terminal: elsewhere (a SLURM log, a pipe) tqdm's redraws pile up in the file
    (22 MB for 100k steps), and the metrics line every ``trainer.log_every_n_steps`` shows the progress."""
    return bool(asked) and sys.stdout.isatty()


# -- the run -----------------------------------------------------------------------------------------
def run(cfg: DictConfig, *, run_dir: str | os.PathLike | None = None, command: str | None = None,
        cli_overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Train and evaluate one configuration; write and return its run record (``results.json``).

    Resumes from the newest complete checkpoint of the run folder (``resume=auto``) or ``ckpt_path``;
    raises ``Preempted`` after saving when a stop signal arrives, ``NonFiniteLoss`` on a NaN/Inf loss.
    """

    started = RunClock(time.time(), time.process_time())
    apply_scale(cfg, cli_overrides)
    validate(cfg)
    # The hash of the config as asked for: the build below fills in values found in the data (max_len,
    # QKNorm's g0, ...), and a rerun must find this record by the hash it computes before that.
    asked_hash = asked_config_hash(cfg)
    done = completed_twin(cfg)
    if done is not None:
        return done
    run_dir = Path(run_dir or cfg.paths.run_dir)
    check_writable(run_dir)
    with RunSignals() as signals:
        record = _train_and_test(cfg, run_dir, command, started, asked_hash, signals)
        if signals.pending is not None:
            log.warning("the run completed and its record was written before it could stop for %s; nothing to "
                        "resume", signal.Signals(signals.pending).name)
        return record


def _train_and_test(cfg: DictConfig, run_dir: Path, command: str | None, started: RunClock, asked_hash: str | None,
                    signals: RunSignals) -> dict[str, Any]:
    """``run`` in its folder: prepare, fit, test, record."""
    try:
        with signals.raising("while preparing the run (data, tokenizer, model)"):
            prepared = _prepare(cfg, run_dir, signals, started)
    except (StoppedBySignal, KeyboardInterrupt) as exc:
        raise stopped_before_training(cfg, run_dir, command, exc) from None
    tested = _fit_and_test(cfg, run_dir, command, started, asked_hash, signals, prepared)
    return _record_completed(cfg, run_dir, command, started, asked_hash, prepared, tested)


@dataclass
class _Prepared:
    """What the preparation hands to fitting, testing and the record."""

    task: Any  # the TaskData
    module: L.LightningModule
    callbacks: list
    last: LastCheckpoint | None
    datamodule: L.LightningDataModule
    loggers: list
    trainer: L.Trainer
    resume_path: str | None


def _prepare(cfg: DictConfig, run_dir: Path, signals: RunSignals, started: RunClock) -> _Prepared:
    """Seeds and threads, the task, the module (resumed or initialised), callbacks, loggers and the trainer."""
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    if cfg.hardware.matmul_precision:
        torch.set_float32_matmul_precision(cfg.hardware.matmul_precision)
    if cfg.hardware.get("torch_threads"):
        # Parallel sweeps give each job cores/jobs threads, so jobs x threads never exceeds the cores.
        torch.set_num_threads(int(cfg.hardware.torch_threads))

    describe_config(cfg, run_dir)
    task = build_task_data(cfg)
    check_splits_not_empty(task)
    guard = build_nonfinite_guard(cfg)
    module = build_module(cfg, task, nonfinite_guard=guard)
    describe_build(cfg, task, module)
    resume = select_checkpoint(cfg, run_dir)
    resume_path, resume_ckpt = resume if resume else (None, None)
    if resume_path is not None:
        given = f"ckpt_path={resume_path}" if cfg.get("ckpt_path") else f"the run's checkpoint {resume_path}"
        check_weights_fit(module, model_weights(resume_ckpt, resume_path), given)
        log.info("resuming from %s (step %d)", resume_path, checkpoint_step(resume_ckpt))
    elif cfg.get("init_from"):
        init_weights_from(module, cfg.init_from)
        log.info("initialised weights from %s (optimizer, schedule and counters start afresh)",
                 cfg.init_from)
    callbacks = [*build_callbacks(cfg, run_dir, nonfinite_guard=guard), RunCost(started.wall, started.cpu)]
    last = next((c for c in callbacks if isinstance(c, LastCheckpoint)), None)
    if last is not None:  # last + top-k + one being written
        kept = 2 + int(cfg.callbacks.checkpoint.save_top_k or 0)
        check_free_space(run_dir, kept * checkpoint_bytes(module))
    else:
        check_free_space(run_dir, 1 << 20)
    wandb_id = wandb_run_id(run_dir, resume_ckpt) if wants_wandb(cfg) else None
    if last is not None:
        last.wandb_run_id = wandb_id
        last.run_signals = signals
    datamodule = build_datamodule(cfg, task)
    loggers = build_loggers(cfg, run_dir, resume_ckpt=resume_ckpt, wandb_id=wandb_id)
    del resume_ckpt  # Lightning reads the file again; do not hold two copies of the weights
    trainer = build_trainer(cfg, run_dir, callbacks=callbacks, loggers=loggers, max_len=task.max_len)
    # Lightning cannot see that ResumableDataModule restores the data position, and warns that it
    # does not.
    warnings.filterwarnings("ignore", message=".*your dataloader is not resumable.*")
    # nan_policy=skip returns None from training_step on purpose (Lightning then skips the update).
    warnings.filterwarnings("ignore", message=".*`training_step` returned `None`.*")
    return _Prepared(task, module, callbacks, last, datamodule, loggers, trainer, resume_path)


def _fit_and_test(cfg: DictConfig, run_dir: Path, command: str | None, started: RunClock, asked_hash: str | None,
                  signals: RunSignals, prepared: _Prepared) -> dict[str, Any]:
    """Fit, then test the weights ``checkpoint_choice.load_test_weights`` picks; what was tested. A stop on the way
    writes the interrupted record and raises."""
    task, module, callbacks, last = prepared.task, prepared.module, prepared.callbacks, prepared.last
    trainer, datamodule, resume_path = prepared.trainer, prepared.datamodule, prepared.resume_path
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_path, weights_only=True)
        tested = load_test_weights(cfg, module, callbacks, trainer.global_step)
        saved = str(last.path) if last is not None and last.path.is_file() else None
        with signals.raising("while testing", step=trainer.global_step, checkpoint=saved):
            trainer.test(module, datamodule=datamodule, verbose=False)
    except (OSError, RuntimeError) as exc:
        failure = storage_failure(exc, run_dir)  # the disk filled up or the folder became read-only mid-run
        if failure is not None:
            raise failure from None
        raise
    except Preempted as exc:
        write_interrupted_record(cfg, run_dir, command, trainer, module, callbacks, task, started, exc, asked_hash)
        raise
    except (SystemExit, KeyboardInterrupt) as exc:
        # Ctrl-C: Lightning shuts down and calls exit(1); a second Ctrl-C during that shutdown arrives here as
        # KeyboardInterrupt. Either way the run stops, and its record says so.
        if isinstance(exc, KeyboardInterrupt) or (trainer.interrupted and not isinstance(exc, SIGTERMException)):
            with signals_deferred():  # a further Ctrl-C may not cut the search or the record short
                found = find_resume_checkpoint(run_dir / CHECKPOINTS_DIR)  # what a rerun resumes from
                interrupted = Interrupted(trainer.global_step, str(found[0]) if found else None)
                write_interrupted_record(cfg, run_dir, command, trainer, module, callbacks, task, started,
                                          interrupted, asked_hash)
            raise interrupted from None
        if not isinstance(exc, SIGTERMException):
            raise
        # SIGTERM while testing: training is over and its checkpoint saved; a rerun only tests again.
        ckpt = last.path if last is not None and last.path.is_file() else None
        preempted = Preempted(signal.SIGTERM, trainer.global_step, str(ckpt) if ckpt else None)
        write_interrupted_record(cfg, run_dir, command, trainer, module, callbacks, task, started, preempted,
                                  asked_hash)
        raise preempted from None

    return tested


def _record_completed(cfg: DictConfig, run_dir: Path, command: str | None, started: RunClock, asked_hash: str | None,
                      prepared: _Prepared, tested: dict[str, Any]) -> dict[str, Any]:
    """The completed run's record, written with its decoded outputs (and published to W&B when asked)."""
    task, module, callbacks, loggers = prepared.task, prepared.module, prepared.callbacks, prepared.loggers
    trainer, resume_path = prepared.trainer, prepared.resume_path
    if trainer.global_step == 0 and not cfg.trainer.fast_dev_run:
        raise DataError("the run trained 0 steps (no training batch was drawn); it is not recorded as completed: "
                        "check the training split and trainer.limit_train_batches")
    flavour = tested.pop("flavour")
    resumed = {} if resume_path is None else {"resumed_from": str(Path(resume_path).resolve())}
    record = run_record(cfg, run_dir, command or shlex.join(sys.argv), trainer, module, callbacks, task, started,
                     status="completed", config_hash=asked_hash, flavours={"test_weights": flavour},
                     test_checkpoint=tested, **resumed)
    if trainer.is_global_zero:
        with storage_errors(run_dir), signals_deferred():
            write_decoded_outputs(run_dir / OUTPUTS_DIR, module.test_outputs, task)  # before the record: complete
            write_record(run_dir / RECORD_FILENAME, record)
    for lg in loggers:
        if lg.__class__.__name__ == "WandbLogger":
            if trainer.is_global_zero:
                publish_to_wandb(record, run_dir, run_dir / OUTPUTS_DIR)
            finish_wandb()
    return record

