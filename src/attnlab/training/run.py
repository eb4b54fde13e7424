"""One training run from a composed config: build task, module and trainer, fit, test, write the record.

``cli/train.py`` is a thin Hydra entry point over ``run``; tests and tools call ``build_module`` and
``build_datamodule`` directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

import attnlab
from attnlab.decoding.options import DecodingOptions
from attnlab.tasks import DataError, TaskData, build_task
from attnlab.training.callbacks import BestMetrics, MetricsLine, PonderStats, Throughput
from attnlab.training.checkpointing import (
    AtomicCheckpointIO,
    CheckpointError,
    LastCheckpoint,
    Preempted,
    RandomState,
    check_weights_fit,
    checkpoint_step,
    find_resume_checkpoint,
    has_checkpoints,
    init_weights_from,
    load_checkpoint_file,
    model_weights,
    remove_partial_files,
)
from attnlab.training.config import ConfigError, validate
from attnlab.training.faults import NonFiniteGuard, checkpoint_bytes
from attnlab.training.launch import is_launch_rank_zero
from attnlab.training.modules import MODULES, TaskModule, count_parameters
from attnlab.training.resumable import ResumableCSVLogger, ResumableDataModule
from attnlab.training.scale import apply_scale  # noqa: F401 - re-exported: run, eval and tests apply it here
from attnlab.training.stop_signals import RunSignals, StoppedBySignal, signals_deferred
from attnlab.training.storage import StorageError, check_free_space, check_writable, storage_failure
from attnlab.training.wandb_run import build_wandb_logger, finish_wandb, publish_to_wandb, wandb_run_id, wants_wandb

log = logging.getLogger("attnlab")


# -- config helpers ------------------------------------------------------------------------------------
def derive_batching(cfg: DictConfig, *, max_len: int | None = None) -> tuple[int, int]:
    """(micro-batch per device in sentences, gradient accumulation) so that one update sees
    ``batch.sentences_per_update`` sentences, or about ``batch.tokens_per_update`` tokens, whatever the
    hardware. In token mode the micro-batch is a cap on sentences and ``max_len`` (the task's longest
    sequence) sizes the token budget of a micro-batch (see ``token_budget``)."""
    world = cfg.hardware.devices * cfg.hardware.num_nodes
    if cfg.batch.get("tokens_per_update"):
        _, accumulate = token_budget(cfg, max_len)
        return micro_batch_ceiling(cfg, max_len), accumulate
    per_update = cfg.batch.sentences_per_update
    ceiling = micro_batch_ceiling(cfg, max_len)
    accumulate = math.ceil(per_update / (ceiling * world))
    micro, rest = divmod(per_update, world * accumulate)
    if rest or micro == 0:
        raise ConfigError(
            f"batch.sentences_per_update={per_update} cannot be split evenly over {world} device(s) with "
            f"micro-batches <= {ceiling} sentences (hardware.max_batch_per_device="
            f"{cfg.hardware.max_batch_per_device}, max_tokens_per_device="
            f"{cfg.hardware.get('max_tokens_per_device')}); use a multiple of {world * accumulate}"
        )
    return micro, accumulate


def micro_batch_ceiling(cfg: DictConfig, max_len: int | None) -> int:
    """Sentences a micro-batch may hold on one device: ``hardware.max_batch_per_device``, lowered so that
    that many sequences of ``max_len`` stay within ``hardware.max_tokens_per_device`` when it is set (a
    sentence count alone would ask BigBird Table 10 at paper size for 256 x 4096 = 1M tokens a micro-batch)."""
    ceiling = int(cfg.hardware.max_batch_per_device)
    tokens = cfg.hardware.get("max_tokens_per_device")
    if tokens and max_len:
        ceiling = max(1, min(ceiling, int(tokens) // int(max_len)))
    return ceiling


def token_budget(cfg: DictConfig, max_len: int | None) -> tuple[int, int]:
    """(padded tokens per micro-batch, gradient accumulation) for ``batch.tokens_per_update``: a
    micro-batch holds at most ``hardware.max_batch_per_device`` sequences of up to ``max_len`` tokens."""
    from attnlab.training.data import derive_token_batching

    if not max_len:
        raise ConfigError("batch.tokens_per_update needs the task's max length; build the task first")
    world = cfg.hardware.devices * cfg.hardware.num_nodes
    return derive_token_batching(int(cfg.batch.tokens_per_update), world=world,
                                 max_tokens_per_micro=micro_batch_ceiling(cfg, max_len) * int(max_len))


def build_task_data(cfg: DictConfig) -> TaskData:
    task_cfg = OmegaConf.to_container(cfg.task, resolve=True)
    task_cfg.setdefault("data_root", cfg.paths.data_root)
    log.info("loading data: task %s (%s)", cfg.task.name, task_cfg.get("source") or "local/generated")
    started = time.monotonic()
    task = build_task(task_cfg, int(cfg.seed))
    log.info("data: %s; max length %d (%.1f s)", data_sizes(task), task.max_len, time.monotonic() - started)
    return task


def data_sizes(task: TaskData) -> str:
    """``train 20000, val 256, test 128 examples`` (a streamed split without a length is shown as such)."""
    sizes = []
    for split, dataset in task.datasets.items():
        try:
            sizes.append(f"{split} {len(dataset)}")
        except TypeError:
            sizes.append(f"{split} (streamed)")
    return ", ".join(sizes) + " examples"


def describe_config(cfg: DictConfig, run_dir: Path) -> None:
    """The first lines of ``train.log``: where the run writes and the effective config in brief."""
    m, o, t, hw = cfg.model, cfg.optim, cfg.trainer, cfg.hardware
    per_update = (f"{cfg.batch.tokens_per_update} tokens" if cfg.batch.get("tokens_per_update")
                  else f"{cfg.batch.sentences_per_update} sentences")
    log.info("run folder: %s", run_dir.resolve())
    log.info("config: %stask %s, model %s, attention %s, recurrence %s, seed %s, scale %s%s",
             f"experiment {cfg.experiment_name}, " if cfg.get("experiment_name") else "", cfg.task.name, m.name,
             m.attention.name, m.recurrence.name, cfg.seed, cfg.scale.name,
             f", debug {cfg.debug_mode}" if cfg.get("debug_mode") else "")
    log.info("model: d_model %d, %d heads, d_ff %d, %d encoder + %d decoder layers, dropout %g", m.d_model,
             m.num_heads, m.d_ff, m.encoder_layers, m.decoder_layers, m.dropout)
    optimizer = o.optimizer._target_ if isinstance(o.optimizer, DictConfig) else o.optimizer
    schedule = (o.schedule._target_ if isinstance(o.schedule, DictConfig)
                else f"{o.schedule}, warmup {o.warmup_steps}")
    log.info("training: %d steps, %s per update, %s lr %g (%s), validation every %d steps; hardware %s "
             "(%d x %s, precision %s)", t.max_steps, per_update, optimizer, o.lr, schedule, t.val_check_interval,
             hw.name, hw.devices * hw.num_nodes, hw.accelerator, hw.precision)


def describe_build(cfg: DictConfig, task: TaskData, module: TaskModule) -> None:
    """What the data decided: batching, tokenizer and parameter count."""
    micro, accumulate = derive_batching(cfg, max_len=task.max_len)
    log.info("batching: micro-batch %d x %d accumulation x %d device(s)", micro, accumulate,
             cfg.hardware.devices * cfg.hardware.num_nodes)
    tokenizer = cfg.task.get("tokenizer")
    kind = f"{tokenizer.kind} (asked vocabulary {tokenizer.get('vocab_size')}), " if tokenizer else ""
    source = f", source {task.src_vocab_size}" if task.src_vocab_size and task.src_vocab_size != task.vocab_size else ""
    log.info("tokenizer: %svocabulary %d%s", kind, task.vocab_size, source)
    params = count_parameters(module.model)
    log.info("parameters: %s total, %s trainable", f"{params['total']:,}", f"{params['trainable']:,}")


def model_config(cfg: DictConfig, task: TaskData) -> dict[str, Any]:
    """The model section as a plain dict, with what only the data knows filled in."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.pop("at_scale", None)
    if model.get("max_len") is None:
        model["max_len"] = task.max_len
    elif task.max_len > model["max_len"] and longest_example(task) > model["max_len"]:
        # A seq2seq task's max_len includes room to decode (max_len_a x source + max_len_b); an explicit
        # model.max_len (the synthesizers' l_max) only has to hold the data: decoding stops at it.
        raise ConfigError(
            f"the task needs sequences of length {longest_example(task)} but model.max_len={model['max_len']}; "
            f"raise model.max_len or shorten the task"
        )
    from attnlab.attention.registry import get_entry

    attention = model["attention"]
    model["attention"] = get_entry(attention["name"]).cls.resolve_options(
        attention, run_seed=int(cfg.seed), train_lengths=list(task.train_lengths))
    return model


