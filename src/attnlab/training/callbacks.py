"""Callbacks: throughput, best-metric tracking, the metrics lines of ``train.log`` and UT ponder statistics, and
``build_callbacks``, the callbacks a run's trainer gets (these, the checkpoint, NaN-guard, MFU, plateau and
attention-capture ones of their own modules, and the ones a config file adds by ``_target_``)."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from attnlab.models.recurrence import emits_ponder_steps
from attnlab.results.record import CHECKPOINTS_DIR, PONDER_DIR
from attnlab.training.acceleration import nan_check
from attnlab.training.attention_capture import AttentionWeightsHistogram
from attnlab.training.checkpointing import LastCheckpoint, RandomState
from attnlab.training.config_targets import instantiate_own
from attnlab.training.data import first_validation_rows
from attnlab.training.nonfinite_guard import NonFiniteGuard
from attnlab.training.perf import MFUCallback
from attnlab.training.plateau import PlateauDecay, PlateauOptions

LOWER_IS_BETTER = ("loss", "ppl", "nll", "ponder", "error")


def lower_is_better(metric: str) -> bool:
    return any(tag in metric.rsplit("/", 1)[-1] for tag in LOWER_IS_BETTER)


class Throughput(L.Callback):
    """Training throughput from per-batch wall time (data loading and evaluation excluded).

    Keeps the run's totals for the run record (``average_tokens_per_s``: target tokens of all ranks per
    second) and, with ``log=True``, logs ``perf/tokens_per_s`` and ``perf/step_s`` over every
    ``log_every_n_steps`` optimizer steps (with ``callbacks.mfu`` on, ``MFUCallback`` logs tokens/s).

    Under DDP the logged windows count this rank's tokens times the number of ranks (reading the other
    ranks' counts would make every logged step wait for them); when training ends, the ranks' own counts
    are summed once, so the record's tokens/s is every rank's tokens over this rank's training time (the
    ranks step together). A run stopped by a signal or an error keeps the estimate.

    Steady state (``steady_tokens_per_s``, ``steady_step_s``): the same totals over the steps after the warm-up
    (``warmup_steps``: a tenth of the run, at least 2 and at most 50 steps), which hold the compiles, the
    kernels' self-tests and the FLOP-counting pass (30-90 s cold on a GPU, enough to make a short run's
    whole-run average several times too slow). On CUDA the device is waited for once at the boundary.
    """

    def __init__(self, log: bool = True) -> None:
        self.log = log
        self.warmup: int | None = None
        self._steady_mark: tuple[int, float, int] | None = None  # (own tokens, seconds, steps) after warm-up
        self.total_tokens = 0
        self.own_tokens = 0  # this rank's
        self.train_seconds = 0.0
        self.total_steps = 0
        self._window_tokens, self._window_seconds, self._window_steps = 0, 0.0, 0
        self.first_batch_at: float | None = None  # wall clock of the first training batch (start-up time)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.first_batch_at is None:
            self.first_batch_at = time.time()
            self.warmup = warmup_steps(trainer.max_steps)
        self._t0 = time.perf_counter()
        self._tokens0 = pl_module._tokens_seen
        self._step0 = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # Token counts may be device tensors (``TaskModule.compute_loss``): they are read, and the accelerator
        # waited for, only where a window is logged, so the queued work of the window is counted in it.
        window_steps = self._window_steps + trainer.global_step - self._step0
        logged = self.log and window_steps >= max(trainer.log_every_n_steps, 1)
        warmed_up = self._steady_mark is None and self.total_steps + trainer.global_step - self._step0 >= (
            self.warmup or 0)
        if (logged or warmed_up) and pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        elapsed = time.perf_counter() - self._t0
        own = pl_module._tokens_seen - self._tokens0
        tokens = own * trainer.world_size
        self.own_tokens += own
        self.total_tokens += tokens
        self.train_seconds += elapsed
        self.total_steps += trainer.global_step - self._step0
        self._window_tokens += tokens
        self._window_seconds += elapsed
        self._window_steps = window_steps
        if warmed_up:
            # the count may be a device tensor added to in place: keep a copy, read nothing back here
            tokens = self.own_tokens.clone() if isinstance(self.own_tokens, torch.Tensor) else self.own_tokens
            self._steady_mark = (tokens, self.train_seconds, self.total_steps)
        if not logged:
            return
        pl_module.log("perf/tokens_per_s", float(self._window_tokens) / max(self._window_seconds, 1e-9),
                      on_step=True, on_epoch=False)
        pl_module.log("perf/step_s", self._window_seconds / self._window_steps, on_step=True, on_epoch=False)
        self._window_tokens, self._window_seconds, self._window_steps = 0, 0.0, 0

    def on_train_end(self, trainer, pl_module):
        # Every rank reaches here after the same last step (a collective is safe); a run that stops early
        # does not, and keeps the rank-0-times-ranks estimate.
        if trainer.world_size > 1:
            own = torch.as_tensor(self.own_tokens, dtype=torch.float64, device=pl_module.device)
            self.total_tokens = int(trainer.strategy.reduce(own, reduce_op="sum").item())

    def average_tokens_per_s(self) -> float | None:
        return float(self.total_tokens) / self.train_seconds if self.train_seconds > 0 else None

    def average_step_s(self) -> float | None:
        """Mean wall seconds per optimizer step of this process (training batches only)."""
        return self.train_seconds / self.total_steps if self.total_steps > 0 else None

    def steady_state(self, world_size: int = 1) -> dict[str, float | int | None]:
        """Tokens/s (all ranks) and seconds per step over the steps after the warm-up; None where the run
        ended before any such step."""
        if self._steady_mark is None:
            return {"steady_tokens_per_s": None, "steady_step_s": None, "steady_steps": 0}
        tokens0, seconds0, steps0 = self._steady_mark
        seconds, steps = self.train_seconds - seconds0, self.total_steps - steps0
        if seconds <= 0 or steps <= 0:
            return {"steady_tokens_per_s": None, "steady_step_s": None, "steady_steps": 0}
        return {"steady_tokens_per_s": float(self.own_tokens - tokens0) * world_size / seconds,
                "steady_step_s": seconds / steps, "steady_steps": steps}


def warmup_steps(max_steps: int | None) -> int:
    """Optimizer steps left out of the steady-state figures: a tenth of the run, at least 2, at most 50 (10
    for a run without ``max_steps``)."""
    if not max_steps or max_steps < 0:
        return 10
    return min(max(2, max_steps // 10), 50)


class RunCost(L.Callback):
    """What the run has cost over all its segments: a run stopped and resumed is one run, and its record's
    ``cost.wall_s`` and ``cpu_s`` count every segment up to its last checkpoint, not only the one that finished.
    The earlier segments' totals travel in the checkpoints (this callback's state)."""

    def __init__(self, wall_started: float, cpu_started: float) -> None:
        self.wall_started, self.cpu_started = wall_started, cpu_started
        self.earlier = {"wall_s": 0.0, "cpu_s": 0.0, "segments": 0}

    def totals(self) -> dict[str, float | int]:
        """The run's wall and CPU seconds so far, and the segments they span (this one included)."""
        return {"wall_s": self.earlier["wall_s"] + time.time() - self.wall_started,
                "cpu_s": self.earlier["cpu_s"] + time.process_time() - self.cpu_started,
                "segments": int(self.earlier["segments"]) + 1}

    def state_dict(self):
        return self.totals()

    def load_state_dict(self, state_dict):
        self.earlier = {"wall_s": float(state_dict.get("wall_s", 0.0)), "cpu_s": float(state_dict.get("cpu_s", 0.0)),
                        "segments": int(state_dict.get("segments", 0))}


