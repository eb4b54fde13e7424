"""Tasks: data (generated, local files or hub), tokenization, batching and the metrics each task reports.

Plain PyTorch only; ``training`` wraps a task into a LightningDataModule.
"""

from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.build import build_task
from attnlab.tasks.registry import register_task_family

__all__ = ["DataError", "TaskData", "build_task", "register_task_family"]