def longest_example(task: TaskData) -> int:
    """The longest sequence a model must hold over every split (BOS/EOS included), without decoding room."""
    from attnlab.training.data import example_length

    if task.kind != "seq2seq" or not task.datasets:
        return task.max_len
    return max(max(example_length(ds[i]) for i in range(len(ds))) + 1 for ds in task.datasets.values() if len(ds))


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
    """``task.decoding`` with every key, as the plain dict the module keeps in its checkpoint."""
    dec = cfg.task.get("decoding")
    return dataclasses.asdict(DecodingOptions.of(OmegaConf.to_container(dec, resolve=True) if dec else None))


def run_flavours(cfg: DictConfig, task: TaskData) -> dict[str, Any]:
    """The task's metric flavours; a seq2seq task that does not describe its decoding gets the decoding the
    module actually used (strategy, beam, which length penalty)."""
    flavours = dict(task.metric_flavours)
    if task.kind == "seq2seq":
        flavours.setdefault("decoding", DecodingOptions.of(decoding_config(cfg)).describe())
    return flavours


def build_module(cfg: DictConfig, task: TaskData | None = None) -> TaskModule:
    task = task or build_task_data(cfg)
    module_cls = MODULES[task.kind]
    module = module_cls(model_config(cfg, task), OmegaConf.to_container(cfg.optim, resolve=True), task_info(task),
                        decoding_config(cfg))
    if task.score_text is not None:
        module.text_scorer, module.references = task.score_text, task.references
    if task.kind == "seq2seq":  # decoded test outputs are kept for the outputs files (training/outputs.py)
        module.detokenize = task.detokenize
    return module


