"""Averaging the weights of a run's last N checkpoints, as fairseq's ``scripts/average_checkpoints.py`` does for
its MT results (the Transformer and the UT papers report WMT14 BLEU of averaged checkpoints).

Every input is loaded with ``torch.load(weights_only=True)`` (``checkpointing.load_checkpoint_file``). The model
weights (the Lightning ``state_dict``) of all inputs must have the same keys at the same shapes and dtypes, or
nothing is written. As fairseq: a floating-point tensor is the mean of the inputs (summed in float32, or float64
for float64 tensors, then cast back to its dtype); a non-floating tensor (an integer or boolean buffer, e.g. a
fixed random pattern) is the sum floor-divided by N, which is the value itself where the inputs agree.

The averaged file holds the weights, the newest input's ``global_step`` and the list of inputs, no optimizer
state: it is for ``attnlab-eval``, not for resuming, so it is never written into a ``checkpoints/`` folder (where
resuming would take it). It is written atomically: a failure leaves no file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from attnlab.results.record import CHECKPOINTS_DIR
from attnlab.training.checkpointing import (
    LAST,
    TMP_MARK,
    CheckpointError,
    atomic_torch_save,
    checkpoint_step,
    load_checkpoint_file,
    model_weights,
)

# ModelCheckpoint's file names (training/callbacks.build_callbacks: filename="step{step:07d}")
STEP_FILE = re.compile(r"step(\d+)\.ckpt")


class AveragingError(CheckpointError):
    """Checkpoints that cannot be averaged, or an output that cannot be written; the message is one line."""


def average_weights(states: Sequence[Mapping[str, torch.Tensor]], names: Sequence[str] | None = None
                    ) -> dict[str, torch.Tensor]:
    """The element-wise mean of ``states`` (state dicts with the same keys, shapes and dtypes), fairseq's rule
    for tensors that are not floating point (sum, floor-divided by N). ``names`` label the inputs in a refusal."""
    if not states:
        raise AveragingError("no checkpoints to average")
    names = list(names) if names is not None else [f"input {i + 1}" for i in range(len(states))]
    first, n = states[0], len(states)
    for name, state in zip(names[1:], states[1:]):
        missing, extra = sorted(set(first) - set(state)), sorted(set(state) - set(first))
        if missing or extra:
            which = f"lacks {missing[0]}" if missing else f"has {extra[0]}, which {names[0]} lacks"
            raise AveragingError(f"cannot average {name} with {names[0]}: {name} {which} ({len(missing)} missing, "
                                 f"{len(extra)} extra keys); average checkpoints of one model")
        for key, value in first.items():
            other = state[key]
            if other.shape != value.shape or other.dtype != value.dtype:
                raise AveragingError(f"cannot average {name} with {names[0]}: {key} is {_describe(other)} there, "
                                     f"{_describe(value)} in {names[0]}")
    averaged = {}
    for key, value in first.items():
        floating = value.is_floating_point()
        acc_dtype = (torch.float64 if value.dtype == torch.float64 else torch.float32) if floating else torch.int64
        total = sum((s[key].detach().to("cpu", acc_dtype) for s in states[1:]), value.detach().to("cpu", acc_dtype))
        mean = total / n if floating else torch.div(total, n, rounding_mode="floor")
        averaged[key] = mean.to(value.dtype)
    return averaged


def _describe(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"


def checkpoint_folder(path: Path) -> Path:
    """A run folder's ``checkpoints/``, or the folder given if it is one."""
    if not path.is_dir():
        raise AveragingError(f"{path} is not a folder: give a run folder (or its checkpoints/) with --last N, or "
                             "checkpoint files without it")
    inside = path / CHECKPOINTS_DIR
    return inside if inside.is_dir() else path


def last_checkpoints(folder: Path, n: int) -> list[Path]:
    """The ``n`` checkpoints of the highest steps in a run folder, oldest first: the ``step<N>.ckpt`` files that
    ``callbacks.checkpoint.save_top_k=-1`` keeps at every validation, and ``last.ckpt`` where its step has no
    such file (its step is read from it)."""
    if n < 1:
        raise AveragingError(f"--last {n}: give a positive number of checkpoints")
    ckpt_dir = checkpoint_folder(folder)
    by_step: dict[int, Path] = {}
    for path in ckpt_dir.glob("*.ckpt"):
        m = STEP_FILE.fullmatch(path.name)
        if m and TMP_MARK not in path.name:
            by_step[int(m.group(1))] = path
    last = ckpt_dir / LAST
    if last.is_file():
        by_step.setdefault(checkpoint_step(load_checkpoint_file(last)), last)
    if len(by_step) < n:
        found = ", ".join(str(s) for s in sorted(by_step)) or "none"
        raise AveragingError(f"{ckpt_dir} has checkpoints of {len(by_step)} steps ({found}), {n} are needed; a run "
                             "keeps one per validation with callbacks.checkpoint.save_top_k=-1")
    return [by_step[s] for s in sorted(by_step)[-n:]]


def default_output(folder: Path, n: int) -> Path:
    """``<run>/averaged_last<n>.ckpt``: beside the run's config, so ``attnlab-eval`` finds the run from it."""
    ckpt_dir = checkpoint_folder(folder)
    run_dir = ckpt_dir.parent if ckpt_dir.name == CHECKPOINTS_DIR else ckpt_dir
    return run_dir / f"averaged_last{n}.ckpt"


def average_checkpoints(inputs: Sequence[Path], output: Path) -> dict[str, Any]:
    """Average the weights of ``inputs`` into ``output`` (atomically); returns what was written."""
    inputs = [Path(p) for p in inputs]
    output = Path(output)
    if len(inputs) < 2:
        raise AveragingError(f"give at least two checkpoints to average, got {len(inputs)}")
    if output.parent.name == CHECKPOINTS_DIR:
        raise AveragingError(f"{output}: write the average outside checkpoints/ (resuming would take it; it has no "
                             "optimizer state), e.g. into the run folder")
    resolved = {p.resolve() for p in inputs}
    if output.resolve() in resolved:
        raise AveragingError(f"{output} is one of the inputs; write the average to a new file")
    if len(resolved) < len(inputs):
        raise AveragingError("a checkpoint is given twice; each input counts once in the mean")
    if output.is_dir():
        raise AveragingError(f"{output} is a folder; give a file name, e.g. {output / 'averaged.ckpt'}")
    checkpoints = [load_checkpoint_file(p) for p in inputs]
    states = [model_weights(c, p) for c, p in zip(checkpoints, inputs)]
    averaged = average_weights(states, [str(p) for p in inputs])
    steps = [checkpoint_step(c) for c in checkpoints]
    written = {
        "state_dict": averaged,
        "global_step": max(steps),
        "averaged_from": [{"path": str(p), "global_step": s} for p, s in zip(inputs, steps)],
    }
    try:
        atomic_torch_save(written, output)
    except OSError as exc:
        raise AveragingError(f"cannot write {output}: {exc.strerror or exc}") from None
    return {"output": str(output), "inputs": [str(p) for p in inputs], "steps": steps, "tensors": len(averaged)}
