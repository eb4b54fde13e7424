"""The NaN/Inf loss guard (``nan_policy``): skip, stop or fail on a non-finite loss; the run folder's faults are
storage.py's."""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning as L
import torch

from attnlab.errors import RunFault
from attnlab.training.config import NAN_POLICIES

log = logging.getLogger("attnlab")


class NonFiniteLoss(RunFault, RuntimeError):
    """The loss became NaN or Inf; the message is one line with the step and the loss terms."""


class NonFiniteGuard(L.Callback):
    """Keeps a NaN/Inf loss out of the weights, in one of two ways (``check``, from ``hardware.nan_check``):

    - ``every_step``: ``TaskModule.training_step`` asks ``check`` before the backward pass, which reads the
      loss on the host (a wait for the accelerator at every step). ``skip`` drops the batch (no backward, no
      update).
    - ``deferred``: the check stays on the device: a non-finite loss sets the fused optimizer's ``found_inf``
      flag (the flag a GradScaler sets), and the update is skipped inside the optimizer kernel, Adam's moments
      and step count untouched; the host reads the counts every ``trainer.log_every_n_steps``, before each
      checkpoint is written and at the end of training.

    The two differ under gradient accumulation, and only after a non-finite loss: ``every_step`` drops the
    non-finite micro-batch and the update goes on with the others; ``deferred`` cannot take back gradients
    already summed, so it drops the whole update that holds one. ``skipped`` counts the non-finite
    micro-batches in both (the warning says when an update was dropped whole).

    Either way, ``stop`` raises ``NonFiniteLoss`` (deferred: at the next read, naming the step where it first
    happened; the updates in between were finite ones) and no checkpoint holds an update from a non-finite
    loss; ``skip`` stops only once more than ``max_skipped`` batches were dropped. The count is part of the
    checkpoint. All ranks decide together, or the gradient all-reduce would hang.
    """

    def __init__(self, policy: str = "stop", max_skipped: int = 0, check: str = "every_step") -> None:
        if policy not in NAN_POLICIES:
            raise ValueError(f"nan_policy={policy!r}; valid: {', '.join(NAN_POLICIES)}")
        if check not in ("every_step", "deferred"):
            raise ValueError(f"check={check!r}; valid: every_step, deferred")
        self.policy, self.max_skipped, self.deferred = policy, max_skipped, check == "deferred"
        self.skipped = 0
        self._device_state: dict[str, torch.Tensor] | None = None  # deferred: counts kept on the device
        self._update_bad: torch.Tensor | None = None  # deferred: this update's micro-batches, any non-finite
        self._term_names: list[str] = []  # deferred: the loss terms' names, in ``first_terms`` order
        self._module: L.LightningModule | None = None  # deferred: the module checked last, for ``state_dict``

    def state_dict(self) -> dict[str, Any]:
        # Deferred: act on the unread counts before a checkpoint is written (stop, or over max_skipped: raise,
        # so no checkpoint is written); folding them into ``skipped`` unread let a resumed run forget them.
        if self.deferred and self._module is not None:
            self.read(self._module, may_log=False)  # every rank saves at the same step: all raise together
        return {"skipped": self.skipped}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = int(state_dict.get("skipped", 0))

    def check(self, module: L.LightningModule, total: torch.Tensor, terms: dict[str, Any]) -> bool:
        """True when the backward pass is to run; False when this batch is to be skipped (every_step only)."""
        if self.deferred:
            self._note_on_device(module, total, terms)
            return True
        bad = not bool(torch.isfinite(total.detach()).all())
        trainer = module.trainer
        if trainer.world_size > 1:  # all ranks skip or stop together, or the gradient all-reduce hangs
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
        if not bad:
            return True
        return self._handle(module, 1, trainer.global_step, ", ".join(f"{k}={_scalar(v)}" for k, v in terms.items()))

    # -- deferred: on the device ---------------------------------------------------------------------
    def _note_on_device(self, module: L.LightningModule, total: torch.Tensor, terms: dict[str, Any]) -> None:
        self._module = module
        bad = (~torch.isfinite(total.detach()).all()).float()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        values = torch.stack([v.detach().float().mean() if isinstance(v, torch.Tensor)
                              else torch.tensor(float(v), device=bad.device) for v in terms.values()])
        state = self._device_state
        if state is None:
            state = self._device_state = {"count": torch.zeros((), device=bad.device),
                                          "first_step": torch.full((), -1.0, device=bad.device),
                                          "first_terms": torch.zeros_like(values)}
            self._term_names = list(terms)
        first = bad.bool() & state["first_step"].lt(0)
        # A Python number as the filled value is a kernel argument: no copy to the device, no wait.
        state["first_step"].masked_fill_(first, float(module.trainer.global_step))
        state["first_terms"] = torch.where(first, values, state["first_terms"])
        state["count"] += bad
        self._update_bad = bad if self._update_bad is None else torch.maximum(self._update_bad, bad)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self.deferred:
            bad, self._update_bad = self._update_bad, None
            # Read by the fused Adam/AdamW kernel: a nonzero flag leaves weights, moments and step count as they are.
            optimizer.found_inf = bad if bad is not None else None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.deferred and trainer.global_step % max(int(trainer.log_every_n_steps), 1) == 0:
            self.read(pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.deferred:
            self.read(pl_module, may_log=False)  # Lightning refuses self.log() in on_train_end

    def _pending(self) -> tuple[int, int, str]:
        """(non-finite batches not yet read, the step of the first of them, its loss terms)."""
        state = self._device_state
        if state is None:
            return 0, -1, ""
        count = int(state["count"].item())
        if count == 0:
            return 0, -1, ""
        terms = ", ".join(f"{name}={_scalar(v)}" for name, v in zip(self._term_names, state["first_terms"]))
        return count, int(state["first_step"].item()), terms

    def read(self, module: L.LightningModule, *, may_log: bool = True) -> None:
        """Deferred mode: act on the non-finite batches seen since the last read (host wait: log steps only)."""
        count, step, terms = self._pending()
        if count:
            self._device_state = None
            self._handle(module, count, step, terms, may_log=may_log)

    # -- both ----------------------------------------------------------------------------------------
    def _handle(self, module: L.LightningModule, count: int, step: int, described: str, *,
                may_log: bool = True) -> bool:
        """Log the skip(s) and return False, or raise ``NonFiniteLoss``."""
        trainer = module.trainer
        if self.deferred:
            where = f"step {step}" + (f" and {count - 1} more batches before step {trainer.global_step}"
                                      if count > 1 else "")
        else:
            batch = trainer.fit_loop.epoch_loop.batch_idx + 1
            where = f"step {step} (epoch {trainer.current_epoch}, batch {batch})"
        if self.policy == "skip" and self.skipped + count <= self.max_skipped:
            self.skipped += count
            if may_log:
                module.log("train/skipped_batches", float(self.skipped), on_step=True, on_epoch=False)
            accumulating = int(getattr(trainer, "accumulate_grad_batches", 1)) > 1
            whole = ("; the updates holding them were dropped whole (nan_check=deferred under gradient "
                     "accumulation)") if self.deferred and accumulating else ""
            log.warning("non-finite loss at %s (%s): %s skipped (%d of at most %d)%s", where, described,
                        "batch" if count == 1 else "batches", self.skipped, self.max_skipped, whole)
            return False
        limit = f"; {self.skipped} batches already skipped (max_skipped_batches={self.max_skipped})" \
            if self.policy == "skip" else ""
        kept = ("no checkpoint holds an update from it" if self.deferred
                else "the last checkpoint on disk is the last good state")
        raise NonFiniteLoss(f"non-finite loss at {where}: {described}{limit}; {kept} "
                            f"(try a lower optim.lr, optim.grad_clip, or nan_policy=skip)")


def _scalar(value: Any) -> str:
    try:
        v = float(value.detach().float().mean()) if isinstance(value, torch.Tensor) else float(value)
    except (TypeError, ValueError):
        return str(value)
    return str(v) if not math.isfinite(v) else f"{v:.4g}"


# -- the run folder -------------------------------------------------------------------------------------