def build_datamodule(cfg: DictConfig, task: TaskData | None = None) -> ResumableDataModule:
    task = task or build_task_data(cfg)
    micro, _ = derive_batching(cfg, max_len=task.max_len)
    micro_tokens = token_budget(cfg, task.max_len)[0] if cfg.batch.get("tokens_per_update") else None
    return ResumableDataModule(task, micro_batch=micro, eval_batch=cfg.batch.eval_batch_size,
                               num_workers=cfg.hardware.num_workers, shuffle_seed=int(cfg.seed),
                               micro_tokens=micro_tokens)


# -- resuming ----------------------------------------------------------------------------------------------
OUTPUTS_DIR = "outputs"  # decoded test outputs beside results.json (training/outputs.py)


def select_checkpoint(cfg: DictConfig, run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint this run resumes from: ``ckpt_path`` if given, else (``resume=auto``) the newest
    complete one in the run folder, else None (a fresh start)."""
    ckpt_dir = run_dir / "checkpoints"
    if is_launch_rank_zero():  # the folder's owner tidies it; the other ranks read what is there
        remove_partial_files(ckpt_dir)
    if cfg.get("ckpt_path"):
        path = Path(cfg.ckpt_path)
        return path, load_checkpoint_file(path)
    if cfg.get("resume", "auto") == "never":
        if has_checkpoints(ckpt_dir):
            raise ConfigError(f"resume=never but {ckpt_dir} already holds checkpoints; use resume=auto to "
                              f"continue that run, or a new paths.run_id for a fresh one")
        return None
    found = find_resume_checkpoint(ckpt_dir)
    if found is None and has_checkpoints(ckpt_dir):
        raise CheckpointError(f"no usable checkpoint in {ckpt_dir} (every file is corrupt); move them away to "
                              f"start afresh, or pass ckpt_path=")
    return found


# -- loggers and callbacks ------------------------------------------------------------------------------
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
                       NonFiniteGuard(cfg.get("nan_policy", "stop"), int(cfg.get("max_skipped_batches", 0))),
                       MetricsLine(cfg.trainer.log_every_n_steps)]
    if c.get("checkpoint"):
        ck = c.checkpoint
        if ck.save_top_k:
            callbacks.append(ModelCheckpoint(
                dirpath=str(run_dir / "checkpoints"), monitor=ck.monitor, mode=ck.mode, save_last=False,
                save_top_k=ck.save_top_k, filename="step{step:07d}", auto_insert_metric_name=False,
            ))
        # After ModelCheckpoint in the list (Lightning keeps that order), so last.ckpt records the newest best.
        if ck.save_last:
            callbacks.append(LastCheckpoint(run_dir / "checkpoints", every_n_steps=ck.get("every_n_steps"),
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
        from attnlab.training.attention_record import AttentionWeightsHistogram

        callbacks.append(AttentionWeightsHistogram(str(run_dir), sample_size=c.get("record_attention_sample_size", 8)))
    return callbacks + instantiate_own(c, "callbacks")


def build_trainer(cfg: DictConfig, run_dir: Path, *, callbacks: list, loggers: list,
                  max_len: int | None = None) -> L.Trainer:
    from lightning.pytorch.callbacks import Checkpoint
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    t, hw = cfg.trainer, cfg.hardware
    _, accumulate = derive_batching(cfg, max_len=max_len)
    strategy = hw.strategy
    if strategy == "ddp" and hw.accelerator == "cpu":
        from lightning.pytorch.strategies import DDPStrategy

        strategy = DDPStrategy(process_group_backend="gloo", start_method="popen")
    plugins: list = [AtomicCheckpointIO()]
    if SLURMEnvironment.detect():
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


class RunClock(NamedTuple):
    """When a run started: wall time (``time.time``) and this process's CPU time (``time.process_time``; a
    launcher worker runs several jobs, so the CPU clock is read per run, not since the process started)."""

    wall: float
    cpu: float


# -- provenance ----------------------------------------------------------------------------------------
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
    from attnlab.training.perf import MFUCallback

    found = next((c for c in callbacks if isinstance(c, MFUCallback)), None)
    return found.summary() if found is not None else {"mfu": None}


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
# How a run restarts is not what it computes (ckpt_path is excluded already); recording attention weights
# reads the trained model after training, so turning it on changes no number (and no existing hash).
# Where the user's own code is found (plugins) is not what it computes: the names it registers are hashed.
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
    asked_hash = _safe_hash(cfg)
    done = _completed_twin(cfg)
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
            L.seed_everything(int(cfg.seed), workers=True, verbose=False)
            if cfg.hardware.matmul_precision:
                torch.set_float32_matmul_precision(cfg.hardware.matmul_precision)
            if cfg.hardware.get("torch_threads"):
                # Parallel sweeps give each job cores/jobs threads, so jobs x threads never exceeds the cores.
                torch.set_num_threads(int(cfg.hardware.torch_threads))

            describe_config(cfg, run_dir)
            task = build_task_data(cfg)
            check_splits_not_empty(task)
            module = build_module(cfg, task)
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
            callbacks = build_callbacks(cfg, run_dir)
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
            module.nonfinite_guard = next(c for c in callbacks if isinstance(c, NonFiniteGuard))
            datamodule = build_datamodule(cfg, task)
            loggers = build_loggers(cfg, run_dir, resume_ckpt=resume_ckpt, wandb_id=wandb_id)
            del resume_ckpt  # Lightning reads the file again; do not hold two copies of the weights
            trainer = build_trainer(cfg, run_dir, callbacks=callbacks, loggers=loggers, max_len=task.max_len)
            # Lightning cannot see that ResumableDataModule restores the data position, and warns that it
            # does not.
            warnings.filterwarnings("ignore", message=".*your dataloader is not resumable.*")
            # nan_policy=skip returns None from training_step on purpose (Lightning then skips the update).
            warnings.filterwarnings("ignore", message=".*`training_step` returned `None`.*")
    except (StoppedBySignal, KeyboardInterrupt) as exc:
        raise _stopped_before_training(cfg, run_dir, command, exc) from None
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
        _write_interrupted_record(cfg, run_dir, command, trainer, module, callbacks, task, started, exc, asked_hash)
        raise
    except (SystemExit, KeyboardInterrupt) as exc:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        # Ctrl-C: Lightning shuts down and calls exit(1); a second Ctrl-C during that shutdown arrives here as
        # KeyboardInterrupt. Either way the run stops, and its record says so.
        if isinstance(exc, KeyboardInterrupt) or (trainer.interrupted and not isinstance(exc, SIGTERMException)):
            with signals_deferred():  # a further Ctrl-C may not cut the search or the record short
                found = find_resume_checkpoint(run_dir / "checkpoints")  # what a rerun resumes from
                interrupted = Interrupted(trainer.global_step, str(found[0]) if found else None)
                _write_interrupted_record(cfg, run_dir, command, trainer, module, callbacks, task, started,
                                          interrupted, asked_hash)
            raise interrupted from None
        if not isinstance(exc, SIGTERMException):
            raise
        # SIGTERM while testing: training is over and its checkpoint saved; a rerun only tests again.
        ckpt = last.path if last is not None and last.path.is_file() else None
        preempted = Preempted(signal.SIGTERM, trainer.global_step, str(ckpt) if ckpt else None)
        _write_interrupted_record(cfg, run_dir, command, trainer, module, callbacks, task, started, preempted,
                                  asked_hash)
        raise preempted from None

    if trainer.global_step == 0 and not cfg.trainer.fast_dev_run:
        raise DataError("the run trained 0 steps (no training batch was drawn); it is not recorded as completed: "
                        "check the training split and trainer.limit_train_batches")
    record = _record(cfg, run_dir, command, trainer, module, callbacks, task, started, status="completed",
                     config_hash=asked_hash)
    record["metric_flavours"]["test_weights"] = tested.pop("flavour")
    record["extra"]["test_checkpoint"] = tested
    if resume_path is not None:
        record["extra"]["resumed_from"] = str(Path(resume_path).resolve())
    if trainer.is_global_zero:
        from attnlab.results.record import RECORD_FILENAME, write_record
        from attnlab.training.outputs import write_decoded_outputs

        with _storage_errors(run_dir), signals_deferred():
            write_decoded_outputs(run_dir / OUTPUTS_DIR, module.test_outputs, task)  # before the record: complete
            write_record(run_dir / RECORD_FILENAME, record)
    for lg in loggers:
        if lg.__class__.__name__ == "WandbLogger":
            if trainer.is_global_zero:
                publish_to_wandb(record, run_dir, run_dir / OUTPUTS_DIR)
            finish_wandb()
    return record


def load_test_weights(cfg: DictConfig, module: TaskModule, callbacks: list, final_step: int) -> dict[str, Any]:
    """Put the weights the test splits are scored with into ``module`` (``test_weights``) and describe them:
    ``last`` keeps the final weights; ``best`` loads the checkpoint best by ``callbacks.checkpoint.monitor``
    (QKNorm tests its best-dev-BLEU checkpoint). Returns the record's description, ``flavour`` included."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    if cfg.get("test_weights", "last") == "last":
        return {"weights": "last", "step": final_step, "flavour": "last weights (end of training)"}
    best = next((c for c in callbacks if isinstance(c, ModelCheckpoint)), None)
    monitor, mode = cfg.callbacks.checkpoint.monitor, cfg.callbacks.checkpoint.mode
    flavour = f"best checkpoint by {monitor} ({mode})"
    if best is None or not best.best_model_path:
        log.warning("test_weights=best, but no checkpoint was selected by %s (no validation ran): testing the "
                    "last weights", monitor)
        return {"weights": "last", "step": final_step, "flavour": "last weights (no validation ran)"}
    ckpt = load_checkpoint_file(Path(best.best_model_path))
    module.load_state_dict(ckpt["state_dict"])
    score = best.best_model_score
    log.info("testing the best checkpoint by %s: %s", monitor, best.best_model_path)
    return {"weights": "best", "monitor": monitor, "mode": mode, "step": checkpoint_step(ckpt),
            "score": None if score is None else float(score), "path": str(best.best_model_path), "flavour": flavour}


