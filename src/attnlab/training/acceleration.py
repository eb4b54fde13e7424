"""How a run uses its accelerator beyond device and precision: the ``hardware`` speed options.

Each option is ``auto``, ``true`` or ``false``; ``auto`` turns on what pays on a GPU and leaves a CPU run as
it is. None of them changes what is computed beyond floating-point summation order (the config hash leaves
them out, as it does ``num_workers`` and ``torch_threads``; ``results.record.DEFAULT_HASH_EXCLUDE``), with one
exception after a non-finite loss under gradient accumulation (``nan_check`` below):

- ``pin_memory``: batches in page-locked host memory, so the copy to the GPU runs beside the step.
- ``fused_optimizer``: Adam/AdamW's fused kernel (one launch for every parameter instead of a few per tensor),
  which can also skip an update on the device (``nan_check``).
- ``nan_check``: ``every_step`` reads the loss on the host before each backward pass (a wait for the
  accelerator per step); ``deferred`` keeps the check on the device (a non-finite update is skipped there by
  the fused optimizer) and reads it every ``trainer.log_every_n_steps`` (``training.nonfinite_guard``; with
  accumulation it drops the whole update holding a non-finite micro-batch, ``every_step`` only that
  micro-batch); ``auto`` is
  ``deferred`` where the optimizer can skip on the device and the device is a GPU.
- ``activation_checkpointing``: each Transformer layer's activations are recomputed in the backward pass
  instead of kept (memory for about a third more compute), for long sequences; gradients are unchanged.
- ``compile``: ``torch.compile`` of the network for the training steps (``TaskModule.network``; evaluation
  stays eager; checkpoints keep the plain names). Off under ``auto``: the first steps pay the compilation
  (tens of seconds), which a short laptop protocol does not win back; docs/gpu.md says when it pays.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from attnlab.errors import ConfigError

SWITCHES = ("auto", True, False)
NAN_CHECKS = ("auto", "every_step", "deferred")
OPTIONS = ("pin_memory", "fused_optimizer", "activation_checkpointing", "compile")
# An older saved config without these keys gets what ``config.HardwareSchema`` gives a new one (off), not auto.
OFF_WHEN_ABSENT = {"activation_checkpointing": False, "compile": False}


def runs_on_gpu(cfg: DictConfig) -> bool:
    import torch  # here, so that checking a config does not import torch

    accelerator = str(cfg.hardware.accelerator)
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def _switch_value(cfg: DictConfig, name: str) -> Any:
    """``hardware.<name>`` as written (its default where an older config lacks it), refused when not a switch."""
    value = cfg.hardware.get(name, OFF_WHEN_ABSENT.get(name, "auto"))
    if value not in SWITCHES:
        raise ConfigError(f"hardware.{name}={value!r} is not valid; use auto, true or false")
    return value


def switch(cfg: DictConfig, name: str) -> bool:
    """``hardware.<name>`` resolved: ``auto`` is on exactly on a GPU, except ``compile`` (off unless asked)."""
    value = _switch_value(cfg, name)
    if value == "auto":
        return name != "compile" and runs_on_gpu(cfg)
    return bool(value)


def check_speed_options(cfg: DictConfig) -> None:
    """Every speed option valid and the nan check possible, before anything is built (one line)."""
    for name in OPTIONS:
        _switch_value(cfg, name)
    asked = cfg.hardware.get("nan_check", "auto")
    if asked not in NAN_CHECKS:
        raise ConfigError(f"hardware.nan_check={asked!r} is not valid; valid: {', '.join(NAN_CHECKS)}")
    if asked == "deferred":
        nan_check(cfg)


def nan_check(cfg: DictConfig) -> str:
    """``every_step`` or ``deferred`` (module doc); ``deferred`` needs the fused built-in optimizer, and a
    GradScaler (fp16) sets the optimizer's skip flag itself, so those runs check every step."""
    asked = cfg.hardware.get("nan_check", "auto")
    can_defer = (cfg.optim.optimizer in ("adam", "adamw") and switch(cfg, "fused_optimizer")
                 and not str(cfg.hardware.precision).startswith("16"))
    if asked == "deferred" and not can_defer:
        raise ConfigError("hardware.nan_check=deferred needs optim.optimizer adam or adamw with "
                          "hardware.fused_optimizer=true and no fp16 precision; use nan_check=every_step")
    if asked == "auto":
        return "deferred" if can_defer and runs_on_gpu(cfg) else "every_step"
    return asked


def apply_to_module(cfg: DictConfig, module: Any) -> None:
    """Wrap or compile the module's network as the options say (its optimizer choice is a constructor keyword,
    ``build_module``)."""
    if switch(cfg, "activation_checkpointing"):
        from attnlab.models.recompute import recompute_layer_activations

        recompute_layer_activations(module.model)
    if switch(cfg, "compile"):
        module.compile_network()
