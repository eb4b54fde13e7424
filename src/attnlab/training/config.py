"""Typed schema of the composed config, checked once after Hydra composes it.

Hydra's struct mode already refuses keys that no config defines; this adds types and value checks per
section, using the option dataclasses that attention variants, recurrences and task loaders register.
Every failure is a ``ConfigError`` whose message is one line naming the key and what is valid.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from attnlab.decoding.options import DecodingOptions
from attnlab.errors import ConfigError
from attnlab.training.acceleration import check_speed_options


@dataclass
class ModelSchema:
    name: str
    d_model: int
    num_heads: int
    d_ff: int
    encoder_layers: int
    decoder_layers: int
    dropout: float
    attention_dropout: float
    activation_dropout: float
    activation: str
    norm_first: bool
    positions: str
    share_embeddings: bool
    tie_output: bool
    max_len: Any
    cross_attention: Any
    random_position_offset: int = 0
    attention: dict = field(default_factory=dict)
    recurrence: dict = field(default_factory=dict)
    at_scale: dict = field(default_factory=dict)


@dataclass
class HardwareSchema:
    name: str
    accelerator: str
    devices: int
    num_nodes: int
    strategy: str
    precision: str
    max_batch_per_device: int
    num_workers: int
    matmul_precision: str
    torch_threads: int | None = None
    max_tokens_per_device: int | None = None  # token ceiling of a micro-batch (run.micro_batch_ceiling)
    # Speed options, each auto | true | false (training/acceleration.py); absent from older saved configs.
    pin_memory: Any = "auto"
    fused_optimizer: Any = "auto"
    activation_checkpointing: Any = False
    compile: Any = False
    nan_check: str = "auto"  # auto | every_step | deferred


@dataclass
class OptimSchema:
    optimizer: Any      # adam | adamw | {_target_: torch.optim.SGD, ...} (called with the parameter groups and lr)
    lr: float
    betas: list[float]
    eps: float
    weight_decay: float
    schedule: Any       # inverse_sqrt | cosine | constant | {_target_: a torch LR scheduler, called with the optimizer}
    warmup_steps: int
    min_lr_ratio: float
    label_smoothing: float
    grad_clip: float
    plateau: Any = None   # null, or training/plateau.py PlateauOptions: decay on a validation plateau, stop_lr
    freeze_embeddings: bool = False  # token embeddings and output softmax kept fixed (Synthesizer T5 fine-tuning)


@dataclass
class TrainerSchema:
    max_steps: int
    val_check_interval: int
    limit_val_batches: float
    limit_train_batches: float
    limit_test_batches: float
    log_every_n_steps: int
    deterministic: Any
    fast_dev_run: Any
    overfit_batches: float
    num_sanity_val_steps: int
    detect_anomaly: bool
    profiler: Any
    enable_progress_bar: bool


@dataclass
class BatchSchema:
    sentences_per_update: int
    eval_batch_size: int
    tokens_per_update: Any = None   # int: token-budget batching (training/data.py); null: by sentences


@dataclass
class LoggerSchema:
    csv: Any = None
    wandb: Any = None
    tensorboard: Any = None


@dataclass
class CallbacksSchema:
    checkpoint: Any = None
    lr_monitor: bool = False
    ponder_stats: Any = None
    mfu: bool = False
    record_attention: bool = False  # attention-weight histograms at the end of training (attention_capture.py)
    record_attention_sample_size: int = 8


@dataclass
class WandbSchema:
    project: str
    entity: Any
    group: Any
    tags: list[str]
    offline: bool
    log_model: bool
    name: Any = None         # null: <row or run name>-s<seed>
    job_type: Any = "train"
    notes: Any = None


CHOICES = {
    "model.activation": ("relu", "gelu"),
    "model.positions": ("sinusoidal", "learned", "none"),
    "hardware.accelerator": ("cpu", "gpu", "cuda", "mps", "auto"),
    "hardware.precision": ("32", "32-true", "bf16-mixed", "16-mixed", "bf16-true", "64"),
    "hardware.matmul_precision": ("highest", "high", "medium"),
    "optim.optimizer": ("adam", "adamw"),
    "optim.schedule": ("inverse_sqrt", "cosine", "constant"),
    "task.decoding.strategy": ("greedy", "beam"),
    "task.decoding.length_penalty": ("gnmt", "fairseq"),
    "test_weights": ("last", "best"),
}

POSITIVE = ("model.d_model", "model.num_heads", "model.d_ff", "hardware.devices", "hardware.num_nodes",
            "hardware.max_batch_per_device", "batch.sentences_per_update", "batch.eval_batch_size",
            "batch.tokens_per_update", "callbacks.record_attention_sample_size",
            "trainer.log_every_n_steps", "trainer.val_check_interval", "optim.lr", "hardware.torch_threads",
            "hardware.max_tokens_per_device")
NON_NEGATIVE = ("model.encoder_layers", "model.random_position_offset", "model.decoder_layers", "optim.warmup_steps",
                "hardware.num_workers", "optim.weight_decay", "optim.grad_clip", "trainer.num_sanity_val_steps")


# Lightning Trainer arguments a Lightning user types under ``trainer.``, and where attnlab keeps what they set: the
# experiment owns the optimisation problem (clipping, global batch, length of training) and ``hardware`` how it is
# computed, so the trainer section holds only cadence and debugging knobs.
LIGHTNING_TRAINER_KEYS = {
    "gradient_clip_val": "optim.grad_clip (clipping by global norm; 0 turns it off)",
    "gradient_clip_algorithm": "optim.grad_clip (always by global norm)",
    "accumulate_grad_batches": "batch.sentences_per_update or batch.tokens_per_update (the global batch; attnlab "
                               "derives the accumulation from it and hardware.max_batch_per_device)",
    "max_epochs": "trainer.max_steps (runs are measured in updates)",
    "min_epochs": "trainer.max_steps (runs are measured in updates)",
    "max_time": "trainer.max_steps (runs are measured in updates)",
    "check_val_every_n_epoch": "trainer.val_check_interval (in updates)",
    "precision": "hardware.precision (or a hardware= preset: cpu, cpu_bf16, gpu1, ...)",
    "accelerator": "hardware.accelerator (or a hardware= preset)",
    "devices": "hardware.devices (or a hardware= preset)",
    "num_nodes": "hardware.num_nodes (or hardware=multinode)",
    "strategy": "hardware.strategy (or a hardware= preset)",
    "default_root_dir": "paths.runs_dir or hydra.run.dir (where the run folder goes)",
    "logger": "logger=csv|wandb|tensorboard (the logger group)",
    "callbacks": "callbacks.* (the callbacks group)",
    "enable_checkpointing": "callbacks.checkpoint",
}


def _check(node: Any, schema: type, path: str) -> None:
    """Merge ``node`` into the structured schema: unknown keys and wrong types fail with one line."""
    if schema is TrainerSchema:
        typed = sorted(set(node.keys()) & LIGHTNING_TRAINER_KEYS.keys()) if hasattr(node, "keys") else []
        if typed:
            raise ConfigError(f"trainer.{typed[0]} is a Lightning Trainer argument that attnlab sets from its own "
                              f"config: use {LIGHTNING_TRAINER_KEYS[typed[0]]}")
    try:
        OmegaConf.merge(OmegaConf.structured(schema), node)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or getattr(exc, "key", None) or "?"
        msg = getattr(exc, "msg", str(exc)).splitlines()[0]
        valid = ", ".join(f.name for f in dataclasses.fields(schema))
        if "not in struct" in msg or "Key" in msg and "not" in msg:
            raise ConfigError(f"unknown key {path}.{key}; valid keys of {path}: {valid}") from None
        raise ConfigError(f"{path}.{key}: {msg}") from None


def _check_options(node: dict, options_cls: type, path: str, label: str) -> None:
    names = {f.name: f for f in dataclasses.fields(options_cls)}
    body = {k: v for k, v in node.items() if k != "name"}
    unknown = sorted(set(body) - set(names))
    if unknown:
        raise ConfigError(f"unknown key {path}.{unknown[0]} for {label}; valid: {', '.join(sorted(names)) or 'none'}")
    try:
        OmegaConf.merge(OmegaConf.structured(options_cls), body)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "key", "?")
        raise ConfigError(f"{path}.{key}: {getattr(exc, 'msg', str(exc)).splitlines()[0]}") from None


def _get(cfg: DictConfig, dotted: str):
    return OmegaConf.select(cfg, dotted, throw_on_missing=False)


# Keys that take your own class instead of a built-in name (docs/extending.md).
TARGET_ALLOWED = ("optim.optimizer", "optim.schedule")


def _builtin(node: DictConfig) -> DictConfig:
    """``node`` without the entries that name their own class (``_target_``): those are instantiated as
    written (training/run.py), the rest are checked against the schema."""
    own = [k for k, v in node.items_ex(resolve=False) if isinstance(v, DictConfig) and "_target_" in v]
    if not own:
        return node
    return OmegaConf.create({k: v for k, v in node.items_ex(resolve=False) if k not in own})


# -- the root config's own keys ------------------------------------------------------------------------
SECTIONS = ("model", "task", "hardware", "optim", "trainer", "batch", "logger", "callbacks", "scale")
ROOT_KEYS = ("seed", "resume", "ckpt_path", "init_from", "nan_policy", "max_skipped_batches", "run_name",
             "test_weights", "optimized_metric")
RESUME_MODES = ("auto", "never")
NAN_POLICIES = ("stop", "skip")
SEED_MAX = 2**32 - 1  # numpy's (and so Lightning's seed_everything's) seed range is [0, 2**32 - 1]
# Task keys that size a split (a split of 0 examples trains nothing or scores an empty test as 0.0).
SPLIT_SIZES = ("train_size", "val_size", "test_size")
# Packages a logger needs (TensorBoardLogger accepts either), with the extra that installs them.
LOGGER_PACKAGES = {"tensorboard": (("tensorboard", "tensorboardX"), "attnlab[tensorboard]"),
                   "wandb": (("wandb",), "wandb")}
# The attention roles (causal, cross) of each model layout a task schema declares (tasks.schemas.CommonTask).
LAYOUT_ROLES = {"decoder": [(True, False)], "encoder": [(False, False)],
                "encoder_decoder": [(False, False), (True, False), (False, True)]}


def resolved_view(cfg: DictConfig) -> DictConfig:
    """The sections and root keys with their interpolations resolved, i.e. the values the run reads:
    ``seed=${oc.env:HOME}`` is checked as the string it becomes, not as the text ``${...}``."""
    view: dict[str, Any] = {}
    for section in SECTIONS:
        try:
            view[section] = OmegaConf.to_container(cfg[section], resolve=True)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"cannot resolve {section}: {str(exc).splitlines()[0]}") from None
    for key in ROOT_KEYS:
        try:
            view[key] = OmegaConf.select(cfg, key, throw_on_missing=False)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"cannot resolve {key}: {str(exc).splitlines()[0]}") from None
    return OmegaConf.create(view)


def _typed(value: Any, hint: Any, key: str) -> None:
    """Refuse a value of the wrong type for ``hint`` strictly (a float key gets a finite number; an int key
    an integer, not the string an ``${oc.env:...}`` interpolation gives)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or type(hint).__name__ == "UnionType":
        if value is None and type(None) in args:
            return
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            return
        hint, origin, args = inner[0], typing.get_origin(inner[0]), typing.get_args(inner[0])
    if value is None:
        return  # a missing value for a required key is the schema merge's to report
    hint_text = " (an interpolation such as ${oc.env:NAME} gives a string: write ${oc.decode:${oc.env:NAME}})" \
        if isinstance(value, str) else ""
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{key}={value!r} must be an integer{hint_text}")
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}={value!r} must be a number{hint_text}")
        if not math.isfinite(value):
            raise ConfigError(f"{key}={value} must be a finite number")
    if hint is bool and not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} must be true or false")
    if origin is list and args and isinstance(value, list):
        for i, item in enumerate(value):
            _typed(item, args[0], f"{key}[{i}]")