def _record(cfg: DictConfig, run_dir: Path, command: str | None, trainer: L.Trainer, module: TaskModule,
            callbacks: list, task: TaskData, started: RunClock, *, status: str,
            config_hash: str | None) -> dict[str, Any]:

    throughput = next(c for c in callbacks if isinstance(c, Throughput))
    best = next(c for c in callbacks if isinstance(c, BestMetrics))
    guard = next(c for c in callbacks if isinstance(c, NonFiniteGuard))
    params = count_parameters(module.model)
    wandb_id = next((lg.experiment.id for lg in trainer.loggers if lg.__class__.__name__ == "WandbLogger"), None)
    return {
        "schema_version": 1,
        "status": status,
        "error": None,
        "experiment": cfg.get("experiment_name"),
        "row": cfg.get("row"),
        "task": cfg.task.name,
        "model": {"name": cfg.model.name, "attention": cfg.model.attention.name,
                  "recurrence": cfg.model.recurrence.name},
        "seed": int(cfg.seed),
        "scale": cfg.scale.name,
        "config_hash": config_hash,
        "git": git_state(),
        "hardware": {"name": cfg.hardware.name, "accelerator": cfg.hardware.accelerator,
                     "devices": cfg.hardware.devices, "num_nodes": cfg.hardware.num_nodes,
                     "precision": str(cfg.hardware.precision)},
        "metrics": {"final": collect_metrics(trainer) if status == "completed" else {}, "best": dict(best.best)},
        "params": params,
        "cost": {"wall_s": round(time.time() - started.wall, 2),
                 # CPU seconds of this process (all its threads) and its torch threads: at one thread the CPU time
                 # is what the run costs alone, however loaded the machine was (reproduce-list's estimates)
                 "cpu_s": round(time.process_time() - started.cpu, 2), "torch_threads": torch.get_num_threads(),
                 "tokens_per_s": throughput.average_tokens_per_s(),
                 "step_s": throughput.average_step_s(), "peak_mem_mb": peak_memory_mb(module.device),
                 "steps": trainer.global_step,
                 # start-up: config checks, data, tokenizer and model up to the first training batch
                 "startup_s": round(throughput.first_batch_at - started.wall, 2) if throughput.first_batch_at else None,
                 # callbacks.mfu: model FLOPs utilisation over the run against the matmul peak measured in the
                 # same process on CPU (the datasheet peak on listed GPUs); see training/perf.py
                 **mfu_summary(callbacks)},
        "metric_flavours": run_flavours(cfg, task),
        "wandb_run_id": wandb_id,
        "run_dir": str(run_dir.resolve()),
        "command": command or shlex.join(sys.argv),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "lightning": L.__version__, "attnlab": attnlab.__version__},
        "extra": {"debug": cfg.get("debug_mode"), "skipped_batches": guard.skipped,
                  **_attention_coverage(module, task)},
    }


