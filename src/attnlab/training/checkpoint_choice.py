"""Which weights a run starts from and tests with: the checkpoint it resumes from (``ckpt_path``, ``resume``) and
the weights the test splits are scored with (``test_weights``). Saving and reading checkpoint files is
``checkpointing.py``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig

from attnlab.errors import ConfigError
from attnlab.results.record import CHECKPOINTS_DIR
from attnlab.training.checkpointing import (
    CheckpointError,
    checkpoint_step,
    find_resume_checkpoint,
    has_checkpoints,
    load_checkpoint_file,
    remove_partial_files,
)
from attnlab.training.launch import is_launch_rank_zero
from attnlab.training.modules import TaskModule

log = logging.getLogger("attnlab")


def select_checkpoint(cfg: DictConfig, run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint this run resumes from: ``ckpt_path`` if given, else (``resume=auto``) the newest
    complete one in the run folder, else None (a fresh start)."""
    ckpt_dir = run_dir / CHECKPOINTS_DIR
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


def load_test_weights(cfg: DictConfig, module: TaskModule, callbacks: list, final_step: int) -> dict[str, Any]:
    """Put the weights the test splits are scored with into ``module`` (``test_weights``) and describe them:
    ``last`` keeps the final weights; ``best`` loads the checkpoint best by ``callbacks.checkpoint.monitor``
    (QKNorm tests its best-dev-BLEU checkpoint). Returns the record's description, ``flavour`` included."""
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

