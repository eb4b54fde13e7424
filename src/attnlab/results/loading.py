"""Reading run records for tables: every valid record under the given roots, corrupt ones set apart."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.errors import TableError
from attnlab.results.configs import header_disagreement, seedless_config
from attnlab.results.record import RecordError, find_records, load_json, validate_record


@dataclass
class Loaded:
    path: Path
    data: dict[str, Any]
    _config: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def config(self) -> dict[str, Any]:
        """The run's configuration apart from the seed (read once; see :mod:`attnlab.results.configs`)."""
        if self._config is None:
            self._config = seedless_config(self.path if self.path.is_file() else None, self.data)
        return self._config


@dataclass
class Corrupt:
    path: Path
    message: str  # one line, names the file
    data: dict[str, Any] | None  # parsed JSON when it parsed (so it can still land in its row)


def corrupt_hint(message: str) -> str:
    return (
        f"corrupt run record: {message}. Fix: re-run that job, delete the file, "
        "or pass skip_corrupt=true to show it as a corrupt cell"
    )


def load_records(roots: Iterable[str | os.PathLike], skip_corrupt: bool = False) -> tuple[list[Loaded], list[Corrupt]]:
    """Read every record under ``roots``. A corrupt one raises TableError unless ``skip_corrupt``."""
    loaded: list[Loaded] = []
    corrupt: list[Corrupt] = []
    for path in find_records(list(roots)):
        try:
            data = load_json(path)
        except RecordError as exc:
            if not skip_corrupt:
                raise TableError(corrupt_hint(str(exc))) from exc
            corrupt.append(Corrupt(path, str(exc), None))
            continue
        problems = validate_record(data)
        disagreement = None if problems else header_disagreement(path, data)
        if problems or disagreement:
            msg = disagreement or f"{path}: not a valid run record: {'; '.join(problems[:3])}"
            if not skip_corrupt:
                raise TableError(corrupt_hint(msg))
            corrupt.append(Corrupt(path, msg, data if isinstance(data, dict) else None))
            continue
        loaded.append(Loaded(path, data))
    return loaded, corrupt