def _attention_coverage(module: TaskModule, task: TaskData) -> dict[str, Any]:
    """``attention_coverage``: the sparse attention's attended fraction over the test split's lengths
    (training/sparsity.py); 1.0 for a bidirectional encoder's dense attention; nothing for other dense models."""
    from attnlab.training.data import example_length
    from attnlab.training.sparsity import coverage_summary, dense_coverage, sparse_modules

    test = task.datasets.get(next(iter(task.eval_splits.values()), "test"))
    if test is None:
        return {}
    lengths = (example_length(test[i]) for i in range(len(test)))
    if not sparse_modules(module.model):
        dense = dense_coverage(module.model, lengths)
        return {"attention_coverage": dense} if dense else {}
    summary = coverage_summary(module.model, lengths)
    if summary is None:
        return {}
    log.info("sparse attention attends %.1f%% of the keys on average (max %.1f%%) over test lengths %d-%d",
             100 * summary["attended_fraction_mean"], 100 * summary["attended_fraction_max"],
             summary["lengths"]["min"], summary["lengths"]["max"])
    return {"attention_coverage": summary}


def _write_interrupted_record(cfg, run_dir, command, trainer, module, callbacks, task, started,
                              exc: Preempted, config_hash: str | None) -> None:
    """An ``interrupted`` record: the run is unfinished, its checkpoint is on disk, and a rerun resumes it
    (``extra.interrupted`` for Ctrl-C, ``extra.preempted`` for a stop signal)."""
    if not trainer.is_global_zero:
        return
    record = _record(cfg, run_dir, command, trainer, module, callbacks, task, started, status="interrupted",
                     config_hash=config_hash)
    key = "interrupted" if isinstance(exc, Interrupted) else "preempted"
    record["extra"][key] = {"signal": signal.Signals(exc.signum).name, "step": exc.step,
                            "checkpoint": exc.checkpoint, "resume_with": record["command"]}
    from attnlab.results.record import RECORD_FILENAME, write_record

    try:
        with _storage_errors(run_dir), signals_deferred():
            write_record(run_dir / RECORD_FILENAME, record)
    except StorageError as failure:
        log.error("%s", failure)  # the stop itself is reported by the caller


