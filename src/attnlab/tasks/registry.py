"""The registry of task families: ``task.loader`` -> a function ``(task_cfg: dict, seed: int) -> TaskData``.

Each family module registers itself with ``@register_task_family``; ``tasks/families.py`` imports the built-in
ones, and ``build_task`` (``tasks/build.py``) builds a task of any registered family. What a family declares to the
floors above (its config keys, their defaults, the model it trains) is its schema, kept apart in
``tasks.schemas`` so the config check reads it without importing the families' libraries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnlab.registry import Registry
from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.schemas import register_schema

TaskFamily = Callable[[dict[str, Any], int], TaskData]

TASK_FAMILIES: Registry[TaskFamily] = Registry("task loader", DataError)


def register_task_family(loader: str, *, schema: type | None = None):
    """Register a function ``(task_cfg: dict, seed: int) -> TaskData`` under ``task.loader``; a loader
    outside attnlab passes ``schema``, the dataclass of its task config (a subclass of
    ``tasks.schemas.CommonTask``), which the config check and the loader's defaults then use."""

    def wrap(fn: TaskFamily) -> TaskFamily:
        if schema is not None:
            register_schema(loader, schema)  # first: a schema that is refused leaves no family without one
        TASK_FAMILIES.register(loader, fn)
        return fn

    return wrap
