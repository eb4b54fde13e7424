"""Where task data comes from: local files under a data root, or the Hugging Face hub by id.

Our machines (and many clusters) have no internet: hub loading is attempted only when asked for, fails
within seconds offline, and its error names the local alternative.
"""

from __future__ import annotations

import gzip
import os
import socket
from pathlib import Path

from attnlab.tasks.base import DataError


def resolve_data_root(root: str | os.PathLike) -> Path:
    path = Path(os.path.expanduser(str(root)))
    return path if path.is_absolute() else Path.cwd() / path


def find_file(root: Path, relative: str) -> Path:
    """``relative`` or its ``.gz`` twin under ``root``; a clear error when neither exists."""
    for candidate in (root / relative, root / f"{relative}.gz"):
        if candidate.is_file():
            return candidate
    raise DataError(
        f"data file {relative}[.gz] not found under {root}; set paths.data_root (or ATTNLAB_DATA_ROOT) "
        f"to the folder that holds it, or use task.source=hub with network access"
    )


def read_lines(path: Path) -> list[str]:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return f.read().splitlines()
        return path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise DataError(f"cannot read data file {path}: {exc.__class__.__name__}: {exc}") from None


def hub_reachable(timeout: float = 3.0) -> bool:
    """True when huggingface.co answers; respects the offline switches users already set."""
    if os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1":
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_hub_dataset(hub_id: str, config: str | None, *, local_hint: str):
    """``datasets.load_dataset(hub_id, config)``, failing fast and clearly when the hub is unreachable."""
    if not hub_reachable():
        raise DataError(
            f"hub dataset {hub_id}{'/' + config if config else ''} is unreachable (offline); {local_hint}"
        )
    import datasets

    return datasets.load_dataset(hub_id, config)
