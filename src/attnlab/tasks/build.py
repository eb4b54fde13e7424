"""``build_task``: a task's data from its config, by the family registered under ``task.loader``."""

from __future__ import annotations

from typing import Any

from attnlab.tasks.base import TaskData
from attnlab.tasks.registry import TASK_FAMILIES
from attnlab.tasks.schemas import with_defaults


def build_task(task_cfg: dict[str, Any], seed: int) -> TaskData:
    import attnlab.tasks.families  # noqa: F401 - registers the built-in families (here, not at import: see there)

    return TASK_FAMILIES.get(task_cfg["loader"])(with_defaults(task_cfg), seed)
