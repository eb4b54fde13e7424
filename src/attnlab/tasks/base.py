"""The task contract: what a task family hands to training, and the error its loaders raise."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset

from attnlab.errors import UserError


class DataError(UserError, ValueError):
    """Missing, corrupt or unreachable data; the message is one line that says how to fix it."""


@dataclass
class TaskData:
    """What a task hands to training: datasets per split, how to batch them and how to score them.

    kind: ``seq2seq`` (src -> tgt), ``lm`` (next token), ``classification``, ``regression`` (one output, MSE) or
        ``mlm`` (masked tokens of the input; the training module of each is ``training.modules.MODULES``).
    eval_splits: evaluation splits after training, as {metric prefix: split name}; the first is ``test``.
    metric_flavours: how each reported metric is computed (e.g. greedy decoding, perplexity unit).
    """

    kind: str
    datasets: dict[str, Dataset]
    collate: Callable[[list[Any]], dict[str, torch.Tensor]]
    vocab_size: int
    pad_id: int
    max_len: int
    bos_id: int = 1
    eos_id: int = 2
    src_vocab_size: int | None = None
    num_classes: int | None = None
    eval_splits: dict[str, str] = field(default_factory=lambda: {"test": "test"})
    metric_flavours: dict[str, str] = field(default_factory=dict)
    train_lengths: list[int] = field(default_factory=list)
    detokenize: Callable[[list[int]], str] | None = None
    description: str = ""
    # Whole-split metrics: ``score_text(outputs, references) -> {metric: value}``. For seq2seq the outputs
    # are detokenized hypotheses and ``references[split]`` the raw reference strings (BLEU, ROUGE, ...);
    # for classification they are predicted labels against gold labels (MCC, F1, bAbI failed tasks, ...).
    # Batches then carry ``ref_index`` (the example's position in its split), so references never pass
    # through the tokenizer (no <unk> in references).
    score_text: Callable[[list[Any], list[Any]], dict[str, float]] | None = None
    references: dict[str, list[Any]] = field(default_factory=dict)
    # The raw source text of each evaluation example (text tasks), written beside the decoded outputs; where
    # absent, the outputs file shows the detokenized source ids.
    sources: dict[str, list[str]] = field(default_factory=dict)
