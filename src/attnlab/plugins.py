"""Your own code in a run without editing attnlab: the root config key ``plugins`` lists Python modules
(``my_package.attention``) or files (``ext/my_extension.py``) imported before the config is checked, so
the attention variants, recurrences and task families they register are valid names, and the
``_target_`` classes that callbacks, loggers, optimizer and schedule configs name can be found.

A module name is looked up as ``python -m`` would (the current folder first, then installed packages); a
file is imported under its stem, so ``_target_: my_extension.GradientNorm`` finds a class of
``ext/my_extension.py``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from attnlab.errors import ConfigError


class PluginError(ConfigError):
    """A plugin that cannot be imported; the message is one line."""


def load_plugins(cfg: Any) -> list[str]:
    """Import every entry of ``cfg.plugins`` (once per process); returns the module names."""
    entries = cfg.get("plugins") if hasattr(cfg, "get") else None
    if not entries:
        return []
    if isinstance(entries, str) or not all(isinstance(e, str) for e in entries):
        raise PluginError(f"plugins={entries!r} must be a list of module names or .py files, e.g. "
                          f"+plugins=[my_extension]")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m`: modules of the folder the run starts from
    return [_load(entry) for entry in entries]


def _load(entry: str) -> str:
    if entry.endswith(".py"):
        path = Path(entry).expanduser().resolve()
        name = path.stem
        if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
            return name
        if not path.is_file():
            raise PluginError(f"plugins: no such file {entry} (relative paths start at {os.getcwd()})")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise PluginError(f"plugins: importing {entry} failed: {exc.__class__.__name__}: {exc}") from exc
        return name
    try:
        importlib.import_module(entry)
    except ImportError as exc:
        raise PluginError(f"plugins: cannot import {entry!r} ({exc}); give a module on the Python path or a "
                          f".py file") from exc
    return entry
