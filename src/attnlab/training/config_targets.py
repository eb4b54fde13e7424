"""The loggers and callbacks a config file adds by naming their class with ``_target_`` (docs/extending.md), built
with the arguments written beside it; ``loggers.py`` and ``callbacks.py`` append them to the built-in ones.
"""

from __future__ import annotations

import inspect
from typing import Any

from hydra.utils import get_object, instantiate
from omegaconf import DictConfig

from attnlab.errors import ConfigError


def instantiate_own(section: DictConfig, path: str, **defaults: Any) -> list:
    """The entries of ``section`` that name their own class with ``_target_`` (a logger or callback added
    by a config file, docs/extending.md), instantiated with the arguments written beside it; each of
    ``defaults`` (a logger's ``save_dir``: the run folder) is passed where the class takes it and the
    config leaves it out."""
    built = []
    for key, node in section.items_ex(resolve=False):
        if isinstance(node, DictConfig) and "_target_" in node:
            try:
                params = inspect.signature(get_object(node._target_)).parameters
                extra = {k: v for k, v in defaults.items() if k in params and k not in node}
                built.append(instantiate(node, **extra))
            except Exception as exc:  # noqa: BLE001 - whatever the user's class raises, one line names it
                cause = exc.__cause__ or exc
                raise ConfigError(f"{path}.{key}: cannot build {node._target_}: {one_line_of(cause)}") from exc
    return built


def one_line_of(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{exc.__class__.__name__}: {lines[0]}" if lines else exc.__class__.__name__
