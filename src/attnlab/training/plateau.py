"""Learning-rate decay on a validation plateau, and stopping below a floor (``optim.plateau``).

The official QKNorm / Transformers-without-Tears controller (CyndxAI/QKNorm ``controller.py``
``eval_and_decay``): after every evaluation, once warmup is over, the learning rate is multiplied by
``factor`` (0.8) when the newest dev score is worse than every one of the ``patience`` (3) scores before it;
training stops once warmup is over and the learning rate is below ``stop_lr``. The schedule (warmup, then
flat) stays the LambdaLR of ``optim.schedule``: a decay scales the scheduler's base learning rates, so the
decayed rate is saved and restored with the scheduler's state, and the score history with this callback's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning as L


@dataclass
class PlateauOptions:
    monitor: str = "val/bleu"  # the validation metric whose plateau decays the learning rate
    mode: str = "max"  # max: higher is better (BLEU) | min (a loss)
    factor: float = 0.8  # QKNorm lr_decay
    patience: int = 3  # QKNorm patience: decay when the newest score is worse than each of the last 3
    stop_lr: float | None = None  # stop training once (after warmup) the learning rate is below this

    def __post_init__(self) -> None:
        if self.mode not in ("max", "min"):
            raise ValueError(f"optim.plateau.mode={self.mode!r}; valid: max, min")
        if not 0.0 < self.factor < 1.0:
            raise ValueError(f"optim.plateau.factor={self.factor}; must lie in (0, 1)")
        if self.patience < 1:
            raise ValueError(f"optim.plateau.patience={self.patience}; must be >= 1")


def plateau_reached(history: list[float], patience: int, mode: str) -> bool:
    """True when the newest score is worse than each of the ``patience`` scores before it."""
    if len(history) <= patience:
        return False
    newest, previous = history[-1], history[-1 - patience:-1]
    return newest < min(previous) if mode == "max" else newest > max(previous)


class PlateauDecay(L.Callback):
    """Multiplies the learning rate by ``factor`` on a plateau of ``monitor``; stops below ``stop_lr``."""

    def __init__(self, options: PlateauOptions, *, warmup_steps: int) -> None:
        self.options, self.warmup_steps = options, int(warmup_steps)
        self.history: list[float] = []
        self.decays = 0

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        o = self.options
        value = trainer.callback_metrics.get(o.monitor)
        if value is None:
            raise KeyError(f"optim.plateau.monitor={o.monitor!r} was not logged by validation; logged: "
                           f"{', '.join(sorted(k for k in trainer.callback_metrics if k.startswith('val/')))}")
        self.history.append(float(value))
        if trainer.global_step < self.warmup_steps:
            return  # QKNorm: no decay while warming up
        if plateau_reached(self.history, o.patience, o.mode):
            for config in trainer.lr_scheduler_configs:
                scheduler = config.scheduler
                scheduler.base_lrs = [lr * o.factor for lr in scheduler.base_lrs]
                for group in scheduler.optimizer.param_groups:
                    group["lr"] *= o.factor
            self.decays += 1
        if o.stop_lr is not None and self.current_lr(trainer) < o.stop_lr:
            trainer.should_stop = True

    @staticmethod
    def current_lr(trainer: L.Trainer) -> float:
        return max(group["lr"] for opt in trainer.optimizers for group in opt.param_groups)

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history), "decays": self.decays}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [float(v) for v in state_dict.get("history", [])]
        self.decays = int(state_dict.get("decays", 0))
