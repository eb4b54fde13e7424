"""The run record (``results.json``): the single source every table is built from.

One JSON object per run, written beside the run's resolved ``.hydra/config.yaml``. The schema is
versioned (``schema_version``); :func:`validate_record` lists every problem of a record rather than
stopping at the first, so a broken writer is fixed in one go. Metric values that are not finite
(NaN, +-inf) are stored as ``null``: strict JSON has no NaN, and a NaN that reached a table as a number
would be averaged silently.

This module imports neither torch nor Lightning: the training floor fills a :class:`RunRecord` (or a
plain dict of the same shape) and calls :func:`write_record`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
RECORD_FILENAME = "results.json"
# running: the process is (or was, if it was killed outright) training; interrupted: it stopped on a signal or
# Ctrl-C after saving, and the same command resumes it.
STATUSES = ("completed", "failed", "running", "interrupted")
UNFINISHED = ("running", "interrupted")
SCALES = ("cpu", "gpu", "paper")


class RecordError(Exception):
    """A run record that cannot be read or is not a valid record; the message is one line."""


# ----------------------------------------------------------------------------------------------------------
# The record as a dataclass (what writers fill); the JSON form is ``RunRecord.to_dict()``.


@dataclass
class ModelInfo:
    name: str
    attention: str
    recurrence: str


@dataclass
class GitInfo:
    commit: str | None  # None outside a git checkout (pip-installed package)
    dirty: bool | None


@dataclass
class HardwareInfo:
    name: str  # the hardware config option, e.g. "cpu", "gpu8"
    accelerator: str  # "cpu", "gpu", ...
    devices: int | str | list[int]  # as Lightning takes it
    num_nodes: int
    precision: str | int  # "32-true", "bf16-mixed", 32


@dataclass
class Metrics:
    final: dict[str, float | None] = field(default_factory=dict)
    best: dict[str, float | None] = field(default_factory=dict)


@dataclass
class ParamCount:
    total: int | None
    trainable: int | None


@dataclass
class Cost:
    wall_s: float | None
    tokens_per_s: float | None
    peak_mem_mb: float | None


@dataclass
class RunRecord:
    status: str
    task: str
    model: ModelInfo
    seed: int
    scale: str
    config_hash: str
    git: GitInfo
    hardware: HardwareInfo
    run_dir: str
    command: str
    created: str
    metrics: Metrics = field(default_factory=Metrics)
    params: ParamCount = field(default_factory=lambda: ParamCount(None, None))
    cost: Cost = field(default_factory=lambda: Cost(None, None, None))
    error: str | None = None
    experiment: str | None = None
    row: str | None = None
    metric_flavours: dict[str, Any] = field(default_factory=dict)
    wandb_run_id: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # free-form additions that tables ignore
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return sanitize_record(dataclasses.asdict(self))


# ----------------------------------------------------------------------------------------------------------
# Validation. The schema is written as data so that the checker and the documentation cannot drift.

_INT = (int,)
_NUM = (int, float)

# key -> (allowed python types, may be null)
_TOP: dict[str, tuple[tuple[type, ...], bool]] = {
    "schema_version": (_INT, False),
    "status": ((str,), False),
    "error": ((str,), True),
    "experiment": ((str,), True),
    "row": ((str,), True),
    "task": ((str,), False),
    "model": ((dict,), False),
    "seed": (_INT, False),
    "scale": ((str,), False),
    "config_hash": ((str,), False),
    "git": ((dict,), False),
    "hardware": ((dict,), False),
    "metrics": ((dict,), False),
    "params": ((dict,), False),
    "cost": ((dict,), False),
    "metric_flavours": ((dict,), False),
    "wandb_run_id": ((str,), True),
    "run_dir": ((str,), False),
    "command": ((str,), False),
    "created": ((str,), False),
    "versions": ((dict,), False),
}
_OPTIONAL_TOP = {"extra": ((dict,), False)}

_NESTED: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "model": {"name": ((str,), False), "attention": ((str,), False), "recurrence": ((str,), False)},
    "git": {"commit": ((str,), True), "dirty": ((bool,), True)},
    "hardware": {
        "name": ((str,), False),
        "accelerator": ((str,), False),
        "devices": ((int, str, list), False),
        "num_nodes": (_INT, False),
        "precision": ((str, int), False),
    },
    "metrics": {"final": ((dict,), False), "best": ((dict,), False)},
    "params": {"total": (_INT, True), "trainable": (_INT, True)},
    "cost": {"wall_s": (_NUM, True), "tokens_per_s": (_NUM, True), "peak_mem_mb": (_NUM, True)},
}


def _type_ok(value: Any, types: tuple[type, ...], nullable: bool) -> bool:
    if value is None:
        return nullable
    # bool is an int subclass; a seed or a count of True is a writer bug.
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def _type_name(types: tuple[type, ...], nullable: bool) -> str:
    names = {int: "int", float: "float", str: "string", dict: "object", list: "list", bool: "bool"}
    out = " or ".join(names.get(t, t.__name__) for t in types)
    return out + (" or null" if nullable else "")


# A run can fail before its config is even valid (a misspelled key), so a failed record may leave null
# what it could not know; these stay required because a table cannot show a failure without them.
_REQUIRED_WHEN_FAILED = {"schema_version", "status", "error", "run_dir", "command", "created", "metrics"}


def _check_fields(
    obj: Mapping[str, Any], schema: Mapping, where: str, problems: list[str], lenient: bool = False
) -> None:
    for key, (types, nullable) in schema.items():
        if lenient and key not in _REQUIRED_WHEN_FAILED:
            nullable = True
        if key not in obj:
            if not (lenient and where):  # nested keys of a failed record may be absent
                problems.append(f"missing key {where}{key}")
        elif not _type_ok(obj[key], types, nullable):
            problems.append(
                f"{where}{key} must be {_type_name(types, nullable)}, got {type(obj[key]).__name__}"
            )


def _is_iso_time(text: str) -> bool:
    # Python 3.10's fromisoformat rejects "+0000" offsets (what strftime's %z gives); accept those too.
    for parse in (datetime.fromisoformat, lambda t: datetime.strptime(t, "%Y-%m-%dT%H:%M:%S%z")):
        try:
            parse(text)
            return True
        except ValueError:
            pass
    return False


def validate_record(record: Any) -> list[str]:
    """Every problem of ``record`` against schema version 1, as short phrases; empty when valid."""
    if not isinstance(record, Mapping):
        return [f"a record must be a JSON object, got {type(record).__name__}"]
    problems: list[str] = []
    version = record.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        # A newer writer: its fields may mean other things, so do not guess.
        return [
            f"schema_version {version} is newer than this attnlab reads ({SCHEMA_VERSION}); upgrade attnlab"
        ]
    failed = record.get("status") == "failed"
    _check_fields(record, _TOP, "", problems, lenient=failed)
    if "extra" in record:
        _check_fields(record, _OPTIONAL_TOP, "", problems)
    unknown = sorted(set(record) - set(_TOP) - set(_OPTIONAL_TOP))
    if unknown:
        problems.append(f"unknown key(s) {', '.join(unknown)} (free-form data belongs under 'extra')")
    if version is not None and version != SCHEMA_VERSION and _type_ok(version, _INT, False):
        problems.append(f"schema_version must be {SCHEMA_VERSION}, got {version}")

    for key, schema in _NESTED.items():
        sub = record.get(key)
        if isinstance(sub, Mapping):
            _check_fields(sub, schema, f"{key}.", problems, lenient=failed and key != "metrics")

    status = record.get("status")
    if isinstance(status, str) and status not in STATUSES:
        problems.append(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    error = record.get("error")
    if status == "failed" and not (isinstance(error, str) and error.strip()):
        problems.append("a failed record needs a non-empty 'error'")
    if isinstance(error, str) and ("\n" in error or "\r" in error):
        problems.append("error must be one line")
    scale = record.get("scale")
    if isinstance(scale, str) and scale not in SCALES:
        problems.append(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    chash = record.get("config_hash")
    if isinstance(chash, str) and not (chash and all(c in "0123456789abcdef" for c in chash)):
        problems.append("config_hash must be a lowercase hex digest")
    created = record.get("created")
    if isinstance(created, str) and not _is_iso_time(created):
        problems.append(f"created must be an ISO 8601 time, got {created!r}")

    metrics = record.get("metrics")
    if isinstance(metrics, Mapping):
        for part in ("final", "best"):
            values = metrics.get(part)
            if not isinstance(values, Mapping):
                continue
            for name, value in values.items():
                if value is not None and (isinstance(value, bool) or not isinstance(value, _NUM)):
                    problems.append(f"metrics.{part}.{name} must be a number or null")
                elif isinstance(value, float) and not math.isfinite(value):
                    problems.append(f"metrics.{part}.{name} is {value}; store non-finite values as null")
    params = record.get("params")
    if status == "completed" and isinstance(params, Mapping) and params.get("total") is None:
        problems.append("a completed record needs params.total")
    for key in ("versions", "metric_flavours"):
        sub = record.get(key)
        if isinstance(sub, Mapping) and not all(isinstance(k, str) for k in sub):
            problems.append(f"{key} keys must be strings")
    return problems


# ----------------------------------------------------------------------------------------------------------
# Writing and reading.


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def sanitize_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``record`` with non-finite metric and cost values replaced by None (JSON null)."""
    out = _deepcopy(record)
    metrics = out.get("metrics")
    if isinstance(metrics, dict):
        for part in ("final", "best"):
            if isinstance(metrics.get(part), dict):
                metrics[part] = {k: _finite_or_none(_as_float(v)) for k, v in metrics[part].items()}
    cost = out.get("cost")
    if isinstance(cost, dict):
        out["cost"] = {k: _finite_or_none(v) for k, v in cost.items()}
    return out


