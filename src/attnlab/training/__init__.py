"""Training floor: Lightning modules per task family, callbacks, schedules, config checks and ``run``.

The names below load on first use, so a light submodule (``training.scale``, ``training.config``) can be
imported without torch and Lightning.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"ConfigError": "config", "validate": "config", "build_datamodule": "run", "build_module": "run",
         "derive_batching": "run", "run": "run"}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'attnlab.training' has no attribute {name!r}")
    return getattr(importlib.import_module(f"attnlab.training.{_LAZY[name]}"), name)
