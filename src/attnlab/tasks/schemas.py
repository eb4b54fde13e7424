"""Typed schemas of ``task`` configs, one per loader (checked by ``training.config.validate``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnlab.tasks.base import DataError


@dataclass
class CommonTask:
    name: str
    family: str
    loader: str
    description: str = ""
    paper_metric: Any = None
    decoding: Any = None
    data_seed: Any = None
    at_scale: dict = field(default_factory=dict)


@dataclass
class AlgorithmicTask(CommonTask):
    op: str = "copy"
    base: int = 10
    train_size: int = 0
    val_size: int = 0
    test_size: int = 0
    train_max_len: int = 40
    test_min_len: int = 1
    test_max_len: int = 400


@dataclass
class ListOpsTask(CommonTask):
    train_size: int = 0
    val_size: int = 0
    test_size: int = 0
    min_len: int = 1
    max_len: int = 2000
    max_depth: int = 10
    max_args: int = 10


@dataclass
class TextLMTask(CommonTask):
    source: str = "local"
    data_root: str = "data"
    files: dict = field(default_factory=dict)
    hub_id: Any = None
    hub_config: Any = None
    hub_text_field: str = "text"
    block_len: int = 128
    max_train_tokens: Any = None
    max_val_tokens: Any = None
    max_test_tokens: Any = None
    # Subword option: tokenizer.kind word (default: the corpus' own words) | bpe; with bpe, ppl is per
    # subword and word_ppl = exp(total NLL / words) is reported too.
    tokenizer: dict = field(default_factory=lambda: {"kind": "word"})
    tokenizer_cache: Any = None
    hub_splits: dict = field(default_factory=lambda: {"train": "train", "val": "validation", "test": "test"})
    stand_in: Any = None


@dataclass
class TranslationTask(CommonTask):
    src_lang: str = "en"
    tgt_lang: str = "de"
    data_root: str = "data"
    train: dict = field(default_factory=dict)   # split specs: see tasks/translation.py
    val: dict = field(default_factory=dict)
    test: dict = field(default_factory=dict)
    extra_tests: dict = field(default_factory=dict)
    stand_in: Any = None
    tokenizer: dict = field(default_factory=lambda: {"kind": "bpe", "vocab_size": 8000})
    tokenizer_cache: Any = None
    max_train_pairs: Any = None
    max_eval_pairs: Any = None
    max_src_len: int = 256
    max_tgt_len: int = 256
    sacrebleu_tokenize: str = "13a"
    tokenized_bleu: bool = False
    reference_note: Any = None


_SCHEMAS = {"algorithmic": AlgorithmicTask, "listops": ListOpsTask, "text_lm": TextLMTask,
            "translation": TranslationTask}


def task_schema(loader: str) -> type:
    if loader not in _SCHEMAS:
        raise DataError(f"task.loader={loader!r}; valid: {', '.join(sorted(_SCHEMAS))}")
    return _SCHEMAS[loader]
