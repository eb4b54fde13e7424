"""CSV logs (``csv/metrics.csv``) that a resumed run appends to, where Lightning's CSV logger would start over."""

from __future__ import annotations

import csv
import os
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer deletes ``metrics.csv`` when a new logger opens the folder; this one keeps it,
    drops the rows logged after the checkpoint being resumed (they will be logged again), and appends."""

    def __init__(self, log_dir: str, keep_through_step: int | None) -> None:
        self._keep_through_step = keep_through_step
        self._kept: set[tuple[float, str]] = set()  # (step, metric) already in the kept rows
        super().__init__(log_dir)
        path = Path(self.metrics_file_path)
        if not path.is_file():
            return
        if keep_through_step is None:  # a fresh run in a reused folder starts a fresh file
            path.unlink()
            return
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            keys = list(reader.fieldnames or [])
            rows = [r for r in reader if _step(r) <= keep_through_step]
        self._kept = {(_step(r), key) for r in rows for key, value in r.items() if value and key != "step"}
        self.metrics_keys = sorted(keys)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, path)

    def log_metrics(self, metrics_dict: dict[str, float], step: int | None = None) -> None:
        # A resumed run logs what it logs at start-up (parameter counts) again; those values are already here.
        # What is new at a kept step is written: the test metrics of a run killed after its last checkpoint
        # (resumed at the final step, it goes straight to testing).
        if self._keep_through_step is not None and step is not None and step <= self._keep_through_step:
            new = {k: v for k, v in metrics_dict.items() if (float(step), k) not in self._kept and k != "epoch"}
            if not new:
                return
            metrics_dict = {**new, **({"epoch": metrics_dict["epoch"]} if "epoch" in metrics_dict else {})}
        super().log_metrics(metrics_dict, step)

    def _check_log_dir_exists(self) -> None:
        pass  # the base class deletes metrics.csv here; __init__ decides what to keep


def _step(row: dict[str, str]) -> float:
    try:
        return float(row.get("step") or 0)
    except ValueError:
        return 0.0


class ResumableCSVLogger(CSVLogger):
    """CSVLogger that appends to the run's ``metrics.csv`` on resume instead of replacing it."""

    def __init__(self, *args, keep_through_step: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._keep_through_step = keep_through_step

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(self.log_dir, self._keep_through_step)
        return self._experiment
