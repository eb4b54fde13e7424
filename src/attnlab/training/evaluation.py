"""Evaluating a trained run: its folder or one checkpoint tested on the task's evaluation splits with the run's own
config (``.hydra/config.yaml`` and the overrides it was started with, plus ``key=value`` overrides), ``eval.json``
and the decoded outputs written beside the checkpoint. ``attnlab-eval`` (``cli/evaluate.py``) parses and reports.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from attnlab.errors import UserError
from attnlab.results.record import CHECKPOINTS_DIR, OVERRIDES_FILE, RESOLVED_CONFIG
from attnlab.training.compose import one_line

WHICH = ("last", "best")


class EvalError(UserError, ValueError):
    """A run folder or checkpoint that cannot be evaluated; the message is one line."""


def locate(path: Path, which: str) -> tuple[Path, Path]:
    """(run folder, checkpoint) from a run folder or a checkpoint file."""
    from attnlab.training.checkpointing import LAST, load_checkpoint_file

    if path.is_file():
        load_checkpoint_file(path)  # a damaged or unsafe file is the first thing to report
        run_dir = path.parent.parent if path.parent.name == CHECKPOINTS_DIR else path.parent
        return run_dir, path
    if not path.is_dir():
        raise EvalError(f"{path} is neither a run folder nor a checkpoint file")
    last = path / CHECKPOINTS_DIR / LAST
    if not last.is_file():
        raise EvalError(f"{path} has no checkpoints/{LAST} (was the run started with callbacks=none or debug=fdr?)")
    if which == "last":
        return path, last
    state = load_checkpoint_file(last).get("callbacks", {})
    best = next((v.get("best_model_path") for k, v in state.items() if k.startswith("ModelCheckpoint")), None)
    if not best:
        raise EvalError(f"{path} records no best checkpoint (save_top_k=0?); use which=last")
    best = Path(best)
    if not best.is_file():  # the folder may have moved since: look for the file in this folder
        best = path / CHECKPOINTS_DIR / best.name
    if not best.is_file():
        raise EvalError(f"the best checkpoint {best.name} is missing from {path / 'checkpoints'}")
    return path, best


def load_run_config(run_dir: Path, overrides: list[str]):
    """The run's composed config with its scale applied, as ``run`` saw it, plus ``overrides``."""
    from omegaconf import OmegaConf, open_dict

    from attnlab.training.config import validate
    from attnlab.training.scale import apply_scale

    cfg_file, ovr_file = run_dir / RESOLVED_CONFIG, run_dir / OVERRIDES_FILE
    if not cfg_file.is_file():
        raise EvalError(f"{run_dir} has no .hydra/config.yaml; is it an attnlab run folder?")
    try:
        cfg = OmegaConf.load(cfg_file)
        started_with = [str(o) for o in (OmegaConf.load(ovr_file) if ovr_file.is_file() else [])]
    except Exception as exc:  # noqa: BLE001 - any parse failure of the saved config is one user-facing line
        raise EvalError(f"cannot read {cfg_file}: {one_line(exc)}") from None
    OmegaConf.set_struct(cfg, True)
    with open_dict(cfg):
        cfg.paths.run_dir = str(run_dir)  # was ${hydra:runtime.output_dir}, which only Hydra resolves
        cfg.paths.run_id = run_dir.name
        for item in overrides:
            key, value = item.split("=", 1)
            current = OmegaConf.select(cfg, key.lstrip("+"), default="__missing__")
            if current == "__missing__" and not key.startswith("+"):
                raise EvalError(f"unknown key '{key}' (misspelled?)")
            if OmegaConf.is_config(current):
                raise EvalError(f"{item}: attnlab-eval overrides single keys of the run's saved config (e.g. "
                                f"{key}.<key>=value), not a whole config group; the weights were trained for the "
                                f"run's {key}")
            OmegaConf.update(cfg, key.lstrip("+"), _parse_value(value), merge=True, force_add=True)
    apply_scale(cfg, [*started_with, *overrides])
    validate(cfg)
    return cfg


def _parse_value(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def evaluate(path: Path, which: str = "last", overrides: list[str] | None = None) -> dict[str, Any]:
    """Test a checkpoint on every evaluation split of its task; write and return ``eval.json``.

    A stop signal (SIGTERM, SIGUSR1, SIGUSR2) while testing raises ``StoppedBySignal`` and writes nothing; one
    while the files are written waits until they are whole. A folder that cannot take ``eval.json`` is refused
    before the test (``StorageError``), and a disk that fills while writing is a ``StorageError`` too."""
    import lightning as L
    import torch

    from attnlab.results.record import atomic_write_text
    from attnlab.training.checkpointing import LAST, checkpoint_step, load_checkpoint_file
    from attnlab.training.outputs import write_decoded_outputs
    from attnlab.training.stop_signals import RunSignals, signals_deferred
    from attnlab.training.storage import StorageError, storage_failure

    run_dir, ckpt_path = locate(path, which)
    out = ckpt_path.with_name("eval.json" if ckpt_path.name == LAST else f"{ckpt_path.stem}.eval.json")
    outputs = ckpt_path.with_name("eval_outputs" if ckpt_path.name == LAST else f"{ckpt_path.stem}.eval_outputs")
    if not os.access(out.parent, os.W_OK | os.X_OK):  # said before minutes of decoding, not after them
        raise StorageError(f"cannot write {out.name} beside the checkpoint: {out.parent} is not writable; copy the "
                           "run folder somewhere writable and evaluate that")
    step = checkpoint_step(load_checkpoint_file(ckpt_path))
    with RunSignals() as signals, signals.raising("while evaluating", step=step):
        cfg, task, module, metrics = _test(run_dir, ckpt_path, overrides)
    result = {
        "checkpoint": str(ckpt_path.resolve()),
        "step": step,
        "task": cfg.task.name,
        "splits": dict(task.eval_splits),
        "metrics": {k: v for k, v in metrics.items() if not k.startswith(("val/", "model/"))},
        "metric_flavours": dict(task.metric_flavours),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": {"torch": torch.__version__, "lightning": L.__version__},
    }
    try:
        with signals_deferred():
            if write_decoded_outputs(outputs, module.test_outputs, task):
                result["outputs"] = str(outputs.resolve())
            atomic_write_text(out, json.dumps(result, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        failure = storage_failure(exc, out.parent)
        if failure is None:
            raise
        raise failure from None
    result["written"] = str(out)
    return result


def _test(run_dir: Path, ckpt_path: Path, overrides: list[str] | None):
    """(config, task data, module, metrics) of testing the checkpoint's weights with the run's config."""
    import lightning as L

    from attnlab.training.build import build_datamodule, build_module, build_task_data
    from attnlab.training.checkpointing import init_weights_from
    from attnlab.training.record_writers import collect_metrics

    cfg = load_run_config(run_dir, list(overrides or []))
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    task = build_task_data(cfg)
    module = build_module(cfg, task)
    init_weights_from(module, ckpt_path, role="checkpoint ")
    datamodule = build_datamodule(cfg, task)
    trainer = L.Trainer(accelerator=cfg.hardware.accelerator, devices=1, precision=cfg.hardware.precision,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_test_batches=cfg.trainer.limit_test_batches,
                        default_root_dir=str(run_dir))
    trainer.test(module, datamodule=datamodule, verbose=False)
    return cfg, task, module, collect_metrics(trainer)
