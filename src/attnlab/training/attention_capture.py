"""Attention capture at the end of training: attention-weight histograms of the trained model,
``<run>/attention/weights_hist.json`` (Synthesizer Figure 2).

With ``callbacks.record_attention=true`` (the config key keeps its published name), when training ends the
model reads a fixed sample (the first ``callbacks.record_attention_sample_size`` sequences of the first validation
batch, the batch the ponder statistics use) under ``attnlab.attention.capture.capture_attention_weights``, and
every self-attention layer's post-softmax weights are reduced to fixed-edge histograms and row statistics as soon
as the layer has run, so at most one layer's weights exist at a time. The file is a few kilobytes; the notebook
``notebooks/synthesizer_attention_histograms.ipynb`` draws it.

Only real entries count: rows of padding queries are left out, and so are keys a query may not attend
(padding, the future in a causal layer, keys outside BigBird's block plan). Counting is done on the
module's own outputs, so the file describes what the trained model computes, not a re-derivation.
The capture runs in eval mode with the RNG state restored afterwards, so the run's numbers (and its
config hash, see ``results.record.DEFAULT_HASH_EXCLUDE``) are the same with and without it.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import lightning as L
import torch

from attnlab.attention.capture import AttentionWeights, capture_attention_weights
from attnlab.results.record import ATTENTION_DIR, atomic_write_text
from attnlab.training.data import first_validation_rows

log = logging.getLogger(__name__)

FORMAT = "attnlab.attention_weights_hist/1"
FILENAME = Path(ATTENTION_DIR) / "weights_hist.json"
LINEAR_BINS = 50  # equal bins on [0, 1]; the last bin includes 1
LOG10_BINS = 40  # equal bins on log10(weight) in [LOG10_MIN, 0]
LOG10_MIN = -8.0  # weights below 10**LOG10_MIN (exact zeros included) are counted apart, as "below"


def linear_edges() -> list[float]:
    return [round(i / LINEAR_BINS, 6) for i in range(LINEAR_BINS + 1)]


def log10_edges() -> list[float]:
    return [round(LOG10_MIN + i * (-LOG10_MIN) / LOG10_BINS, 6) for i in range(LOG10_BINS + 1)]


def _stack_of(name: str) -> str:
    """``encoder`` / ``decoder`` from a module path (``decoder.layers.2.self_attn``), else its first part."""
    parts = name.split(".")
    return next((p for p in parts if p in ("encoder", "decoder")), parts[0] or "model")


def summarize(capture: AttentionWeights, layer: int) -> dict[str, Any]:
    """One layer's entry of the file: histograms of the weights over real allowed entries, row statistics."""
    entry: dict[str, Any] = {
        "stack": _stack_of(capture.name), "layer": layer, "module": capture.name, "call": capture.call,
        "variant": capture.variant, "causal": capture.causal, "layout": capture.layout,
        "available": capture.available, "note": capture.note,
    }
    if not capture.available:
        return entry
    weights = capture.allowed_entries().float().clamp(0.0, 1.0)
    stats = capture.row_statistics()
    linear = torch.histc(weights, bins=LINEAR_BINS, min=0.0, max=1.0) if weights.numel() else torch.zeros(LINEAR_BINS)
    visible = weights[weights >= 10**LOG10_MIN]
    logs = torch.histc(visible.log10(), bins=LOG10_BINS, min=LOG10_MIN, max=0.0) if visible.numel() else (
        torch.zeros(LOG10_BINS))
    keys = stats["keys"].float()

    def mean(t: torch.Tensor) -> float | None:
        return round(float(t.float().mean()), 6) if t.numel() else None

    entry.update({
        "rows": int(stats["entropy"].numel()),  # real query rows x heads
        "entries": int(weights.numel()),
        "linear_counts": [int(c) for c in linear.round().tolist()],
        "log10_counts": [int(c) for c in logs.round().tolist()],
        "log10_below": int(weights.numel() - visible.numel()),
        "mean_row_entropy": mean(stats["entropy"]),  # nats
        "mean_uniform_entropy": mean(keys.clamp_min(1).log()),  # the same rows spread evenly: the ceiling
        "mean_row_max": mean(stats["max"]),
        "mean_keys_per_row": mean(keys),
    })
    return entry


