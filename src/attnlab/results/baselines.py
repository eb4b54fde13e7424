"""The trivial baselines behind a table's runs: ``results/baselines/<paper>/<table>.json``.

``attnlab-baselines`` (``make baselines``) computes, for every run behind a table column that names a trivial
baseline (``trivial:`` in the spec), that baseline from the run's own task configuration and the local data
(:mod:`attnlab.tasks.trivial`) and writes one file per table. The file maps each run's ``config_hash`` to the
baseline of its task, so the tables (and CI, which has no data) read the numbers without recomputing them, and a
run whose task the file does not know shows "not computed" instead of borrowing another run's baseline.

File format::

    {"table": "ut/table1_joint1k", "made_by": "attnlab-baselines at <git commit>",
     "baselines": {"<task key>": {"name": "story_free_answer", "what": "...", "task": "qa/babi", "seed": 1,
                                  "values": {"test/mean_error": 65.7, ...}, "inputs": ["en/qa1_..."]}},
     "runs": {"<config_hash of a run record>": "<task key>"}}
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.errors import TableError

BASELINES_FOLDER = "baselines"  # beside results/runs


@dataclass
class TableBaselines:
    path: Path
    entries: dict[str, dict[str, Any]]  # task key -> one computed baseline
    runs: dict[str, str]  # a run record's config_hash -> task key

    def entry(self, record: Mapping[str, Any]) -> dict[str, Any] | None:
        key = self.runs.get(str(record.get("config_hash")))
        return None if key is None else self.entries.get(key)

    def value(self, record: Mapping[str, Any], metric: str) -> float | None:
        """The baseline of ``record``'s task on ``metric`` (a metric name as in the record), in record units."""
        entry = self.entry(record)
        value = None if entry is None else entry["values"].get(metric)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def baselines_file(root: str | os.PathLike, table: str) -> Path:
    return Path(root) / f"{table}.json"


def load_table_baselines(root: str | os.PathLike | None, table: str) -> TableBaselines | None:
    """The table's baselines file; None when there is none (its cells then read "not computed")."""
    if root is None:
        return None
    path = baselines_file(root, table)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TableError(f"{path}: not a readable baselines file ({exc}); rebuild it with make baselines") from exc
    ok = (isinstance(data, dict) and data.get("table") == table and isinstance(data.get("baselines"), dict)
          and isinstance(data.get("runs"), dict)
          and all(isinstance(e, dict) and isinstance(e.get("values"), dict) for e in data["baselines"].values()))
    if not ok:
        raise TableError(f"{path}: not a baselines file of table {table} (needs table, baselines and runs); rebuild "
                         "it with make baselines")
    return TableBaselines(path, data["baselines"], {str(k): str(v) for k, v in data["runs"].items()})


def baselines_document(table: str, entries: Mapping[str, Any], runs: Mapping[str, str], made_by: str) -> str:
    """The file's text: sorted keys, so an unchanged baseline rewrites byte for byte."""
    doc = {"table": table, "made_by": made_by, "baselines": dict(entries), "runs": dict(runs)}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"
