"""Checkpoints that survive kills: atomic writes, safe loading, finding where to resume, and the
"last" checkpoint that preemption and periodic saves write.

Resuming (``resume=auto`` or ``ckpt_path=``) restores everything: weights, optimizer, schedule, loop
counters, callback state, the data position and the random number generators. Initialising
(``init_from=``) copies weights only, as fairseq's ``--restore-file`` with ``--reset-optimizer``.
Every load uses ``torch.load(weights_only=True)``: a checkpoint that needs arbitrary unpickling is refused.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import re
import signal
import threading
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from attnlab.errors import UserError

log = logging.getLogger("attnlab")

LAST = "last.ckpt"
TMP_MARK = ".tmp-"  # partial files carry this in their name and are never picked for resuming
SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2")  # SIGUSR2 is submitit's default pre-timeout signal


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be used; the message is one line."""


class Preempted(Exception):
    """Training stopped on a signal after saving a checkpoint; rerunning the same command resumes."""

    def __init__(self, signum: int, step: int, checkpoint: str | None, previous_handler: Any = None) -> None:
        self.signum, self.step, self.checkpoint, self.previous_handler = signum, step, checkpoint, previous_handler
        name = signal.Signals(signum).name
        where = f"checkpoint saved: {checkpoint}" if checkpoint else "no checkpoint (checkpointing is off)"
        super().__init__(f"stopped by {name} at step {step}; {where}; rerun the same command to resume")


