"""Estimated GPU time of every paper preset's one-GPU protocol (``scale=gpu``), written to
``results/gpu/estimates.json`` for ``make reproduce-list SCALE=gpu``.

Nothing here ran on a GPU: the estimate is FLOPs over an assumed throughput, stated in the file beside the numbers.

- **Model FLOPs per update**, counted analytically from the composed ``scale=gpu`` config: per token of a stack,
  6 x its matmul parameters per layer application (the query, key, value and output projections 4 d^2, the
  feed-forward 2 d d_ff, cross-attention another 4 d^2 in a decoder) x the applications (layers, or the UT's steps,
  or ACT's maximum), plus attention scores 12 x applications x d x the sequence length (Kaplan et al. 2020, as
  ``training.perf.transformer_flops_per_token``), plus the output projection 6 d V on the tokens a decoder or a
  masked LM predicts (a masked LM projects its masked positions only). Attention is costed as dense, an upper
  bound for the sparse (BigBird) rows; the synthesizers' projections are costed as dot-product attention's.
  Tests hold the count within 15% of torch's FlopCounterMode on the models the runs build.
- **Tokens per update** are measured from the protocol's own data: the task is built (its sizes capped, which does
  not change how long its examples are) and 256 training examples spread over the split are collated; their
  non-padding source and target tokens give the mean lengths, and the batch settings (sentences, or a padded-token
  budget over the source lengths) give the examples per update. Padding is not counted.
- **Time** is a range, not a point. Per update, the larger of the FLOPs over ``peak x mfu`` and a per-update floor
  (the host-bound step of a small model), at both ends: the low end at MFU 0.3 with the floor at the measured mean
  optimizer step (44 ms), the high end at MFU 0.15 with the floor at the measured training wall time per update
  (109 ms: data, logging and the step); both from the one GPU run we have, the laptop Synthesizer Table 2 En-De preset
  on an H200 (``../shared/gpu/README.md``: 800 updates in 87 s, steps of 31-90 ms). Validation and test decoding
  add 54% of the training wall time in that run; both ends count them. A recurrent row (UT, ACT) scales the floor
  by its layer applications over its layers (the host-bound part launches kernels per application). A BigBird row
  is costed at the measured sparse path: its compute time x 11.1, full attention's 462k tokens/s over the blocked
  kernel's 41.6k at 4096 tokens on the same H200 (the compiled flex path did not run there).
The arithmetic is here (no torch, no data); ``training/gpu_estimates.py`` composes the presets, samples their data and
writes the file (``make gpu-estimates``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

# The assumptions of every estimate, written beside them; (low, high) ends of the range.
PEAK_BF16 = 989.5e12  # H100 SXM / H200 dense bf16 datasheet FLOP/s (training.perf.PEAK_FLOPS)
DEFAULT_MFU = (0.3, 0.15)  # a dense Transformer in bf16 that keeps the GPU fed, and half of it; not measured here
# The one GPU run (H200, laptop Synthesizer Table 2 En-De, 800 updates; ../shared/gpu/README.md and issue 53): the
# mean optimizer step, and the training wall time per update (87 s / 800), as the per-update floor of each end.
DEFAULT_STEP_FLOOR_S = (0.044, 0.109)
DEFAULT_EVAL_SHARE = 0.54  # validation and test decoding, as a share of that run's training wall time
SPARSE_SLOWDOWN = 462 / 41.6  # BigBird at 4096 tokens, H200: full attention 462k tokens/s, blocked sparse 41.6k

log = logging.getLogger("attnlab")


class SampledLengths(NamedTuple):
    """What a task's training examples look like to the FLOP count (``sample_lengths``)."""

    kind: str  # seq2seq | lm | mlm | encoder (``flops_per_example``)
    vocab: int
    source: float  # mean non-padding tokens per example read by the encoder (or the only stack)
    target: float  # mean tokens per example read by a decoder
    mean_length: float  # mean ``train_lengths``: what a padded-token budget counts
    predicted: float  # mean positions a masked LM projects onto the vocabulary


@dataclass
class RowEstimate:
    experiment: str
    steps: int
    examples_per_update: float
    source_tokens: float  # mean non-padding tokens per example read by the encoder (or the only stack)
    target_tokens: float  # mean tokens per example read by a decoder (0 for encoder-only models)
    tokens_per_update: float
    matmul_params: int  # per token, over every layer application and the output projection
    flops_per_update: float
    step_s: tuple[float, float]  # (low, high) seconds per update
    bound: str  # what sets the step at both ends: "flops", "step floor", or "flops at the low end only" etc.
    run_s: tuple[float, float]  # (low, high) seconds of one run, evaluation included
    sparse: bool = False  # costed at the measured sparse (BigBird) path
    floor_scale: float = 1.0  # layer applications over layers (a recurrent row's floor grows with its steps)


