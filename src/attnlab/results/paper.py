"""Published numbers: ``experiments/paper_tables.yaml`` (papers -> tables -> metrics / rows).

The YAML stores ``null`` for a number nobody could find; it is shown as "n/a" and never replaced by a
guess. Each table carries a ``confidence`` (double-checked / single-source / uncertain) and may carry
``cell_confidence`` and ``conflicts`` notes, which tables print as footnotes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.errors import UserError
from attnlab.results.safe_yaml import UnsafeYamlError, load_yaml

ENV_VAR = "ATTNLAB_PAPER_TABLES"
FILENAME = "paper_tables.yaml"
CONFIDENCE_LEVELS = ("double-checked", "single-source", "uncertain")
NOT_FOUND = "n/a (paper_tables.yaml not found)"


class PaperTablesError(UserError):
    """paper_tables.yaml exists but is not usable, or a spec names a table or row it lacks."""


def repo_root() -> Path | None:
    """The source checkout this package runs from (editable install), or None for a wheel install."""
    # src/attnlab/results/paper.py -> parents[3] is the checkout root when installed from source.
    root = Path(__file__).resolve().parents[3]
    return root if (root / "pyproject.toml").is_file() else None


def default_experiments_dir() -> Path:
    """The repo's ``experiments/`` folder: beside the package's checkout, else under the working dir, else
    the copy a wheel ships as package data (``attnlab/experiments``)."""
    root = repo_root()
    if root is not None and (root / "experiments").is_dir():
        return root / "experiments"
    here = Path.cwd() / "experiments"
    packaged = Path(__file__).resolve().parents[1] / "experiments"
    return packaged if not here.is_dir() and packaged.is_dir() else here


def locate_paper_tables(experiments_dir: str | os.PathLike | None = None) -> Path | None:
    """Where paper_tables.yaml is: ``$ATTNLAB_PAPER_TABLES``, else the experiments folder; None if absent."""
    env = os.environ.get(ENV_VAR)
    if env:
        # An explicit path that is missing is reported as missing, not silently swapped for another copy.
        return Path(env) if Path(env).is_file() else None
    candidates = []
    if experiments_dir is not None:
        candidates.append(Path(experiments_dir) / FILENAME)
    candidates += [default_experiments_dir() / FILENAME, Path.cwd() / "experiments" / FILENAME]
    return next((c for c in candidates if c.is_file()), None)


def _confidence_level(text: Any) -> str | None:
    if not isinstance(text, str):
        return None
    return next((lvl for lvl in CONFIDENCE_LEVELS if text.strip().startswith(lvl)), None)


@dataclass
class PaperTable:
    paper: str
    key: str
    title: str
    metrics: dict[str, dict[str, Any]]
    rows: dict[str, dict[str, Any]]
    confidence: str | None
    cell_confidence: dict[str, str] = field(default_factory=dict)
    conflicts: dict[str, str] = field(default_factory=dict)
    citation: str | None = None

    def has_row(self, row: str) -> bool:
        return row in self.rows

    def value(self, row: str, metric: str) -> Any:
        """The published value (number, string such as '67M', or None for not found)."""
        if row not in self.rows:
            raise PaperTablesError(
                f"paper table {self.paper}.{self.key} has no row {row!r} (rows: {', '.join(self.rows)})"
            )
        if metric not in self.metrics and metric not in self.rows[row]:
            raise PaperTablesError(
                f"paper table {self.paper}.{self.key} has no metric {metric!r} "
                f"(metrics: {', '.join(self.metrics)})"
            )
        return self.rows[row].get(metric)

    def cell_confidence_level(self, row: str, metric: str) -> str | None:
        """Confidence of one cell: a ``cell_confidence`` entry keyed ``<row>.<metric>[/<metric>][=value]``
        when one names this exact row label and metric, else the table's confidence."""
        for key, note in self.cell_confidence.items():
            if not key.startswith(row + "."):
                continue
            named = key[len(row) + 1 :].split("=")[0].split(",")[0]
            if metric in (m.strip() for m in named.split("/")):
                level = _confidence_level(note)
                if level:
                    return level
        return self.confidence


@dataclass
class PaperTables:
    path: Path | None
    data: dict[str, Any]

    @property
    def found(self) -> bool:
        return self.path is not None

    def table(self, paper: str, table: str) -> PaperTable:
        papers = {k: v for k, v in self.data.items() if k != "meta" and isinstance(v, dict)}
        if paper not in papers:
            raise PaperTablesError(f"{self.path}: no paper {paper!r} (papers: {', '.join(papers)})")
        tables = papers[paper].get("tables") or {}
        if table not in tables:
            raise PaperTablesError(
                f"{self.path}: paper {paper!r} has no table {table!r} (tables: {', '.join(tables)})"
            )
        t = tables[table]
        source = papers[paper].get("source") or {}
        return PaperTable(
            paper=paper,
            key=table,
            title=str(t.get("title") or f"{paper} {table}"),
            metrics=dict(t.get("metrics") or {}),
            rows={str(k): dict(v or {}) for k, v in (t.get("rows") or {}).items()},
            confidence=_confidence_level(t.get("confidence")),
            cell_confidence={str(k): str(v) for k, v in (t.get("cell_confidence") or {}).items()},
            conflicts={str(k): str(v) for k, v in (t.get("conflicts") or {}).items()},
            citation=source.get("citation"),
        )


def load_paper_tables(path: str | os.PathLike | None = None, experiments_dir=None) -> PaperTables:
    """Load the published numbers; ``PaperTables(path=None)`` when the file is nowhere to be found."""
    resolved = Path(path) if path is not None else locate_paper_tables(experiments_dir)
    if resolved is None or not resolved.is_file():
        return PaperTables(path=None, data={})
    try:
        data = load_yaml(resolved.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, UnsafeYamlError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PaperTablesError(f"{resolved}: cannot load ({first})") from exc
    if not isinstance(data, dict):
        raise PaperTablesError(f"{resolved}: expected a mapping of papers, got {type(data).__name__}")
    return PaperTables(path=resolved, data=data)