# -- writing and reading ------------------------------------------------------------------------------
def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to a temporary file in the same folder, fsync, then rename over ``path``.

    A kill at any moment leaves either the old file or the new one, never a truncated one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}{TMP_MARK}{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def load_checkpoint_file(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """A checkpoint loaded with ``weights_only=True``; CheckpointError (one line) when it cannot be used."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        # torch's safe unpickler names the global (a class, os.system, ...) a file asks for: "Unsupported global:
        # GLOBAL x" (older) or "Trying to load unsupported GLOBAL x" (2.13). That file is unsafe, not damaged;
        # random bytes fail with "Unsupported operand" instead.
        if re.search(r"(?i)unsupported global|GLOBAL [\w.]+|unrecognized function", text):
            raise CheckpointError(
                f"checkpoint {path} is unsafe and was not loaded: it needs arbitrary unpickling"
                f"{_unsupported_global(text)}; only tensors and plain containers are loaded (see "
                f"docs/reliability.md, 'Safe loading')"
            ) from None
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated (not a torch checkpoint)") from None
    except Exception as exc:  # noqa: BLE001 - whatever a damaged file makes torch.load raise, it is unusable
        first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0][:200]
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated ({first})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(obj).__name__}, not a checkpoint dict")
    return obj


def _unsupported_global(text: str) -> str:
    m = re.search(r"GLOBAL ([\w.]+)", text)
    return f" (it contains {m.group(1)})" if m else ""


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO with atomic writes and weights-only loads."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        atomic_torch_save(checkpoint, path)

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        return load_checkpoint_file(path, map_location="cpu" if map_location is None else map_location)


def checkpoint_step(ckpt: dict[str, Any]) -> int:
    return int(ckpt.get("global_step", 0))


def find_resume_checkpoint(ckpt_dir: str | os.PathLike) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete checkpoint in ``ckpt_dir`` (highest step; ``last.ckpt`` on a tie).

    Files that do not load are skipped with a warning, so a damaged file costs progress, not the run.
    """
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return None
    best: tuple[tuple[int, int, float], Path, dict[str, Any]] | None = None
    for path in ckpt_dir.glob("*.ckpt"):
        if TMP_MARK in path.name:
            continue
        try:
            ckpt = load_checkpoint_file(path)
        except CheckpointError as exc:
            log.warning("skipping unusable checkpoint: %s", exc)
            continue
        key = (checkpoint_step(ckpt), int(path.name == LAST), path.stat().st_mtime)
        if best is None or key > best[0]:
            best = (key, path, ckpt)
    return (best[1], best[2]) if best else None


def has_checkpoints(ckpt_dir: str | os.PathLike) -> bool:
    ckpt_dir = Path(ckpt_dir)
    return ckpt_dir.is_dir() and any(TMP_MARK not in p.name for p in ckpt_dir.glob("*.ckpt"))


def remove_partial_files(ckpt_dir: str | os.PathLike) -> None:
    """Temporary files left by a process killed while saving."""
    ckpt_dir = Path(ckpt_dir)
    if ckpt_dir.is_dir():
        for p in ckpt_dir.glob(f"*{TMP_MARK}*"):
            p.unlink(missing_ok=True)


def model_weights(ckpt: dict[str, Any], path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The LightningModule state dict of a Lightning checkpoint, or a plain state dict as given."""
    state = ckpt.get("state_dict", ckpt)
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"checkpoint {path} has no model weights (expected a 'state_dict' of tensors)")
    return state


def init_weights_from(module: torch.nn.Module, path: str | os.PathLike, *, role: str = "init_from=") -> None:
    """Copy weights from a checkpoint into ``module`` (all keys, same shapes); nothing else is restored.

    ``role`` names the file in a refusal as the user gave it (``init_from=<path>``, or ``checkpoint <path>``)."""
    state = model_weights(load_checkpoint_file(path), path)
    check_weights_fit(module, state, f"{role}{path}")
    module.load_state_dict(state, strict=True)


def check_weights_fit(module: torch.nn.Module, state: dict[str, torch.Tensor], named: str) -> None:
    """CheckpointError (one line) unless ``state`` has exactly ``module``'s keys at its shapes: a checkpoint
    of another model (size, attention, task) is said before training, not as a traceback from inside it."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        which = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}"
        raise CheckpointError(f"{named} does not match this model ({which}, "
                              f"{len(missing)} missing, {len(unexpected)} unexpected keys)")
    for key, value in state.items():
        if value.shape != own[key].shape:
            raise CheckpointError(f"{named} does not match this model: {key} has shape "
                                  f"{tuple(value.shape)}, the model needs {tuple(own[key].shape)}")


# -- random number generators -------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Every generator training draws from, as tensors and plain values (loadable with weights_only)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # This process's device only: a run resumed on fewer (or other) GPUs restores it on the device it has.
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype("uint32"), n["pos"], n["has_gauss"], n["cached"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda_state_for_this_device(state["cuda"], torch.cuda.current_device()))


def cuda_state_for_this_device(saved, device: int) -> torch.Tensor:
    """The CUDA generator state to restore on ``device``: a checkpoint holds one state (this process's), or,
    written before 2026-12-04, one per visible GPU of the machine that saved it; then this device's entry
    where that machine had one, else the first (resuming on fewer GPUs indexed past the list and crashed)."""
    if isinstance(saved, (list, tuple)):
        return saved[device] if device < len(saved) else saved[0]
    return saved


class RandomState(L.Callback):
    """Saves the generators with each checkpoint and restores them just before the first batch after a resume.

    Restoring late (not when the checkpoint is read) matters: setting up the loops and loaders in between
    must not shift the dropout masks of the resumed run.

    Under DDP every rank's generators are saved (``per_rank``, gathered from all ranks: saves happen on every
    rank at the same step) and each rank restores its own: the ranks' generators drift apart as they draw
    dropout masks for batches of different sizes, and restoring rank 0's everywhere changed the masks of the
    other ranks after a resume. On another number of processes each rank restores rank 0's (the top level).
    """

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        state = rng_state()
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            every_rank: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(every_rank, state)
            state = {**state, "per_rank": every_rank}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = dict(state_dict)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._pending is not None:
            state, self._pending = self._pending, None
            every_rank = state.pop("per_rank", None)
            if every_rank is not None and len(every_rank) == trainer.world_size:
                state = every_rank[trainer.global_rank]
            set_rng_state(state)


# -- the "last" checkpoint, periodic saves and preemption ---------------------------------------------
class LastCheckpoint(Checkpoint):
    """Writes ``checkpoints/last.ckpt``: at each validation, every ``every_n_steps`` optimizer steps, at the
    end of training, and when SIGTERM / SIGUSR1 / SIGUSR2 arrive (then training stops with ``Preempted``).

    Saves happen only where Lightning resumes exactly: after an optimizer step that is not followed by a
    validation, or once a validation is over. A signal that lands in a validation step is served when that
    validation ends. Subclassing ``Checkpoint`` makes Lightning run these hooks after ModelCheckpoint's, so
    the best-model bookkeeping stored in ``last.ckpt`` is up to date.
    """

    def __init__(self, dirpath: str | os.PathLike, every_n_steps: int | None = None,
                 handle_signals: bool = True) -> None:
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps or None
        self.handle_signals = handle_signals
        self.last_saved_step = -1
        self.wandb_run_id: str | None = None  # set by run(); kept so a resumed run logs into the same wandb run
        # Set by run(): its stop-signal handler (stop_signals.RunSignals), which holds a signal that came while
        # Lightning set up training and knows the handlers from before the run (submitit's requeue).
        self.run_signals: Any = None
        self._signal: int | None = None
        self._stop_at: int | None = None  # the signal to stop for, once the saved step is fully logged
        self._previous: dict[int, Any] = {}
        self._installed: dict[int, Any] = {}
        self._step_before = 0

    @property
    def path(self) -> Path:
        return self.dirpath / LAST

    @property
    def state_key(self) -> str:
        return "LastCheckpoint"

    def state_dict(self) -> dict[str, Any]:
        return {"last_saved_step": self.last_saved_step, "wandb_run_id": self.wandb_run_id}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_saved_step = int(state_dict.get("last_saved_step", -1))
        self.wandb_run_id = state_dict.get("wandb_run_id") or self.wandb_run_id

    # signals ------------------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        # Lightning installs its own handlers right before training; remember what was there before it
        # (e.g. submitit's requeue handler) so that handler can be called once our checkpoint is on disk.
        if stage == "fit" and self.handle_signals and in_main_thread():
            self._previous = {s: (self.run_signals.previous_handler(s) if self.run_signals is not None
                                  else signal.getsignal(s)) for s in stop_signals()}

    def on_train_start(self, trainer, pl_module) -> None:
        self._signal = self._stop_at = None
        self._step_before = trainer.global_step
        if not (self.handle_signals and in_main_thread()):
            return
        if self.run_signals is not None:  # a signal that came while Lightning set up training
            self._signal = self.run_signals.take_pending()
        for s in stop_signals():
            self._installed[s] = signal.getsignal(s)
            signal.signal(s, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        # Only note it: saving inside a signal handler could interrupt a half-done optimizer step.
        if self._signal is None:
            log.warning("received %s: saving a checkpoint after the current step, then stopping",
                        signal.Signals(signum).name)
        self._signal = signum

    def _restore_handlers(self) -> None:
        for s, handler in self._installed.items():
            if signal.getsignal(s) == self._on_signal:
                signal.signal(s, handler)
        self._installed = {}

    def _pending_signal(self, trainer) -> int | None:
        pending = self._signal is not None
        if trainer.world_size > 1:  # every rank must stop at the same step, or collectives hang
            pending = trainer.strategy.reduce_boolean_decision(pending, all=False)
            if pending and self._signal is None:
                self._signal = signal.SIGTERM
        return self._signal if pending else None

    # saving -------------------------------------------------------------------------------------------
    def save(self, trainer) -> None:
        for lg in trainer.loggers:  # metrics logged so far reach disk before the state that follows them
            lg.save()
        trainer.save_checkpoint(self.path, weights_only=False)
        self.last_saved_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        stepped = trainer.global_step != self._step_before
        self._step_before = trainer.global_step
        if not stepped or trainer.sanity_checking:
            return
        loop = trainer.fit_loop.epoch_loop
        if loop._should_check_val_fx(trainer.fit_loop._data_fetcher):
            return  # a validation follows: save when it ends
        signum = self._pending_signal(trainer)
        periodic = self.every_n_steps and trainer.global_step % self.every_n_steps == 0
        if signum is not None or periodic:
            self.save(trainer)
        if signum is not None:
            self._stop_at = signum

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self.save(trainer)
        signum = self._pending_signal(trainer)
        if signum is not None:
            self._stop_at = signum

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # Stop here rather than right after saving: Lightning logs the saved step's metrics in between.
        if self._stop_at is not None:
            self._stop(trainer, self._stop_at)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.last_saved_step != trainer.global_step:
            self.save(trainer)
        self._restore_handlers()
        if self._stop_at is not None or self._signal is not None:
            self._stop(trainer, self._stop_at or self._signal)  # do not start testing when asked to stop

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._restore_handlers()

    def _stop(self, trainer, signum: int) -> None:
        self._restore_handlers()
        self._stop_at = None
        raise Preempted(signum, trainer.global_step, str(self.path), self._previous.get(signum))


def checkpoint_bytes(module: torch.nn.Module) -> int:
    """About the size of one checkpoint: weights plus Adam's two moments, plus a margin for the rest."""
    weights = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    params = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    return int(weights + 2 * params + (1 << 20))


def stop_signals() -> list[int]:
    return [getattr(signal, name) for name in SIGNALS if hasattr(signal, name)]


def in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