def _stopped_before_training(cfg: DictConfig, run_dir: Path, command: str | None,
                             exc: StoppedBySignal | KeyboardInterrupt) -> Preempted:
    """Ctrl-C or a stop signal before training started: an ``interrupted`` record made from the config, and
    the exception the CLI reports (a resumed run may have checkpoints: the rerun resumes from the newest)."""
    with signals_deferred():  # a further Ctrl-C may not cut the search short (the record defers its own)
        found = find_resume_checkpoint(run_dir / "checkpoints")
    step, checkpoint = (checkpoint_step(found[1]), str(found[0])) if found else (0, None)
    if isinstance(exc, KeyboardInterrupt):
        stopped: Preempted = Interrupted(step, checkpoint)
    else:
        stopped = StoppedBySignal(exc.signum, step, checkpoint, exc.where, exc.previous_handler)
    key = "interrupted" if isinstance(stopped, Interrupted) else "preempted"
    command = command or shlex.join(sys.argv)
    write_config_record(cfg, run_dir, command, status="interrupted",
                        extra={key: {"signal": signal.Signals(stopped.signum).name, "step": step,
                                     "checkpoint": checkpoint, "resume_with": command, "phase": "before training"}})
    return stopped


class Interrupted(Preempted):
    """Ctrl-C stopped training; a rerun of the same command resumes from the newest checkpoint on disk."""

    def __init__(self, step: int, checkpoint: str | None) -> None:
        super().__init__(signal.SIGINT, step, checkpoint)
        where = f"the newest checkpoint, {checkpoint}" if checkpoint else "the start (no checkpoint was written yet)"
        self.args = (f"interrupted (Ctrl-C) at step {step}; rerun the same command to resume from {where}",)


