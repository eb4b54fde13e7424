"""Activation checkpointing: every Transformer layer (``EncoderLayer``, ``DecoderLayer``; a Universal
Transformer's one shared layer at each of its steps) keeps only its input in the forward pass and recomputes
its activations in the backward pass.

PyTorch's checkpoint wrapper does the work (the one Lightning's FSDP strategy and torchtitan use), not code of
our own: the non-reentrant checkpoint restores the random state, so dropout draws the same masks when the
layer is recomputed and the gradients equal those of the plain run; the wrapper's state-dict hooks keep the
parameter names, so a checkpoint of a wrapped network loads into a plain one and back. A layer's side effects
(an attention capture, a sparsity count) happen again when it is recomputed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointWrapper,
    apply_activation_checkpointing,
)

from attnlab.models.blocks import DecoderLayer, EncoderLayer


def recompute_layer_activations(model: nn.Module) -> int:
    """Wrap every layer of ``model`` in place; returns how many were wrapped (0: nothing to do)."""
    layers = sum(isinstance(m, (EncoderLayer, DecoderLayer)) for m in model.modules())
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, (EncoderLayer, DecoderLayer)))
    return layers


@contextlib.contextmanager
def layers_kept(model: nn.Module) -> Iterator[None]:
    """Inside: the wrapped layers of ``model`` run plainly, keeping their activations (no recomputation).

    For counting a training step's FLOPs (``training.perf.count_training_flops``): MFU counts the model's
    forward and backward, not the forward a checkpointed layer runs again in the backward pass (about a
    third more), so the count is the same with ``hardware.activation_checkpointing`` on or off."""
    wrappers = [m for m in model.modules() if isinstance(m, CheckpointWrapper)]
    saved = [w.checkpoint_fn for w in wrappers]
    try:
        for w in wrappers:
            w.checkpoint_fn = _call
        yield
    finally:
        for w, fn in zip(wrappers, saved):
            w.checkpoint_fn = fn


def _call(module: nn.Module, *args, **kwargs):
    return module(*args, **kwargs)