def _applications(model: dict[str, Any], layers: int) -> int:
    """How many times a stack applies a layer: its layers, or the UT's steps, or ACT's maximum (an upper bound)."""
    rec = model.get("recurrence") or {}
    name = rec.get("name", "stacked")
    if name == "ut":
        return int(rec.get("num_steps") or layers)
    if name == "ut_act":
        return int(rec.get("act_max_steps") or 2 * layers)
    return layers


def flops_per_example(model: dict[str, Any], kind: str, vocab: int, source: float, target: float,
                      predicted: float | None = None) -> tuple[float, int]:
    """Training FLOPs of one example and the matmul parameters per token behind them (see the module doc).

    ``kind``: ``seq2seq`` (encoder-decoder), ``lm`` (decoder only, over ``target`` tokens), ``mlm`` (an encoder
    whose head projects ``predicted`` positions of each example onto the vocabulary; all of them by default) or
    ``encoder`` (a classifier: no output projection over a vocabulary)."""
    d, ff = int(model["d_model"]), int(model["d_ff"])
    self_layer, cross = 4 * d * d + 2 * d * ff, 4 * d * d
    enc_apps = _applications(model, int(model["encoder_layers"]))
    dec_apps = _applications(model, int(model["decoder_layers"]))
    out = d * vocab
    if kind == "seq2seq":
        enc_params = self_layer * enc_apps
        dec_params = (self_layer + cross) * dec_apps + out
        flops = source * (6 * enc_params + 12 * enc_apps * d * source)
        flops += target * (6 * dec_params + 12 * dec_apps * d * (target + source))
        return flops, enc_params + dec_params
    if kind == "lm":
        params = self_layer * dec_apps + out
        return target * (6 * params + 12 * dec_apps * d * target), params
    params = self_layer * enc_apps
    flops = source * (6 * params + 12 * enc_apps * d * source)
    if kind == "mlm":
        flops += 6 * out * (source if predicted is None else predicted)
        params += out
    return flops, params


def _floor_scale(model: dict[str, Any], kind: str) -> float:
    """Layer applications over layers, over the stacks the model runs (1 for a stacked model)."""
    stacks = {"seq2seq": ("encoder_layers", "decoder_layers"), "lm": ("decoder_layers",)}.get(kind, ("encoder_layers",))
    layers = sum(int(model[k]) for k in stacks)
    return sum(_applications(model, int(model[k])) for k in stacks) / max(layers, 1)


def estimate_row(experiment: str, cfg: dict[str, Any], sampled: SampledLengths | tuple, *,
                 mfu: tuple[float, float] = DEFAULT_MFU, step_floor_s: tuple[float, float] = DEFAULT_STEP_FLOOR_S,
                 eval_share: float = DEFAULT_EVAL_SHARE, peak: float = PEAK_BF16) -> RowEstimate:
    kind, vocab, source, target, mean_length, predicted = sampled
    batch = cfg["batch"]
    examples = float(batch["sentences_per_update"])
    if batch.get("tokens_per_update"):  # a padded-token budget over the source lengths (training.data)
        examples = min(examples, float(batch["tokens_per_update"]) / max(mean_length, 1.0))
    per_example, params = flops_per_example(cfg["model"], kind, vocab, source, target, predicted)
    flops = per_example * examples
    sparse = (cfg["model"].get("attention") or {}).get("name") == "bigbird"
    scale = _floor_scale(cfg["model"], kind)
    steps = int(cfg["trainer"]["max_steps"])
    step_s, by_flops = [], []
    for end_mfu, floor in zip(mfu, step_floor_s):
        compute_s = flops / (peak * end_mfu) * (SPARSE_SLOWDOWN if sparse else 1.0)
        step_s.append(max(compute_s, floor * scale))
        by_flops.append(compute_s >= floor * scale)
    bound = ("flops" if all(by_flops) else "step floor" if not any(by_flops)
             else "step floor at the low end, flops at the high end" if by_flops[1] else "flops at the low end only")
    return RowEstimate(experiment=experiment, steps=steps, examples_per_update=round(examples, 2),
                       source_tokens=round(source, 2), target_tokens=round(target, 2),
                       tokens_per_update=round(examples * (source + target), 1), matmul_params=int(params),
                       flops_per_update=float(f"{flops:.4g}"), step_s=tuple(float(f"{s:.4g}") for s in step_s),
                       bound=bound, run_s=tuple(round(steps * s * (1 + eval_share), 1) for s in step_s),
                       sparse=sparse, floor_scale=round(scale, 3))


def gpu_protocol_experiments(conf_dir: Path) -> list[str]:
    """Every paper preset with a root ``at_scale.gpu`` block (a table with a one-GPU protocol)."""
    import yaml

    found = []
    for path in sorted(conf_dir.glob("*/*/*.yaml")):
        rel = path.relative_to(conf_dir).with_suffix("").as_posix()
        if rel.startswith(("demo/", "probes/")):
            continue
        data = yaml.safe_load(path.read_text()) or {}
        if "gpu" in (data.get("at_scale") or {}):
            found.append(rel)
    return found
