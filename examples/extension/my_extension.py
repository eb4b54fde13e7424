"""A user's own attention variant, task and callback, added to attnlab without editing it.

Listed in a run's ``plugins`` (see conf/experiment/sort_tempered.yaml), this file is imported before the
config is checked: the decorators register the variant and the task, and the callback is found by its
``_target_``. docs/extending.md walks through it; tests/test_extension.py runs it end to end.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

from attnlab.attention import register_attention
from attnlab.attention.vanilla import DotProductAttention
from attnlab.tasks import TaskData, register_task_family
from attnlab.tasks.batching import PairDataset
from attnlab.tasks.schemas import CommonTask
from attnlab.tasks.vocab import Vocab, symbol_seq2seq_task


# -- an attention variant: dot-product attention with a softmax temperature ------------------------------
@dataclass
class TemperedOptions:
    temperature: float = 2.0  # softmax(q.k / (temperature * sqrt(d_head))): > 1 flattens the weights


@register_attention("tempered", options=TemperedOptions, summary="dot-product attention with a temperature")
class TemperedAttention(DotProductAttention):
    def scale(self) -> float:
        return 1.0 / (self.options.temperature * self.head_dim**0.5)


# -- a task: sort a string of digits (generated) ----------------------------------------------------------
@dataclass
class SortTask(CommonTask):
    train_size: int = 1000
    val_size: int = 100
    test_size: int = 100
    max_len: int = 12


@register_task_family("sort_digits", schema=SortTask)
def load_sort(cfg: dict[str, Any], seed: int) -> TaskData:
    vocab = Vocab([str(d) for d in range(10)])
    rng = random.Random(seed if cfg.get("data_seed") is None else cfg["data_seed"])

    def pairs(n: int) -> PairDataset:
        out = []
        for _ in range(n):
            digits = [str(rng.randrange(10)) for _ in range(rng.randint(1, cfg["max_len"]))]
            out.append((vocab.encode(digits), vocab.encode(sorted(digits))))
        return PairDataset(out)

    datasets = {"train": pairs(cfg["train_size"]), "val": pairs(cfg["val_size"]), "test": pairs(cfg["test_size"])}
    return symbol_seq2seq_task(
        vocab, datasets, max_len=cfg["max_len"] + 2,
        metric_flavours={"seq_acc": "greedy decoding; fraction of outputs exactly sorted"},
        detokenize=lambda ids: " ".join(vocab.decode(ids)), description="sort a string of decimal digits",
    )


# -- a callback: the gradient norm before every optimizer step --------------------------------------------
class GradientNorm(L.Callback):
    """Logs ``train/grad_norm`` (the L2 norm of all gradients, before clipping) at every update."""

    def __init__(self, norm_type: float = 2.0) -> None:
        self.norm_type = norm_type

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        grads = [p.grad.detach() for p in pl_module.parameters() if p.grad is not None]
        if grads:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, self.norm_type) for g in grads]),
                                            self.norm_type)
            pl_module.log("train/grad_norm", norm, on_step=True, on_epoch=False)
