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

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

from attnlab.models.blocks import DecoderLayer, EncoderLayer


def recompute_layer_activations(model: nn.Module) -> int:
    """Wrap every layer of ``model`` in place; returns how many were wrapped (0: nothing to do)."""
    layers = sum(isinstance(m, (EncoderLayer, DecoderLayer)) for m in model.modules())
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, (EncoderLayer, DecoderLayer)))
    return layers