def _check_types(node: Any, schema: type, path: str) -> None:
    if not isinstance(node, (dict, DictConfig)):
        return
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if f.name in node:
            _typed(node[f.name], hints.get(f.name, Any), f"{path}.{f.name}")


def _check_section(node: Any, schema: type, path: str) -> None:
    _check_types(node, schema, path)
    _check(node, schema, path)


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError (one line) for the first problem found in a composed config.

    Checks run on the resolved values, cheapest first: a bad number is refused before torch is imported
    for the attention and task registries.
    """
    view = resolved_view(cfg)
    _check_section(view.model, ModelSchema, "model")
    _check_section(view.hardware, HardwareSchema, "hardware")
    _check_section(view.optim, OptimSchema, "optim")
    _check_section(view.trainer, TrainerSchema, "trainer")
    _check_section(view.batch, BatchSchema, "batch")
    _check_section(_builtin(view.logger), LoggerSchema, "logger")
    _check_section(_builtin(view.callbacks), CallbacksSchema, "callbacks")
    if view.logger.get("wandb") is not None:
        _check_section(view.logger.wandb, WandbSchema, "logger.wandb")
    if view.task.get("decoding") is not None:
        _check_section(view.task.decoding, DecodingOptions, "task.decoding")
    check_root_keys(view)
    _check_ranges(view)
    check_speed_options(view)
    _check_loggers(view)

    from attnlab.attention import available, get_entry
    from attnlab.models.recurrence import available_recurrences, recurrence_options
    from attnlab.plugins import load_plugins
    from attnlab.tasks.schemas import task_schema

    load_plugins(cfg)  # the variants, tasks and classes of the user's own modules (docs/extending.md)

    attention = view.model.attention.get("name")
    if attention not in available():
        raise ConfigError(f"model.attention.name={attention!r} is not a variant; valid: {', '.join(available())}")
    _check_types(view.model.attention, get_entry(attention).options, "model.attention")
    _check_options(view.model.attention, get_entry(attention).options, "model.attention", f"attention {attention}")
    recurrence = view.model.recurrence.get("name")
    if recurrence not in available_recurrences():
        raise ConfigError(
            f"model.recurrence.name={recurrence!r}; valid: {', '.join(available_recurrences())}"
        )
    _check_types(view.model.recurrence, recurrence_options(recurrence), "model.recurrence")
    _check_options(view.model.recurrence, recurrence_options(recurrence), "model.recurrence",
                   f"recurrence {recurrence}")
    _check_section(view.task, task_schema(view.task.get("loader")), "task")
    _check_task_sizes(view.task)
    impossible = task_schema(view.task.get("loader")).why_no_data(view.task) or _tokenizer_too_small(view.task)
    if impossible:
        raise ConfigError(f"{impossible}; task {view.task.get('name')} cannot generate its data")
    _check_attention_builds(view)

    if cfg.optim.get("plateau") is not None:
        from attnlab.training.plateau import PlateauOptions

        _check_options(cfg.optim.plateau, PlateauOptions, "optim.plateau", "the plateau decay")
        try:
            PlateauOptions(**OmegaConf.to_container(cfg.optim.plateau, resolve=True))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if cfg.get("test_weights") == "best" and not _get(cfg, "callbacks.checkpoint.save_top_k"):
        raise ConfigError("test_weights=best needs a best checkpoint: set callbacks.checkpoint.save_top_k >= 1 "
                          "(and callbacks.checkpoint.monitor to the validation metric that picks it)")
    metric = cfg.get("optimized_metric")  # a search trial that never validates has no val/ metric to return
    if isinstance(metric, str) and metric.startswith("val/") and not cfg.trainer.get("fast_dev_run") \
            and cfg.trainer.val_check_interval > cfg.trainer.max_steps:
        raise ConfigError(f"optimized_metric={metric} needs a validation, but trainer.val_check_interval="
                          f"{cfg.trainer.val_check_interval} > trainer.max_steps={cfg.trainer.max_steps} runs none; "
                          "set trainer.val_check_interval to at most trainer.max_steps")


def _check_ranges(view: DictConfig) -> None:
    for dotted, valid in CHOICES.items():
        value = _get(view, dotted)
        if isinstance(value, DictConfig) and dotted in TARGET_ALLOWED:
            if not isinstance(value.get("_target_"), str):
                raise ConfigError(f"{dotted} must be one of {', '.join(valid)} or a mapping with a _target_")
            continue
        if value is not None and str(value) not in valid:
            raise ConfigError(f"{dotted}={value!r} is not valid; valid: {', '.join(valid)}")
    for dotted in POSITIVE:
        value = _get(view, dotted)
        if value is not None and value <= 0:
            raise ConfigError(f"{dotted}={value} must be positive")
    for dotted in NON_NEGATIVE:
        value = _get(view, dotted)
        if value is not None and value < 0:
            raise ConfigError(f"{dotted}={value} must not be negative")
    t, o, m = view.trainer, view.optim, view.model
    if t.max_steps <= 0 and not t.fast_dev_run:
        raise ConfigError(f"trainer.max_steps={t.max_steps} must be positive")
    # Lightning reads a float as a fraction of the batches and an int as a count; 0 training (or test)
    # batches would end a run "completed" with nothing trained (or nothing scored).
    for key, smallest in (("limit_train_batches", "positive"), ("limit_test_batches", "positive"),
                          ("limit_val_batches", "non-negative"), ("overfit_batches", "non-negative")):
        value = t[key]
        if value < 0 or (value == 0 and smallest == "positive"):
            raise ConfigError(f"trainer.{key}={value} must be {smallest}: a fraction in (0, 1] of the batches or "
                              f"a whole number of batches")
        if isinstance(value, float) and value > 1 and not value.is_integer():
            raise ConfigError(f"trainer.{key}={value}: a fraction must be at most 1.0; give a whole number to "
                              f"count batches")
    if t.num_sanity_val_steps < -1:
        raise ConfigError(f"trainer.num_sanity_val_steps={t.num_sanity_val_steps} must be -1 (all) or more")
    if m.max_len is not None and (isinstance(m.max_len, bool) or not isinstance(m.max_len, int) or m.max_len <= 0):
        raise ConfigError(f"model.max_len={m.max_len!r} must be a positive integer or null (taken from the task)")
    if m.d_model % m.num_heads:
        divisors = [h for h in range(1, 65) if m.d_model % h == 0]
        raise ConfigError(
            f"model.d_model={m.d_model} is not divisible by model.num_heads={m.num_heads}; "
            f"valid head counts: {', '.join(map(str, divisors))}"
        )
    for key in ("dropout", "attention_dropout", "activation_dropout"):
        if not 0.0 <= m[key] < 1.0:
            raise ConfigError(f"model.{key}={m[key]} must be in [0, 1)")
    if not 0.0 <= o.label_smoothing < 1.0:
        raise ConfigError(f"optim.label_smoothing={o.label_smoothing} must be in [0, 1)")
    if len(o.betas) != 2 or not all(0.0 <= b < 1.0 for b in o.betas):
        raise ConfigError(f"optim.betas={list(o.betas)} must be two numbers in [0, 1) (Adam's beta1, beta2)")
    if o.eps <= 0:
        raise ConfigError(f"optim.eps={o.eps} must be positive")
    if not 0.0 <= o.min_lr_ratio <= 1.0:
        raise ConfigError(f"optim.min_lr_ratio={o.min_lr_ratio} must be in [0, 1]")
    dec = view.task.get("decoding")
    if dec is not None:
        if dec.get("beam_size") is not None and dec.beam_size < 1:
            raise ConfigError(f"task.decoding.beam_size={dec.beam_size} must be at least 1")
        for key in ("length_penalty_alpha", "max_len_a", "max_len_b"):
            if dec.get(key) is not None and dec[key] < 0:
                raise ConfigError(f"task.decoding.{key}={dec[key]} must not be negative")
    ckpt = view.callbacks.get("checkpoint")
    top_k = ckpt.get("save_top_k") if isinstance(ckpt, DictConfig) else None
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1):
        raise ConfigError(f"callbacks.checkpoint.save_top_k={top_k!r} must be -1 (all), 0 or a positive integer")


def _tokenizer_too_small(task: DictConfig) -> str | None:
    """A ``tokenizer.vocab_size`` with no room beyond the special tokens (0 means: no limit)."""
    from attnlab.tasks.vocab import SPECIALS

    tokenizer = task.get("tokenizer")
    size = tokenizer.get("vocab_size") if isinstance(tokenizer, DictConfig) else None
    if isinstance(size, int) and not isinstance(size, bool) and 0 < size <= len(SPECIALS):
        return (f"task.tokenizer.vocab_size={size} leaves no room for a token beyond the {len(SPECIALS)} special "
                "ones (0: no limit)")
    return None


def _check_task_sizes(task: DictConfig) -> None:
    """An empty split is refused up front: a run with nothing to train on (or score) must not end completed."""
    for key, value in task.items():
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        sizes_a_split = key in SPLIT_SIZES or (key.startswith("max_") and key.endswith(("_pairs", "_tokens",
                                                                                         "_examples")))
        if sizes_a_split and value < 1:
            raise ConfigError(f"task.{key}={value} leaves a split empty; it must be at least 1"
                              + (" (or null for all)" if key.startswith("max_") else ""))
        if key.endswith("_fraction") and not 0.0 < value < 1.0:
            raise ConfigError(f"task.{key}={value} must be in (0, 1): 0 or 1 leaves a split empty")
    fractions = task.get("split_fractions")
    if isinstance(fractions, DictConfig) and fractions:
        values = dict(fractions)
        bad = {k: v for k, v in values.items()
               if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 < v < 1.0}
        if bad or sum(values.values()) > 1.0 + 1e-9:
            raise ConfigError(f"task.split_fractions={values}: each fraction must be in (0, 1) and they must sum "
                              f"to at most 1")


def check_root_keys(view: DictConfig) -> None:
    """``seed`` and the reliability keys of the root config (one line, before any work)."""
    seed = view.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"seed={seed!r} must be an integer in [0, {SEED_MAX}]")
    resume = view.get("resume", "auto")
    if resume not in RESUME_MODES:
        raise ConfigError(f"resume={resume!r} is not valid; valid: {', '.join(RESUME_MODES)}")
    if view.get("ckpt_path") and view.get("init_from"):
        raise ConfigError("ckpt_path and init_from are exclusive: ckpt_path resumes a run (weights, optimizer, "
                          "counters), init_from starts a new one from weights only")
    if view.get("ckpt_path") and resume == "never":
        raise ConfigError("ckpt_path resumes from a checkpoint, which resume=never forbids; drop one of them")
    for key in ("ckpt_path", "init_from"):
        value = view.get(key)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{key}={value!r} must be a file path")
        if value and not Path(value).is_file():
            raise ConfigError(f"{key}={value}: no such file")
    policy = view.get("nan_policy", "stop")
    if policy not in NAN_POLICIES:
        raise ConfigError(f"nan_policy={policy!r} is not valid; valid: {', '.join(NAN_POLICIES)}")
    skipped = view.get("max_skipped_batches", 0)
    if not isinstance(skipped, int) or isinstance(skipped, bool) or skipped < 0:
        raise ConfigError(f"max_skipped_batches={skipped!r} must be a non-negative integer")
    every = OmegaConf.select(view, "callbacks.checkpoint.every_n_steps")
    if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every <= 0):
        raise ConfigError(f"callbacks.checkpoint.every_n_steps={every!r} must be a positive integer or null")


# Keys a resumed run may change without becoming another experiment: how long it trains, how it is validated
# and logged, on what hardware (accumulation keeps the global batch), how it handles faults and which weights it
# tests. Everything else a config hash covers must stay as the run was started.
RESUMABLE_CHANGES = ("trainer.max_steps", "trainer.val_check_interval", "trainer.limit_val_batches",
                     "trainer.limit_test_batches", "trainer.enable_progress_bar", "trainer.num_sanity_val_steps",
                     "hardware", "callbacks", "logger", "nan_policy", "max_skipped_batches", "test_weights", "resume",
                     "ckpt_path", "debug_mode", "plugins")


def resume_config_changes(before: dict[str, Any], after: dict[str, Any]) -> tuple[list, list]:
    """([(key, old, new)] that forbid resuming, [(key, old, new)] that are allowed), over the keys a config
    hash covers (``results.record``'s exclusions left out), as dotted paths."""
    from attnlab.results.record import DEFAULT_HASH_EXCLUDE, is_excluded

    def flat(node: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                flat(value, f"{prefix}{key}.", out)
        else:
            out[prefix[:-1]] = node
        return out

    old, new = flat(before, "", {}), flat(after, "", {})
    forbidden, allowed = [], []
    for key in sorted(old.keys() | new.keys()):
        if is_excluded(key, DEFAULT_HASH_EXCLUDE) or old.get(key) == new.get(key):
            continue
        change = (key, old.get(key), new.get(key))
        safe = any(key == k or key.startswith(k + ".") for k in RESUMABLE_CHANGES)
        (allowed if safe else forbidden).append(change)
    return forbidden, allowed


def _check_loggers(view: DictConfig) -> None:
    for name, (packages, install) in LOGGER_PACKAGES.items():
        if view.logger.get(name) is None:
            continue
        if not any(importlib.util.find_spec(p) is not None for p in packages):
            raise ConfigError(f"logger {name} needs the {packages[0]} package, which is not installed: "
                              f"pip install '{install}' (or choose logger=csv)")


def _check_attention_builds(view: DictConfig) -> None:
    """Build one attention layer per role the task's model uses, on the meta device (no memory, no data), so
    an option the variant refuses (an even BigBird window in an encoder, impl=flex where FlexAttention has no
    kernel, a synthesizer as cross-attention) is refused before the run folder exists. Errors that depend on
    the data's length are left to the real build (the task's max_len is not known yet)."""
    import torch

    from attnlab.attention import AttentionError
    from attnlab.models.blocks import LayerSpec
    from attnlab.tasks.schemas import task_schema

    layout = task_schema(view.task.get("loader")).model_layout  # the loader is checked before this
    roles: list[tuple[bool, bool]] = LAYOUT_ROLES.get(layout, [])   # (causal, cross)
    if not roles:
        return
    m = view.model
    attention = OmegaConf.to_container(m.attention)
    cross = m.cross_attention if isinstance(m.cross_attention, str) else OmegaConf.to_container(m.cross_attention)
    # Two tokens: the shortest length every variant accepts, so no length-dependent check fires here.
    spec = LayerSpec(d_model=m.d_model, num_heads=m.num_heads, d_ff=m.d_ff, max_len=m.max_len or 2,
                     self_attention=attention, cross_attention=cross)
    accelerator = view.hardware.accelerator
    if accelerator == "auto":
        accelerator = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device("cuda" if accelerator == "gpu" else accelerator)
    try:
        with torch.device("meta"):
            modules = [spec.attention(causal=causal, cross=is_cross) for causal, is_cross in roles]
        for module in modules:
            module.check_device(device)
    except AttentionError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    except Exception:  # noqa: BLE001 - a check the meta device cannot run (a value read) is left to the real build
        return
