"""The task contract and the task-family registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset


class DataError(ValueError):
    """Missing, corrupt or unreachable data; the message is one line that says how to fix it."""


@dataclass
class TaskData:
    """What a task hands to training: datasets per split, how to batch them and how to score them.

    kind: ``seq2seq`` (src -> tgt), ``lm`` (next token), ``classification`` or ``regression`` (one output, MSE).
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


_FAMILIES: dict[str, Callable[[dict[str, Any], int], TaskData]] = {}


def register_task_family(loader: str, *, schema: type | None = None):
    """Register a function ``(task_cfg: dict, seed: int) -> TaskData`` under ``task.loader``; a loader
    outside attnlab passes ``schema``, the dataclass of its task config (a subclass of
    ``tasks.schemas.CommonTask``), which the config check and the loader's defaults then use."""

    def wrap(fn):
        if loader in _FAMILIES:
            raise ValueError(f"task loader {loader!r} registered twice")
        if schema is not None:
            from attnlab.tasks.schemas import register_schema

            register_schema(loader, schema)
        _FAMILIES[loader] = fn
        return fn

    return wrap


def _load_families() -> None:
    from attnlab.tasks import (  # noqa: F401  (register)
        algorithmic,
        babi,
        dialogue,
        glue,
        lambada,
        listops,
        lra_bytes,
        lte,
        masked_lm,
        probes,
        span_corruption,
        summarization,
        sva,
        text_lm,
        text_to_text,
        translation,
        translation_mixture,
    )


def build_task(task_cfg: dict[str, Any], seed: int) -> TaskData:
    _load_families()
    loader = task_cfg["loader"]
    if loader not in _FAMILIES:
        raise DataError(f"unknown task loader {loader!r}; valid: {', '.join(sorted(_FAMILIES))}")
    from attnlab.tasks.schemas import with_defaults

    return _FAMILIES[loader](with_defaults(task_cfg), seed)
