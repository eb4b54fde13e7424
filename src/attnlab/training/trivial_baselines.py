"""The trivial baselines behind the published runs of every table: each run's task configuration read from its
folder, the named baseline of :mod:`attnlab.tasks.trivial` computed once per task configuration and seed, and the
files of :mod:`attnlab.results.baselines` written or checked. ``attnlab-baselines`` (``cli/baselines.py``) is the
command over it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from attnlab.errors import SpecError, TableError
from attnlab.results.baselines import TableBaselines, baselines_document, baselines_file
from attnlab.results.build import build_table, matches
from attnlab.results.loading import Loaded, load_records
from attnlab.results.paper import load_paper_tables
from attnlab.results.record import RESOLVED_CONFIG, atomic_write_text
from attnlab.results.spec import TableSpec, list_specs, load_spec

log = logging.getLogger("attnlab.baselines")

# Keys of a task config that say where things are on this machine, not what the task is.
_MACHINE_KEYS = ("data_root", "tokenizer_cache")


def run_task_config(run_dir: Path, data_root: str) -> tuple[dict[str, Any], int]:
    """The resolved ``task`` section and the seed of a published run, its data read from ``data_root``."""
    from omegaconf import OmegaConf

    path = run_dir / RESOLVED_CONFIG
    if not path.is_file():
        raise TableError(f"{run_dir}: no .hydra/config.yaml (the config that ran); a published run keeps it")
    cfg = OmegaConf.load(path)
    cfg.paths.data_root = data_root
    return OmegaConf.to_container(cfg.task, resolve=True), int(cfg.seed)


def task_key(name: str, task: dict[str, Any], seed: int) -> str:
    what = {k: v for k, v in task.items() if k not in _MACHINE_KEYS}
    text = json.dumps({"baseline": name, "task": what, "seed": seed}, sort_keys=True, default=str)
    return f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _made_by() -> str:
    from attnlab.training.record_writers import git_state

    state = git_state()
    commit = (state["commit"] or "unknown")[:12] + ("+dirty" if state["dirty"] else "")
    return f"attnlab-baselines at {commit}"


def table_baselines(spec: TableSpec, records, papers, data_root: str, cache: dict[str, dict[str, Any]],
                    configs: dict[Path, tuple[dict[str, Any], int]]) -> tuple[dict, dict]:
    """(entries, runs) of one table: every completed run behind a column with a named trivial baseline.

    ``cache`` (task key -> computed baseline) and ``configs`` (run folder -> task config and seed) are shared
    across tables, so a task config is computed once and a run's config read once."""
    from attnlab.tasks.trivial import compute_baseline

    built = build_table(spec, records, papers)
    entries: dict[str, dict[str, Any]] = {}
    runs: dict[str, str] = {}
    for m in spec.metrics:
        if m.trivial is None or m.trivial.baseline is None:
            continue
        for row in built.rows:
            for rec in row.used:
                if not matches(rec.data, m.match):
                    continue
                if rec.path.parent not in configs:
                    configs[rec.path.parent] = run_task_config(rec.path.parent, data_root)
                task, seed = configs[rec.path.parent]
                key = task_key(m.trivial.baseline, task, seed)
                if key not in cache:
                    log.info("%s: %s for %s seed %d", spec.name, m.trivial.baseline, task.get("name"), seed)
                    got = compute_baseline(m.trivial.baseline, task, seed)
                    cache[key] = {"name": got.name, "what": got.what, "task": task.get("name"), "seed": seed,
                                  "values": {k: round(float(v), 6) for k, v in sorted(got.values.items())},
                                  "inputs": got.inputs}
                previous = runs.setdefault(str(rec.data.get("config_hash")), key)
                if previous != key:
                    raise SpecError(f"{spec.path or spec.name}: run {rec.path.parent} is behind columns with two "
                                    f"different trivial baselines ({previous}, {key}); give one baseline per task")
                entries[key] = cache[key]
    return entries, runs


def _previous(path: Path) -> dict | None:
    """The baselines file already at ``path``, or None when there is none or it cannot be read (cut by a kill,
    edited into something else): rewriting it is what this command is for."""
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # ValueError: not UTF-8 or not JSON
        return None
    return old if isinstance(old, dict) else None


def write_baselines(experiments_dir: Path, runs_root: Path, out: Path, data_root: str, tables: list[str] | None,
                    check: bool = False) -> list[str]:
    """Compute and write (or, with ``check``, compare) the baselines files; returns the files written or stale."""
    specs = [load_spec(name, experiments_dir) for name in (tables or list_specs(experiments_dir))]
    specs = [s for s in specs if any(m.trivial is not None for m in s.metrics)]
    records, _ = load_records([runs_root], skip_corrupt=True)
    papers = load_paper_tables(None)
    cache: dict[str, dict[str, Any]] = {}
    configs: dict[Path, tuple[dict[str, Any], int]] = {}
    made_by = _made_by()
    changed = []
    for spec in specs:
        entries, runs = table_baselines(spec, records, papers, data_root, cache, configs)
        path = baselines_file(out, spec.name)
        old = _previous(path)
        if old is not None and old.get("baselines") == entries and old.get("runs") == runs:
            continue  # same numbers: keep the file (and the commit it names)
        changed.append(str(path))
        if not check:
            atomic_write_text(path, baselines_document(spec.name, entries, runs, made_by))
    return changed


def adhoc_baseline(records: list[Loaded], data_root: str | None) -> tuple[str, TableBaselines] | None:
    """(baseline name, its values per run) where one trivial baseline applies to the runs' task loader; None
    where none applies or the runs mix task loaders."""
    from attnlab.tasks.trivial import BASELINES, compute_baseline
    from attnlab.training.trivial_baselines import run_task_config, task_key

    root = data_root or str(Path("data"))
    configs = {}
    for record in records:
        try:
            configs[record.path] = run_task_config(record.path.parent, root)
        except (TableError, OSError):
            return None  # a run without its saved config (a wandb record): no task to compute from
    loaders = {task.get("loader") for task, _ in configs.values()}
    names = [n for n, entry in BASELINES.items() if loaders and loaders <= set(entry.loaders)]
    if len(loaders) != 1 or not names:
        return None
    name = sorted(names)[0]
    entries: dict[str, dict[str, Any]] = {}
    runs: dict[str, str] = {}
    for record in records:
        task, seed = configs[record.path]
        key = task_key(name, task, seed)
        if key not in entries:
            got = compute_baseline(name, task, seed)
            entries[key] = {"name": got.name, "what": got.what, "task": task.get("name"), "seed": seed,
                            "values": {k: float(v) for k, v in got.values.items()}, "inputs": got.inputs}
        runs[str(record.data.get("config_hash"))] = key
    return name, TableBaselines(Path("(computed here)"), entries, runs)