def _as_float(value: Any) -> Any:
    # Writers may hand over numpy or tensor scalars; anything with __float__ that is not a bool becomes float.
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _deepcopy(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _deepcopy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_deepcopy(v) for v in obj]
    return obj


def file_mode() -> int:
    """0o666 minus the umask: what open() would give, which mkstemp's private 0o600 does not."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, file_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_files_atomically(files: Mapping[Path, bytes]) -> list[Path]:
    """Write every file to a temp name beside it, then rename all; on any error remove the temps."""
    temps: list[tuple[str, Path]] = []
    mode = file_mode()
    try:
        for path, content in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            temps.append((tmp, path))
            os.chmod(tmp, mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(content)
        for tmp, path in temps:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in temps:
            Path(tmp).unlink(missing_ok=True)
        raise
    return [p for _, p in temps]


def dumps_record(record: RunRecord | Mapping[str, Any]) -> str:
    data = record.to_dict() if isinstance(record, RunRecord) else sanitize_record(record)
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False) + "\n"


def write_record(path: str | os.PathLike, record: RunRecord | Mapping[str, Any]) -> dict[str, Any]:
    """Validate ``record`` and write it atomically to ``path``; returns the dict written.

    ``path`` may be the run folder or the ``results.json`` path itself. An invalid record raises
    :class:`RecordError` and writes nothing, so a table never meets a record its writer knew was wrong.
    """
    path = Path(path)
    if path.is_dir() or path.suffix != ".json":
        path = path / RECORD_FILENAME
    data = record.to_dict() if isinstance(record, RunRecord) else sanitize_record(record)
    problems = validate_record(data)
    if problems:
        raise RecordError(f"{path}: refusing to write an invalid run record: {'; '.join(problems)}")
    atomic_write_text(path, dumps_record(data))
    return data


def load_json(path: str | os.PathLike) -> Any:
    """Parse ``path`` as JSON; RecordError (one line, naming the file) when unreadable or not JSON."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecordError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise RecordError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    if not text.strip():
        raise RecordError(f"{path}: empty file (the run was interrupted before its record was written?)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from exc
    except RecursionError as exc:  # a run record is a few levels deep; thousands of brackets are damage
        raise RecordError(f"{path}: nested too deeply to be a run record") from exc


def read_record(path: str | os.PathLike) -> dict[str, Any]:
    """Read and validate one run record; raises RecordError with a one-line message naming the file."""
    data = load_json(path)
    problems = validate_record(data)
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise RecordError(f"{path}: not a valid run record (schema {SCHEMA_VERSION}): {shown}")
    return data


def find_records(roots: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Every ``results.json`` under the given folder(s), file(s) or glob pattern(s), sorted, no duplicates.

    A root that does not exist yields nothing (the caller decides whether that is an error).
    """
    if isinstance(roots, (str, os.PathLike)):
        roots = [roots]
    found: set[Path] = set()
    for root in roots:
        text = os.fspath(root)
        matches = glob.glob(text, recursive=True) if glob.has_magic(text) else [text]
        for match in matches:
            p = Path(match)
            if p.is_file():
                found.add(p)
            elif p.is_dir():
                found.update(q for q in p.rglob(RECORD_FILENAME) if q.is_file())
    return sorted(found)


# ----------------------------------------------------------------------------------------------------------
# Config hash.

# Config keys that do not change what a run computes, so two runs differing only in them share a hash
# (and ``make reproduce-*`` can skip a row whose record exists). Each entry is an fnmatch pattern over the
# dotted key path; it drops a key whose path matches it or ends in ``.<entry>`` (so ``logger`` drops
# ``logger`` at any depth), with everything below. Seed, hardware (precision), debug and every model,
# task, optimiser and data-size knob stay in: they change the numbers.
DEFAULT_HASH_EXCLUDE: tuple[str, ...] = (
    "hydra",  # Hydra's runtime: output dirs, job name, launcher, overrides as typed
    "paths",  # data root, output and log dirs, caches
    "logger",  # where metrics go (csv / wandb / tensorboard), not what they are
    "wandb",  # wandb entity, project, mode, tags
    "*_dir",  # output_dir, log_dir, data_dir, cache_dir, save_dir, default_root_dir ...
    "*_root",  # data_root
    "dirpath",  # checkpoint folder (ModelCheckpoint)
    "ckpt_path",  # resuming the same run reproduces it; where the checkpoint lives is not a knob
    "*progress_bar*",  # enable_progress_bar, progress bar callbacks and their refresh rate
    "enable_model_summary",
    "log_every_n_steps",  # logging cadence
    "num_workers",  # dataloader processes; batches are the same
    "torch_threads",  # intra-op threads: how fast, not what is computed
    "print_config",
    "resume",  # whether to pick up a checkpoint: a resumed run is the same run
    "record_attention*",  # what the run also writes (attention-weight captures), not what it trains
    "plugins",  # modules imported for their registrations; what they register is in the config itself
)


def is_excluded(path: str, patterns: Iterable[str]) -> bool:
    """Whether the dotted config ``path`` is left out of the hash by ``patterns``."""
    return any(fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(path, "*." + p) for p in patterns)


def _strip(obj: Any, patterns: tuple[str, ...], prefix: str) -> Any:
    if isinstance(obj, Mapping):
        out = {}
        for key, value in obj.items():
            path = f"{prefix}{key}"
            if not is_excluded(path, patterns):
                out[str(key)] = _strip(value, patterns, path + ".")
        return out
    if isinstance(obj, (list, tuple)):
        return [_strip(v, patterns, prefix) for v in obj]
    return obj


def config_hash(config: Mapping[str, Any], exclude: Iterable[str] = DEFAULT_HASH_EXCLUDE) -> str:
    """sha256 of the canonical JSON of a plain (resolved) config dict minus the ``exclude`` keys.

    Canonical: keys sorted, no whitespace, UTF-8; so key order and formatting never change the hash.
    """
    stripped = _strip(config, tuple(exclude), "")
    text = json.dumps(stripped, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
