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


_SCHEMAS = {"algorithmic": AlgorithmicTask, "listops": ListOpsTask, "text_lm": TextLMTask}


def task_schema(loader: str) -> type:
    if loader not in _SCHEMAS:
        raise DataError(f"task.loader={loader!r}; valid: {', '.join(sorted(_SCHEMAS))}")
    return _SCHEMAS[loader]
