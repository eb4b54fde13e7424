"""Typed schema of the composed config, checked once after Hydra composes it.

Hydra's struct mode already refuses keys that no config defines; this adds types and value checks per
section, using the option dataclasses that attention variants, recurrences and task loaders register.
Every failure is a ``ConfigError`` whose message is one line naming the key and what is valid.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A bad configuration; the message is one line."""


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
class DecodingSchema:
    strategy: str
    beam_size: int
    length_penalty_alpha: float
    max_len_a: float
    max_len_b: int
    decode_in_validation: bool
    length_penalty: str = "gnmt"    # gnmt: ((5+L)/6)^alpha (the papers) | fairseq: L^alpha (--lenpen)


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
    record_attention: bool = False  # attention-weight histograms at the end of training (attention_record.py)
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
            "trainer.log_every_n_steps", "trainer.val_check_interval", "optim.lr", "hardware.torch_threads")
NON_NEGATIVE = ("model.encoder_layers", "model.random_position_offset", "model.decoder_layers", "optim.warmup_steps",
                "hardware.num_workers", "optim.weight_decay", "optim.grad_clip", "trainer.num_sanity_val_steps")


def _check(node: Any, schema: type, path: str) -> None:
    """Merge ``node`` into the structured schema: unknown keys and wrong types fail with one line."""
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


# Keys that take your own class instead of a built-in name (README "Add your own").
TARGET_ALLOWED = ("optim.optimizer", "optim.schedule")


def _builtin(node: DictConfig) -> DictConfig:
    """``node`` without the entries that name their own class (``_target_``): those are instantiated as
    written (training/run.py), the rest are checked against the schema."""
    own = [k for k, v in node.items_ex(resolve=False) if isinstance(v, DictConfig) and "_target_" in v]
    if not own:
        return node
    return OmegaConf.create({k: v for k, v in node.items_ex(resolve=False) if k not in own})


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError (one line) for the first problem found in a composed config."""
    from attnlab.attention import available, get_entry
    from attnlab.models.recurrence import available_recurrences, recurrence_options
    from attnlab.plugins import load_plugins
    from attnlab.tasks.schemas import task_schema

    load_plugins(cfg)  # the variants, tasks and classes of the user's own modules (README "Add your own")

    for section in ("model", "task", "hardware", "optim", "trainer", "batch", "logger", "callbacks", "scale"):
        try:
            OmegaConf.to_container(cfg[section], resolve=True)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"cannot resolve {section}: {str(exc).splitlines()[0]}") from None

    _check(cfg.model, ModelSchema, "model")
    _check(cfg.hardware, HardwareSchema, "hardware")
    _check(cfg.optim, OptimSchema, "optim")
    _check(cfg.trainer, TrainerSchema, "trainer")
    _check(cfg.batch, BatchSchema, "batch")
    _check(_builtin(cfg.logger), LoggerSchema, "logger")
    _check(_builtin(cfg.callbacks), CallbacksSchema, "callbacks")
    if cfg.logger.get("wandb") is not None:
        _check(cfg.logger.wandb, WandbSchema, "logger.wandb")
    if "decoding" in cfg.task:
        _check(cfg.task.decoding, DecodingSchema, "task.decoding")

    attention = cfg.model.attention.get("name")
    if attention not in available():
        raise ConfigError(f"model.attention.name={attention!r} is not a variant; valid: {', '.join(available())}")
    _check_options(cfg.model.attention, get_entry(attention).options, "model.attention", f"attention {attention}")
    recurrence = cfg.model.recurrence.get("name")
    if recurrence not in available_recurrences():
        raise ConfigError(
            f"model.recurrence.name={recurrence!r}; valid: {', '.join(available_recurrences())}"
        )
    _check_options(cfg.model.recurrence, recurrence_options(recurrence), "model.recurrence",
                   f"recurrence {recurrence}")

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

    loader = cfg.task.get("loader")
    schema = task_schema(loader)
    _check(cfg.task, schema, "task")

    for dotted, valid in CHOICES.items():
        value = _get(cfg, dotted)
        if isinstance(value, DictConfig) and dotted in TARGET_ALLOWED:
            if not isinstance(value.get("_target_"), str):
                raise ConfigError(f"{dotted} must be one of {', '.join(valid)} or a mapping with a _target_")
            continue
        if value is not None and str(value) not in valid:
            raise ConfigError(f"{dotted}={value!r} is not valid; valid: {', '.join(valid)}")
    for dotted in POSITIVE:
        value = _get(cfg, dotted)
        if value is not None and value <= 0:
            raise ConfigError(f"{dotted}={value} must be positive")
    for dotted in NON_NEGATIVE:
        value = _get(cfg, dotted)
        if value is not None and value < 0:
            raise ConfigError(f"{dotted}={value} must not be negative")
    if cfg.trainer.max_steps <= 0 and not cfg.trainer.fast_dev_run:
        raise ConfigError(f"trainer.max_steps={cfg.trainer.max_steps} must be positive")
    if cfg.model.d_model % cfg.model.num_heads:
        divisors = [h for h in range(1, 65) if cfg.model.d_model % h == 0]
        raise ConfigError(
            f"model.d_model={cfg.model.d_model} is not divisible by model.num_heads={cfg.model.num_heads}; "
            f"valid head counts: {', '.join(map(str, divisors))}"
        )
    for key in ("dropout", "attention_dropout", "activation_dropout"):
        if not 0.0 <= cfg.model[key] < 1.0:
            raise ConfigError(f"model.{key}={cfg.model[key]} must be in [0, 1)")
    if not 0.0 <= cfg.optim.label_smoothing < 1.0:
        raise ConfigError(f"optim.label_smoothing={cfg.optim.label_smoothing} must be in [0, 1)")
