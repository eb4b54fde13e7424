"""What the one-GPU estimates need from the presets: each composed at ``scale=gpu`` as the commands compose it, its
training data sampled for the lengths the FLOP count uses, and every row estimated by ``results.gpu_estimate``
(the arithmetic and its assumptions). ``python -m attnlab.cli.gpu_estimate`` (``make gpu-estimates``) writes it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Any

from omegaconf import OmegaConf

from attnlab.results.gpu_estimate import (
    DEFAULT_EVAL_SHARE,
    DEFAULT_MFU,
    DEFAULT_STEP_FLOOR_S,
    PEAK_BF16,
    SPARSE_SLOWDOWN,
    SampledLengths,
    estimate_row,
)
from attnlab.tasks import build_task
from attnlab.training.compose import compose
from attnlab.training.scale import apply_scale

SAMPLE_EXAMPLES = 256
# Task keys that only say how many examples to build: capped while sampling lengths (lengths do not change).
_SIZE_CAPS = {"train_size": 4096, "val_size": 64, "test_size": 64, "max_train_examples": 4096,
              "max_eval_examples": 64, "max_train_pairs": 20000}


def sample_lengths(task_cfg: dict[str, Any], seed: int = 1) -> SampledLengths:
    """The task's training examples as the FLOP count sees them, from ``SAMPLE_EXAMPLES`` spread over the split."""
    cfg = dict(task_cfg)
    for key, cap in _SIZE_CAPS.items():
        if key in cfg and (cfg[key] is None or int(cfg[key]) > cap):
            cfg[key] = cap
    task = build_task(cfg, seed)
    train = task.datasets["train"]
    n = len(train)
    picks = sorted({round(i * (n - 1) / max(SAMPLE_EXAMPLES - 1, 1)) for i in range(min(SAMPLE_EXAMPLES, n))})
    batch = task.collate([train[i] for i in picks])

    def mean_tokens(key: str) -> float:
        return float((batch[key] != task.pad_id).sum()) / len(picks) if key in batch else 0.0

    lengths = task.train_lengths or [0]
    mean_length = sum(lengths) / len(lengths)
    if task.kind == "seq2seq":
        return SampledLengths("seq2seq", task.vocab_size, mean_tokens("src"), mean_tokens("tgt_in"), mean_length, 0.0)
    if task.kind == "lm":
        return SampledLengths("lm", task.vocab_size, 0.0, mean_tokens("ids"), mean_length, 0.0)
    if task.kind == "mlm":
        predicted = float(batch["scored"].sum()) / len(picks)
        return SampledLengths("mlm", task.vocab_size, mean_tokens("ids"), 0.0, mean_length, predicted)
    return SampledLengths("encoder", task.vocab_size, mean_tokens("ids"), 0.0, mean_length, 0.0)


def gpu_configs(experiments: list[str], data_root: str | None) -> dict[str, dict[str, Any]]:
    """Each preset composed at ``scale=gpu`` as the CLI composes it, resolved to plain containers."""
    out = {}
    for experiment in experiments:
        overrides = [f"experiment={experiment}", "scale=gpu"] + ([f"paths.data_root={data_root}"] if data_root else [])
        cfg = compose("train", overrides)
        apply_scale(cfg, overrides)
        out[experiment] = {section: OmegaConf.to_container(cfg[section], resolve=True)
                           for section in ("model", "task", "batch", "trainer")}  # no run folder: no Hydra job
    return out


def estimate_all(experiments: list[str], data_root: str | None, *, mfu: tuple[float, float] = DEFAULT_MFU,
                 step_floor_s: tuple[float, float] = DEFAULT_STEP_FLOOR_S,
                 eval_share: float = DEFAULT_EVAL_SHARE) -> dict[str, Any]:
    configs = gpu_configs(experiments, data_root)
    sampled: dict[str, SampledLengths] = {}
    rows = {}
    for experiment, cfg in configs.items():
        key = json.dumps(cfg["task"], sort_keys=True, default=str)
        if key not in sampled:
            print(f"gpu-estimate: sampling {cfg['task']['name']} for {experiment}", file=sys.stderr, flush=True)
            sampled[key] = sample_lengths(cfg["task"])
        rows[experiment] = asdict(estimate_row(experiment, cfg, sampled[key], mfu=mfu, step_floor_s=step_floor_s,
                                               eval_share=eval_share))
    return {
        "what": "estimated time of one run of each preset at scale=gpu on one GPU, a range (low, high) with "
                "validation and test decoding; NOT measured on a GPU (its per-update floors and the sparse path's "
                "speed are measured on one H200)",
        "generated_by": "python -m attnlab.cli.gpu_estimate (make gpu-estimates)",
        "assumptions": {
            "peak_flops": PEAK_BF16, "peak_of": "H100 SXM / H200, dense bf16, datasheet", "mfu": list(mfu),
            "step_floor_s": list(step_floor_s),
            "step_floor_of": "H200, laptop Synthesizer Table 2 En-De, 800 updates: mean optimizer step (low) and "
                             "training wall per update, 87 s / 800 (high); x layer applications / layers",
            "eval_share": eval_share, "eval_share_of": "validation and test decoding over training wall, same run",
            "sparse_slowdown": round(SPARSE_SLOWDOWN, 2),
            "sparse_slowdown_of": "BigBird at 4096 tokens, H200: full attention 462k tokens/s over the blocked "
                                  "sparse kernel's 41.6k; applied to BigBird rows' compute time",
            "counted": "training updates, validation and test decoding; no padding",
        },
        "rows": rows,
    }