class MetricsLine(L.Callback):
    """A plain log line of the latest metrics every ``every`` optimizer steps, and one after every
    validation: what a cluster user reads in ``train.log`` (and the console when it is not a terminal,
    where no progress bar is drawn)."""

    SHOWN = ("train/", "val/", "perf/")
    # Constants of the run, in the logger's files but not worth a place on every line.
    HIDDEN = ("perf/peak_flops", "perf/peak_source", "perf/flops_per_token")

    def __init__(self, every: int) -> None:
        self.every = max(int(every), 1)
        self._last_step = -1
        self._started = time.monotonic()
        self._start_step = 0
        self._last_validation: dict = {}  # Lightning clears callback_metrics at an epoch's start; the line keeps it

    def on_train_start(self, trainer, pl_module):
        self._started, self._start_step = time.monotonic(), trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step == self._last_step or step % self.every or not trainer.is_global_zero:
            return  # mid-accumulation, already logged, or not a log step
        self._last_step = step
        shown = {**self._last_validation, **{k: v for k, v in trainer.callback_metrics.items()
                                             if k.startswith(self.SHOWN) and not k.startswith(self.HIDDEN)}}
        if trainer.optimizers:
            shown["lr"] = trainer.optimizers[0].param_groups[0]["lr"]
        elapsed = time.monotonic() - self._started
        done = step - self._start_step
        eta = elapsed / done * (trainer.max_steps - step) if done > 0 and trainer.max_steps > 0 else None
        timing = f"elapsed {_duration(elapsed)}" + (f", eta {_duration(eta)}" if eta is not None else "")
        logging.getLogger("attnlab").info("step %d/%d  %s  (%s)", step, trainer.max_steps, _format(shown), timing)

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        shown = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        self._last_validation = {k: float(v) for k, v in shown.items()}
        logging.getLogger("attnlab").info("validation at step %d  %s", trainer.global_step, _format(shown))


