"""What a sweep of ``attnlab-train`` (``-m``, Optuna's sweeper included) needs beyond its jobs: the value a job
hands its sweeper, the line that resumes a stopped sweep, and the failed records a sweep left behind. Torch-free.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from attnlab.results.record import RECORD_FILENAME


def optimized_value(record: dict, metric: str | None) -> float | None:
    """The record's ``metric``: its final value, else its best (a metric only tracked as best); None when no metric
    is asked. A metric the run did not log stops the sweep with the metrics it has (one line)."""
    if not metric:
        return None
    metrics = record.get("metrics") or {}
    for part in ("final", "best"):
        value = (metrics.get(part) or {}).get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    have = sorted({*(metrics.get("final") or {}), *(metrics.get("best") or {})})
    raise SystemExit(f"attnlab-train: error: optimized_metric={metric} is not a metric of the run; it has "
                     f"{', '.join(have) or 'none'}")


def sweep_resume_hint(hc: Any, multirun: bool) -> str:
    """Inside a ``-m`` sweep, what "rerun the same command" needs: the sweep's folder. Hydra names a new one per
    start (multirun/<date>/<time>), so the command as typed would start the sweep over in a fresh folder."""
    if not multirun:
        return ""
    sweep_dir = shlex.quote(f"hydra.sweep.dir={hc.sweep.dir}")
    return f"; this is a sweep: rerun it with {sweep_dir} added to resume it (as typed, it starts a new sweep folder)"


def failed_sweep_records(argv: list[str], since: float) -> dict[str, str]:
    """{run folder: error} of the failed records written since ``since`` under the sweep's ``hydra.sweep.dir``
    (jobs of other launchers, joblib or SLURM, are known only by these)."""
    given = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.sweep.dir=")]
    if not given:
        return {}
    failed = {}
    for path in Path(given[-1].strip("'\"")).rglob(RECORD_FILENAME):
        try:
            if path.stat().st_mtime < since:
                continue
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("status") == "failed":
            failed[str(path.parent)] = str(record.get("error"))
    return failed
