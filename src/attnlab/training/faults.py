"""Numerical faults (a NaN/Inf loss guard) and the size of a checkpoint; the run folder checks are in storage.py."""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning as L
import torch

from attnlab.training.config import NAN_POLICIES

log = logging.getLogger("attnlab")


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or Inf; the message is one line with the step and the loss terms."""


class NonFiniteGuard(L.Callback):
    """Checked by ``TaskModule.training_step`` before the backward pass, so a bad loss never reaches the weights.

    ``stop`` raises ``NonFiniteLoss`` (the last checkpoint on disk is the last good one); ``skip`` drops the
    batch (no backward, no update) and stops only once more than ``max_skipped`` batches were dropped.
    The count is part of the checkpoint.
    """

    def __init__(self, policy: str = "stop", max_skipped: int = 0) -> None:
        if policy not in NAN_POLICIES:
            raise ValueError(f"nan_policy={policy!r}; valid: {', '.join(NAN_POLICIES)}")
        self.policy, self.max_skipped = policy, max_skipped
        self.skipped = 0

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = int(state_dict.get("skipped", 0))

    def check(self, module: L.LightningModule, total: torch.Tensor, terms: dict[str, Any]) -> bool:
        """True when ``total`` is finite on every rank; False when this batch is to be skipped."""
        bad = not bool(torch.isfinite(total.detach()).all())
        trainer = module.trainer
        if trainer.world_size > 1:  # all ranks skip or stop together, or the gradient all-reduce hangs
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
        if not bad:
            return True
        described = ", ".join(f"{k}={_scalar(v)}" for k, v in terms.items())
        batch = trainer.fit_loop.epoch_loop.batch_idx + 1
        where = f"step {trainer.global_step} (epoch {trainer.current_epoch}, batch {batch})"
        if self.policy == "skip" and self.skipped < self.max_skipped:
            self.skipped += 1
            module.log("train/skipped_batches", float(self.skipped), on_step=True, on_epoch=False)
            log.warning("non-finite loss at %s (%s): batch skipped (%d of at most %d)",
                                                 where, described, self.skipped, self.max_skipped)
            return False
        limit = f"; {self.skipped} batches already skipped (max_skipped_batches={self.max_skipped})" \
            if self.policy == "skip" else ""
        raise NonFiniteLoss(f"non-finite loss at {where}: {described}{limit}; the last checkpoint on disk is "
                            f"the last good state (try a lower optim.lr, optim.grad_clip, or nan_policy=skip)")


def _scalar(value: Any) -> str:
    try:
        v = float(value.detach().float().mean()) if isinstance(value, torch.Tensor) else float(value)
    except (TypeError, ValueError):
        return str(value)
    return str(v) if not math.isfinite(v) else f"{v:.4g}"


# -- the run folder -------------------------------------------------------------------------------------
def checkpoint_bytes(module: torch.nn.Module) -> int:
    """About the size of one checkpoint: weights plus Adam's two moments, plus a margin for the rest."""
    weights = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    params = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    return int(weights + 2 * params + (1 << 20))