def attention_histograms(model: torch.nn.Module, forward) -> list[dict[str, Any]]:
    """Run ``forward()`` with ``model``'s self-attention weights captured; one summary per layer call.

    ``layer`` counts the calls within a stack in order: the layer index of a stacked model, the step of a
    Universal Transformer's shared layer.
    """
    layers: list[dict[str, Any]] = []
    seen: dict[str, int] = {}

    def reduce(capture: AttentionWeights) -> None:
        stack = _stack_of(capture.name)
        layers.append(summarize(capture, seen.get(stack, 0)))
        seen[stack] = seen.get(stack, 0) + 1

    with capture_attention_weights(model, sink=reduce):
        forward()
    return layers


def fixed_sample_batch(trainer: L.Trainer, size: int) -> dict[str, torch.Tensor]:
    """The first ``size`` rows of the first validation batch (the sample ``PonderStats`` draws too)."""
    return first_validation_rows(trainer.datamodule, size)


def check_weights_hist(data: Any) -> list[str]:
    """Every problem of a ``weights_hist.json`` document (empty when it is well formed)."""
    if not isinstance(data, dict):
        return ["not a JSON object"]
    problems = []
    if data.get("format") != FORMAT:
        problems.append(f"format is {data.get('format')!r}, expected {FORMAT!r}")
    bins = data.get("bins", {})
    if bins.get("linear", {}).get("edges") != linear_edges() or bins.get("log10", {}).get("edges") != log10_edges():
        problems.append("bin edges differ from the fixed ones")
    layers = data.get("layers")
    if not isinstance(layers, list) or not layers:
        return [*problems, "no layers"]
    for i, layer in enumerate(layers):
        where = f"layers[{i}] ({layer.get('module')})"
        if layer.get("stack") not in ("encoder", "decoder") or not isinstance(layer.get("layer"), int):
            problems.append(f"{where}: stack/layer missing")
        if not layer.get("available"):
            continue
        linear, logs = layer.get("linear_counts", []), layer.get("log10_counts", [])
        if len(linear) != LINEAR_BINS or len(logs) != LOG10_BINS:
            problems.append(f"{where}: expected {LINEAR_BINS} linear and {LOG10_BINS} log10 counts")
            continue
        if sum(linear) != layer.get("entries") or sum(logs) + layer.get("log10_below", -1) != layer.get("entries"):
            problems.append(f"{where}: counts do not add up to the {layer.get('entries')} entries")
        for key in ("mean_row_entropy", "mean_row_max", "mean_keys_per_row"):
            value = layer.get(key)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                problems.append(f"{where}: {key} is not a number")
        if isinstance(layer.get("mean_row_max"), float) and not 0.0 < layer["mean_row_max"] <= 1.0 + 1e-6:
            problems.append(f"{where}: mean_row_max outside (0, 1]")
    return problems


class AttentionWeightsHistogram(L.Callback):
    """Writes ``<run>/attention/weights_hist.json`` once training ends (``callbacks.record_attention``)."""

    def __init__(self, out_dir: str, sample_size: int = 8) -> None:
        self.out_dir, self.sample_size = out_dir, sample_size

    def on_train_end(self, trainer, pl_module):
        if not trainer.is_global_zero:
            return
        try:
            self.write(trainer, pl_module)
        except Exception as exc:  # noqa: BLE001 - an analysis artifact must not fail a finished training
            log.warning("attention weights not captured: %s: %s", exc.__class__.__name__,
                        str(exc).splitlines()[0] if str(exc) else "")

    def write(self, trainer, pl_module) -> Path:
        sample = fixed_sample_batch(trainer, self.sample_size)
        batch = {k: v.to(pl_module.device) for k, v in sample.items()}
        was_training = pl_module.training
        pl_module.eval()
        devices = [pl_module.device] if pl_module.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices), torch.no_grad():
                layers = attention_histograms(pl_module.model, lambda: pl_module.compute_loss(batch))
        finally:
            pl_module.train(was_training)
        sequences = {k: v for k, v in sample.items() if v.dim() == 2}  # (batch, length) token ids
        document = {
            "format": FORMAT,
            "step": int(trainer.global_step),
            "sample": {"split": "val", "sequences": int(next(iter(sample.values())).shape[0]),
                       "lengths": {k: int(v.shape[1]) for k, v in sequences.items()},
                       "source": "first rows of the first validation batch"},
            "bins": {
                "linear": {"edges": linear_edges()},
                "log10": {"edges": log10_edges(), "below": f"weights < 1e{int(LOG10_MIN)}, zeros included"},
            },
            "counted": "real query rows x heads, over the keys each query may attend",
            "layers": layers,
        }
        path = Path(self.out_dir) / FILENAME
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(document, indent=1) + "\n")
        return path