def check_splits_not_empty(task: TaskData) -> None:
    """An empty training, validation or test split is bad data, found before any training."""
    for split in dict.fromkeys(("train", "val", *task.eval_splits.values())):
        dataset = task.datasets.get(split)
        if dataset is not None and hasattr(dataset, "__len__") and len(dataset) == 0:
            purpose = "train on" if split == "train" else "score"
            raise DataError(f"split {split} of the task is empty: nothing to {purpose}; check the task's data "
                            f"files and size keys")


@contextlib.contextmanager
def _storage_errors(run_dir: Path):
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


def write_config_record(cfg: DictConfig, run_dir: str | os.PathLike, command: str, *, status: str,
                        error: str | None = None, extra: dict[str, Any] | None = None) -> bool:
    """A run record made from the config alone (the run failed or stopped before its model or trainer
    existed); False when the folder cannot take it, with nothing half-written. A second Ctrl-C or stop
    signal waits until the record is on disk."""
    from attnlab.results.record import RECORD_FILENAME, write_record

    def pick(dotted: str):
        try:
            return OmegaConf.select(cfg, dotted)
        except Exception:  # noqa: BLE001 - a broken config must still yield a failure record
            return None

    record = {
        "schema_version": 1,
        "status": status,
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
    if extra:
        record["extra"] = extra
    try:
        with signals_deferred():
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            write_record(Path(run_dir) / RECORD_FILENAME, record)
    except OSError as exc:
        log.debug("no %s record written in %s: %s", status, run_dir, exc)
        return False
    return True


def _completed_twin(cfg: DictConfig) -> dict[str, Any] | None:
    """With ATTNLAB_SKIP_EXISTING=1 (``make reproduce-*`` sets it): the record of a completed run of the
    same config hash under ``paths.runs_dir``, so a re-run of a table trains only what is missing."""
    from attnlab.results.lookup import find_completed, search_roots, skip_existing_requested
    from attnlab.results.record import read_record

    if not skip_existing_requested():
        return None
    # runs/ and the published results/runs: a clean clone skips what is committed.
    done = find_completed(search_roots(cfg.paths.runs_dir), _safe_hash(cfg))  # the hash the record carries
    if done is None:
        return None
    log.info("skipping: a completed run with the same config hash exists: %s", done)
    return read_record(done)


def _safe_hash(cfg: DictConfig) -> str | None:
    from attnlab.results.record import DEFAULT_HASH_EXCLUDE, config_hash

    exclude = DEFAULT_HASH_EXCLUDE
    try:
        return config_hash(OmegaConf.to_container(cfg, resolve=True), exclude=exclude)
    except Exception:  # noqa: BLE001 - resolved below without the keys the hash leaves out
        pass
    # Outside a Hydra run (a tool, a test after another test cleared Hydra's state) ``paths.run_dir`` =
    # ${hydra:runtime.output_dir} cannot resolve; it is not hashed, so drop the excluded keys and resolve the
    # rest: the same hash as inside the run.
    trimmed = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    _drop_excluded(trimmed, exclude, "")
    try:
        return config_hash(OmegaConf.to_container(trimmed, resolve=True), exclude=exclude)
    except Exception:  # noqa: BLE001 - an unresolvable config is hashed as written
        return config_hash(OmegaConf.to_container(cfg, resolve=False), exclude=exclude)


def _drop_excluded(node: DictConfig, exclude: tuple[str, ...], prefix: str) -> None:
    from attnlab.results.record import is_excluded

    for key in list(node.keys()):
        path = f"{prefix}{key}"
        if is_excluded(path, exclude):
            del node[key]
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none() \
                and not child._is_interpolation():
            _drop_excluded(child, exclude, path + ".")