def _line_order(key: str) -> tuple[int, str]:
    """What a reader looks for first: the training loss, the latest validation metrics, the learning rate; then
    the other training metrics and the speed."""
    if key == "train/loss":
        return (0, key)
    for rank, prefix in enumerate(("val/", "lr", "train/", "perf/"), start=1):
        if key.startswith(prefix):
            return (rank, key)
    return (5, key)


def _format(metrics: dict) -> str:
    return "  ".join(f"{k} {float(v):.4g}" for k, v in sorted(metrics.items(), key=lambda kv: _line_order(kv[0]))) \
        or "(nothing logged yet)"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


class BestMetrics(L.Callback):
    """Tracks the best value of every ``val/*`` metric (min for losses/perplexities, max otherwise)."""

    def __init__(self) -> None:
        self.best: dict[str, float] = {}

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        for key, value in trainer.callback_metrics.items():
            if not key.startswith("val/"):
                continue
            v = float(value)
            if math.isnan(v):
                continue
            old = self.best.get(key)
            if old is None or (v < old if lower_is_better(key) else v > old):
                self.best[key] = v

    def state_dict(self):
        return {"best": dict(self.best)}

    def load_state_dict(self, state_dict):
        self.best = dict(state_dict.get("best", {}))


class PonderStats(L.Callback):
    """Logs the per-position ACT step counts of one fixed sample batch at every validation, so a notebook
    can draw the paper's ponder-time heatmaps (``ponder/steps.jsonl`` in the run folder)."""

    def __init__(self, out_dir: str, sample_size: int = 8) -> None:
        self.out_dir, self.sample_size = out_dir, sample_size
        self._sample = None

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        if self._sample is None:
            self._sample = first_validation_rows(trainer.datamodule, self.sample_size)
        batch = {k: v.to(pl_module.device) for k, v in self._sample.items()}
        with torch.no_grad():
            _, aux, _ = pl_module.compute_loss(batch)
        steps = {k: v for k, v in aux.items() if k.endswith("steps") and isinstance(v, torch.Tensor)}
        if not steps:
            return
        path = Path(self.out_dir) / PONDER_DIR / "steps.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps({"step": trainer.global_step,
                                **{k: v.detach().cpu().tolist() for k, v in steps.items()}}) + "\n")


def build_nonfinite_guard(cfg: DictConfig) -> NonFiniteGuard:
    """The NaN/Inf guard of ``nan_policy``: a callback of the trainer that the module also holds (it checks each
    loss before backward)."""
    return NonFiniteGuard(cfg.get("nan_policy", "stop"), int(cfg.get("max_skipped_batches", 0)), check=nan_check(cfg))


def build_callbacks(cfg: DictConfig, run_dir: Path, *, nonfinite_guard: NonFiniteGuard | None = None) -> list:
    """The callbacks of a run's trainer: the ones every run gets (``nonfinite_guard``: the one the module holds,
    built here where none is given), the ones ``cfg.callbacks`` and ``cfg.optim`` switch on, then the ones a
    config file adds by ``_target_``."""
    c = cfg.callbacks
    mfu = bool(c.get("mfu")) and not cfg.get("debug_mode")
    callbacks: list = [Throughput(log=not mfu), BestMetrics(), RandomState(),
                       nonfinite_guard or build_nonfinite_guard(cfg), MetricsLine(cfg.trainer.log_every_n_steps)]
    if c.get("checkpoint"):
        ck = c.checkpoint
        if ck.save_top_k:
            callbacks.append(ModelCheckpoint(
                dirpath=str(run_dir / CHECKPOINTS_DIR), monitor=ck.monitor, mode=ck.mode, save_last=False,
                save_top_k=ck.save_top_k, filename="step{step:07d}", auto_insert_metric_name=False,
            ))
        # After ModelCheckpoint in the list (Lightning keeps that order), so last.ckpt records the newest best.
        if ck.save_last:
            callbacks.append(LastCheckpoint(run_dir / CHECKPOINTS_DIR, every_n_steps=ck.get("every_n_steps"),
                                            handle_signals=ck.get("on_signal", True)))
    has_logger = any(v is not None for v in cfg.logger.values())
    if c.get("lr_monitor") and has_logger:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    if mfu:  # perf/mfu against the datasheet peak, or the matmul peak measured at fit start on CPU
        callbacks.append(MFUCallback(log_every=cfg.trainer.log_every_n_steps))
    if c.get("ponder_stats") and emits_ponder_steps(cfg.model.recurrence.name):
        callbacks.append(PonderStats(str(run_dir), sample_size=c.ponder_stats.sample_size))
    if cfg.optim.get("plateau") is not None:
        options = PlateauOptions(**OmegaConf.to_container(cfg.optim.plateau, resolve=True))
        callbacks.append(PlateauDecay(options, warmup_steps=cfg.optim.warmup_steps))
    if c.get("record_attention"):
        callbacks.append(AttentionWeightsHistogram(str(run_dir), sample_size=c.get("record_attention_sample_size", 8)))
    return callbacks + instantiate_own(c, "callbacks")
