"""How much of the attention matrix a sparse attention really uses, at the lengths a task feeds it.

The attended fraction at length L is the share of the (query, key) pairs among L real tokens that the
attention lets through: allowed pairs / L^2 (bidirectional) or / L(L+1)/2 (causal, where only the past
counts), 1.0 when the module falls back to dense attention at that length. It is read from the module's own
``Attention.allowed_pairs`` (overridden by the sparse variants: BigBird's block plan), so it is the pattern the run
trained with, averaged over the heads when each head has its own random blocks. Dense variants have no plan: a
bidirectional encoder's dense attention is reported as attending every key (1.0, ``dense_coverage``), a causal or
encoder-decoder model's is not reported. The run record keeps the summary over the test split's lengths
(``extra.attention_coverage``), so a table can check a claim such as "BigBird attends <= 50% of the keys".
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch

from attnlab.attention.base import Attention


def sparse_modules(model: torch.nn.Module) -> list[Attention]:
    """The attention modules of ``model`` whose variant can attend sparsely (it overrides ``allowed_pairs``)."""
    return [m for m in model.modules()
            if isinstance(m, Attention) and type(m).allowed_pairs is not Attention.allowed_pairs]


def attended_fraction(module: Attention, length: int) -> float:
    """Share of the (query, key) pairs among ``length`` real tokens that ``module`` attends (see module doc)."""
    if length <= 0:
        raise ValueError(f"length must be positive, got {length}")
    causal = bool(getattr(module, "causal", False))
    # (heads of the plan, length, length), or (length, length) for a pattern shared by every head; None: dense
    allowed = module.allowed_pairs(length)
    if allowed is None:
        return 1.0
    pairs = length * (length + 1) // 2 if causal else length * length
    heads = allowed.numel() // (length * length)
    return int(allowed.sum()) / (pairs * heads)


def coverage_summary(model: torch.nn.Module, lengths: Iterable[int]) -> dict[str, Any] | None:
    """The attended fraction over a split's example lengths (each example as if alone in its batch),
    averaged over the model's sparse modules; None when the model has none."""
    modules = sparse_modules(model)
    counts = Counter(int(n) for n in lengths if int(n) > 0)
    if not modules or not counts:
        return None
    per_length = {n: statistics.fmean(attended_fraction(m, n) for m in modules) for n in sorted(counts)}
    total = sum(counts.values())
    first = modules[0]
    return {
        "attended_fraction_mean": sum(per_length[n] * c for n, c in counts.items()) / total,
        "attended_fraction_max": max(per_length.values()),
        "attended_fraction_min": min(per_length.values()),
        "dense_fallback_share": sum(c for n, c in counts.items() if first.allowed_pairs(n) is None) / total,
        "lengths": _length_summary(counts),
        "block_size": int(getattr(first, "block_size", 0)) or None,
    }


def _length_summary(counts: Counter) -> dict[str, Any]:
    total = sum(counts.values())
    return {"min": min(counts), "max": max(counts), "mean": sum(n * c for n, c in counts.items()) / total,
            "examples": total}


def dense_coverage(model: torch.nn.Module, lengths: Iterable[int]) -> dict[str, Any] | None:
    """``coverage_summary``'s fields for a model whose attention is dense and bidirectional everywhere (no causal
    module): every key of every query, at any length. None for a model with causal attention (LM, decoder)."""
    attention = [m for m in model.modules() if isinstance(m, Attention)]
    if not attention or any(m.causal for m in attention):
        return None  # before reading the lengths: they cost a pass over the split
    counts = Counter(int(n) for n in lengths if int(n) > 0)
    if not counts:
        return None
    return {
        "attended_fraction_mean": 1.0, "attended_fraction_max": 1.0, "attended_fraction_min": 1.0,
        "dense_fallback_share": 0.0, "lengths": _length_summary(counts), "block_size": None,
    }
