"""Base class, capability flags and the cache convention for every attention variant."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from attnlab.errors import UserError


@dataclass(frozen=True)
class Capabilities:
    """What a variant can do; the builder refuses combinations a variant cannot serve.

    causal: can be used as a causal (decoder / LM) self-attention.
    cross: can attend to a separate memory (encoder-decoder cross-attention).
    incremental: supports token-by-token decoding with a cache.
    bounded_length: needs ``max_len`` at construction and refuses longer inputs (synthesizers).
    """

    causal: bool = True
    cross: bool = True
    incremental: bool = True
    bounded_length: bool = False


class AttentionError(UserError, ValueError):
    """A configuration or input that a variant cannot serve; the message is one line, ready for users."""


Cache = dict[str, Any]
"""Incremental-decoding state of one attention module.

Every tensor in a cache has the batch as its first dimension so beam search can reorder it with
``reorder_cache``. ``cache["length"]`` (int) counts the positions already consumed (self-attention).
"""


def reorder_cache(cache: Cache, index: torch.Tensor) -> Cache:
    """Select batch rows of every cached tensor (beam search reordering), in place."""
    for key, value in list(cache.items()):
        if isinstance(value, torch.Tensor):
            cache[key] = value.index_select(0, index)
        elif isinstance(value, dict):
            reorder_cache(value, index)
    return cache


class Attention(nn.Module):
    """Multi-head attention contract.

    Self-attention modules: ``forward(x, key_padding_mask=None, cache=None)``.
    Cross-attention modules (built with ``cross=True``): ``forward(x, memory, memory_padding_mask=None,
    cache=None)``. ``x`` is (batch, length, d_model); the output has the same shape.

    With ``cache`` (a dict, empty at the first step) a self-attention module treats ``x`` as the next
    positions of the sequence, starting at absolute position ``cache.get("length", 0)``, and updates the
    cache; a cross-attention module stores the projected memory at its first call.
    """

    capabilities: ClassVar[Capabilities] = Capabilities()
    name: ClassVar[str] = ""
    # Set on an instance only inside ``capture.capture_attention_weights``; the class default keeps the
    # normal path to one attribute check.
    _weights_sink: Callable[[Any], None] | None = None
    # True on an instance only inside ``countable_kernels``: a variant with fast kernels then runs its
    # pure-PyTorch reference, whose operations a FLOP counter sees (compiled or threaded kernels it does not).
    counting_flops: bool = False

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        max_len: int | None = None,
        causal: bool = False,
        dropout: float = 0.0,
        cross: bool = False,
    ) -> None:
        super().__init__()
        if d_model % num_heads != 0:
            raise AttentionError(
                f"d_model={d_model} is not divisible by num_heads={num_heads}; choose num_heads among the "
                f"divisors of d_model (e.g. {[h for h in (1, 2, 4, 8, 16, 32) if d_model % h == 0]})"
            )
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.max_len = max_len
        self.causal = causal
        self.dropout = dropout
        self.is_cross = cross

    # -- attention capture (``attnlab.attention.capture``) -------------------------------------------
    @property
    def capturing_weights(self) -> bool:
        """True inside ``capture_attention_weights``: a self-attention forward without a cache must then
        compute its post-mask softmax weights explicitly and pass them to ``emit_weights``."""
        return self._weights_sink is not None

    def emit_weights(self, capture: Any) -> None:
        if self._weights_sink is not None:
            self._weights_sink(capture)

    def bind_layer(self, layer_index: int, run_seed: int) -> None:
        """Told once, after the network is built (``number_attention_layers``), which layer this module is
        and the run's seed; variants whose fixed random state is drawn per layer and run redraw it here.
        By default passed on to the attention modules inside this one (the components of a mixture)."""
        for module in _outermost_attention(self.children()):
            module.bind_layer(layer_index, run_seed)

    # -- helpers shared by variants -------------------------------------------------------------
    @classmethod
    def resolve_options(cls, options: dict[str, Any], *, run_seed: int, train_lengths: list[int]) -> dict[str, Any]:
        """The variant's options with what only the run and its data know filled in, before the model is built
        (the config hash is taken before, so a rerun finds its record). Here: a ``seed`` option left None takes
        the run's seed (fixed random synthesizer matrices, BigBird's random blocks). A variant whose options
        depend on the data overrides it (QKNorm's g0 from the training lengths)."""
        if "seed" in options and options["seed"] is None:
            options = {**options, "seed": int(run_seed)}
        return options

    def check_device(self, device: torch.device) -> None:
        """Refuse (``AttentionError``, one line) options that cannot run on ``device`` at any shape, so the config
        check fails before the run folder exists; what depends on the data's shapes is decided in the forward.
        Every device serves the dense variants; a variant with kernels of its own overrides it (BigBird's impl)."""

    def allowed_pairs(self, length: int) -> torch.Tensor | None:
        """The (query, key) pairs this attention lets through among ``length`` real tokens, as a boolean mask of
        (length, length) or (heads, length, length); None where it attends densely (every key, or every earlier
        key when causal). A sparse variant overrides it; ``training.sparsity`` reads it for the attended fraction."""
        return None

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, L, D) -> (B, H, L, Dh)."""
        b, n, _ = t.shape
        return t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def merge_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, H, L, Dh) -> (B, L, D)."""
        b, h, n, dh = t.shape
        return t.transpose(1, 2).reshape(b, n, h * dh)

    def check_length(self, length: int) -> None:
        if self.max_len is not None and self.capabilities.bounded_length and length > self.max_len:
            raise AttentionError(
                f"{self.name}: sequence length {length} exceeds max_len={self.max_len}; raise "
                f"model.max_len or shorten the task's max length"
            )

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, causal={self.causal}, "
            f"cross={self.is_cross}, max_len={self.max_len}"
        )


def _outermost_attention(modules):
    """The attention modules among ``modules`` and their descendants, not descending into one."""
    for module in modules:
        if isinstance(module, Attention):
            yield module
        else:
            yield from _outermost_attention(module.children())


@contextmanager
def countable_kernels(model: nn.Module):
    """Inside: every attention module of ``model`` computes with its reference kernel (same values, plain
    tensor operations in the calling thread), so ``torch.utils.flop_counter.FlopCounterMode`` counts what it
    executes. Outside of it, compiled FlexAttention is invisible to the counter (and eager FlexAttention makes
    it raise), and the blocked CPU kernel computes in worker threads the counter does not watch."""
    modules = [m for m in model.modules() if isinstance(m, Attention)]
    for m in modules:
        m.counting_flops = True
    try:
        yield
    finally:
        for m in modules:
            del m.counting_flops  # back to the class default


def number_attention_layers(model: nn.Module, run_seed: int | None = None) -> int:
    """Call ``bind_layer(index, run_seed)`` on every attention module of ``model`` that is not inside
    another attention module, numbered 0, 1, ... in module order (encoder layers, then decoder layers; a
    layer's self-attention before its cross-attention). A run passes its seed (``TaskModule`` hands ``cfg.seed``
    to the network); a network built alone (tests, tools) passes None and the draw takes ``torch.initial_seed()``.
    Returns the number of modules numbered."""
    seed = torch.initial_seed() if run_seed is None else int(run_seed)
    count = 0
    for count, module in enumerate(_outermost_attention([model]), start=1):
        module.bind_layer(count - 1, seed)
    return count
