"""The run record (``results.json``): the single source every table is built from.

One JSON object per run, written beside the run's resolved ``.hydra/config.yaml``. The schema is
versioned (``schema_version``); :func:`validate_record` lists every problem of a record rather than
stopping at the first, so a broken writer is fixed in one go. Metric values that are not finite
(NaN, +-inf) are stored as ``null``: strict JSON has no NaN, and a NaN that reached a table as a number
would be averaged silently.

The schema is written once, as the :class:`RunRecord` dataclasses: :func:`validate_record`'s tables and
:func:`record_header`, the one constructor of every record (completed, interrupted, failed, rebuilt from wandb),
are derived from them. The run folder's file names and the config-hash exclusions are here too.

This module imports neither torch nor Lightning: the training floor starts a record with :func:`record_header`,
fills in what it measured and calls :func:`write_record`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import glob
import hashlib
import json
import math
import os
import re
import socket
import tempfile
import time
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import UnionType
from typing import Any

from attnlab.errors import UserError

SCHEMA_VERSION = 1
# running: the process is (or was, if it was killed outright) training; interrupted: it stopped on a signal or
# Ctrl-C after saving, and the same command resumes it.
STATUSES = ("completed", "failed", "running", "interrupted")
UNFINISHED = ("running", "interrupted")
SCALES = ("cpu", "gpu", "paper")

# ----------------------------------------------------------------------------------------------------------
# The run folder's files, named once (paths relative to the run folder).

RECORD_FILENAME = "results.json"  # the run record
HYDRA_DIR = ".hydra"
RESOLVED_CONFIG = Path(HYDRA_DIR) / "config.yaml"  # the config the run trained with (after the scale blocks)
# The composition before the scale blocks (written beside config.yaml since config.yaml holds the scaled
# config): the form every record has, since older runs wrote exactly this as config.yaml.
BEFORE_SCALE_CONFIG = Path(HYDRA_DIR) / "config_before_scale.yaml"
OVERRIDES_FILE = Path(HYDRA_DIR) / "overrides.yaml"  # the command-line overrides, as Hydra wrote them
CHECKPOINTS_DIR = "checkpoints"
OUTPUTS_DIR = "outputs"  # decoded test outputs (training/outputs.py)
PONDER_DIR = "ponder"  # per-position step counts of an adaptive-computation model (training/callbacks.py)
ATTENTION_DIR = "attention"  # attention-weight histograms (training/attention_capture.py)


class RecordError(UserError):
    """A run record that cannot be read or is not a valid record; the message is one line."""


# ----------------------------------------------------------------------------------------------------------
# The schema, written once: the dataclasses below. Their fields and annotations give validate_record's tables
# (key -> allowed JSON types, nullable), their defaults give the parts of a record nothing has measured yet
# (record_header), and a field's metadata says
#   config:         the config key the field repeats (record_header reads it; a table checks it against the
#                   config saved beside the record, results/configs.py);
#   when_failed:    "required": a failed record must still have it (a run can fail before its config is even
#                   valid, so a failed record may leave null what it could not know; a table cannot show a
#                   failure without these);
#   optional:       the key may be absent (its default, ABSENT, leaves it out of the written record).
# No other key is valid, at any depth: a reader's field is declared here. A writer passes the sections it measured
# to record_header as these dataclasses (Cost(...), Extra(...)), so a misspelt field fails where it is written.

_REQUIRED_WHEN_FAILED = {"when_failed": "required"}


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()  # an optional field nothing set: not written


def _from_config(key: str) -> dict[str, str]:
    return {"config": key}


def _optional() -> Any:
    return field(default=ABSENT, metadata={"optional": True})


@dataclass
class ModelInfo:
    name: str = field(metadata=_from_config("model.name"))
    attention: str = field(metadata=_from_config("model.attention.name"))
    recurrence: str = field(metadata=_from_config("model.recurrence.name"))


@dataclass
class GitInfo:
    commit: str | None  # None outside a git checkout (pip-installed package)
    dirty: bool | None


@dataclass
class HardwareInfo:
    name: str = field(metadata=_from_config("hardware.name"))  # the hardware config option, e.g. "cpu", "gpu8"
    accelerator: str = field(metadata=_from_config("hardware.accelerator"))  # "cpu", "gpu", ...
    devices: int | str | list[int] = field(metadata=_from_config("hardware.devices"))  # as Lightning takes it
    num_nodes: int = field(metadata=_from_config("hardware.num_nodes"))
    precision: str | int = field(metadata=_from_config("hardware.precision"))  # "32-true", "bf16-mixed", 32


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
    # What every record has (a record rebuilt from wandb has only these).
    wall_s: float | None  # every segment of a resumed run
    tokens_per_s: float | None
    peak_mem_mb: float | None
    # What attnlab-train measures (training/record_writers.py); older records lack some (cpu_s, segments, ...).
    cpu_s: float | None = _optional()  # CPU seconds of the process: at one torch thread, what the run costs alone
    segments: int | None = _optional()  # how many processes trained it (a resumed run has several)
    torch_threads: int | None = _optional()
    step_s: float | None = _optional()
    steps: int | None = _optional()
    startup_s: float | None = _optional()  # config checks, data, tokenizer, model up to the first training batch
    mfu: float | None = _optional()  # model FLOPs utilisation (callbacks.mfu; training/perf.py)
    flops_per_token: float | None = _optional()
    peak_flops: float | None = _optional()
    peak_source: str | None = _optional()
    steady_tokens_per_s: float | None = _optional()  # past the warm-up (Throughput.steady_state)
    steady_step_s: float | None = _optional()
    steady_steps: int | None = _optional()
    steady_mfu: float | None = _optional()


@dataclass
class AttentionCoverage:  # training/sparsity.py; claims' preconditions read attended_fraction_mean
    attended_fraction_mean: float
    attended_fraction_max: float
    attended_fraction_min: float
    dense_fallback_share: float
    lengths: dict[str, float]  # min, max, mean, examples of the test split's lengths
    block_size: int | None


@dataclass
class Extra:  # what attnlab-train adds beyond the core; every key may be absent (a record rebuilt from wandb)
    debug: str | None = _optional()  # the debug preset (debug_mode): tables leave such runs out
    skipped_batches: int = _optional()  # batches the NaN guard skipped
    attention_coverage: AttentionCoverage = _optional()
    attention_kernels: list[str] = _optional()  # the kernels that served a sparse attention (BigBird's impl)
    test_checkpoint: dict[str, Any] = _optional()  # the weights the test split was scored with
    resumed_from: str = _optional()  # the checkpoint a resumed run started from
    interrupted: dict[str, Any] = _optional()  # Ctrl-C: signal, step, checkpoint, resume_with (and phase)
    preempted: dict[str, Any] = _optional()  # a stop signal: the same keys


@dataclass(kw_only=True)
class RunRecord:
    schema_version: int = field(default=SCHEMA_VERSION, metadata=_REQUIRED_WHEN_FAILED)
    status: str = field(metadata=_REQUIRED_WHEN_FAILED)
    error: str | None = field(default=None, metadata=_REQUIRED_WHEN_FAILED)  # one line; set when failed
    experiment: str | None = field(default=None, metadata=_from_config("experiment_name"))
    row: str | None = field(default=None, metadata=_from_config("row"))
    task: str = field(metadata=_from_config("task.name"))
    model: ModelInfo
    seed: int = field(metadata=_from_config("seed"))
    scale: str = field(metadata=_from_config("scale.name"))
    config_hash: str
    git: GitInfo
    hardware: HardwareInfo
    metrics: Metrics = field(default_factory=Metrics, metadata=_REQUIRED_WHEN_FAILED)
    params: ParamCount = field(default_factory=lambda: ParamCount(None, None))
    cost: Cost = field(default_factory=lambda: Cost(None, None, None))
    metric_flavours: dict[str, Any] = field(default_factory=dict)
    wandb_run_id: str | None = None
    run_dir: str = field(metadata=_REQUIRED_WHEN_FAILED)
    command: str = field(metadata=_REQUIRED_WHEN_FAILED)
    created: str = field(metadata=_REQUIRED_WHEN_FAILED)  # ISO 8601
    versions: dict[str, str | None] = field(default_factory=dict)
    extra: Extra = field(default_factory=Extra, metadata={"optional": True})

    def to_dict(self) -> dict[str, Any]:
        return sanitize_record(plain(self))


def plain(value: Any) -> Any:
    """The JSON form of a schema dataclass (or a value inside one): fields left ABSENT are not written."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if getattr(value, f.name) is not ABSENT}
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


# ----------------------------------------------------------------------------------------------------------
# Validation tables, derived from the dataclasses above: key -> (allowed python types, may be null).

_INT = (int,)
_NUM = (int, float)
FieldTypes = tuple[tuple[type, ...], bool]


def _json_types(hint: Any) -> FieldTypes:
    """The JSON types a field's annotation allows: a float may be written as an int, a dataclass or dict is an
    object, ``X | None`` may be null."""
    options = typing.get_args(hint) if isinstance(hint, UnionType) else (hint,)
    allowed: list[type] = []
    for option in options:
        if option is type(None):
            continue
        origin = typing.get_origin(option) or option
        if dataclasses.is_dataclass(origin) or origin is dict:
            found: tuple[type, ...] = (dict,)
        elif origin is float:
            found = _NUM
        else:
            found = (origin,)
        allowed += [t for t in found if t not in allowed]
    return tuple(allowed), type(None) in options


@functools.cache
def _fields_of(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


@functools.cache
def _schema_of(cls: type) -> tuple[dict[str, FieldTypes], dict[str, FieldTypes]]:
    """(required fields, optional fields) of a schema dataclass, each name -> (JSON types, nullable)."""
    fields = _fields_of(cls)
    return ({f.name: _json_types(hint) for f, hint in fields if not f.metadata.get("optional")},
            {f.name: _json_types(hint) for f, hint in fields if f.metadata.get("optional")})


_TOP, _OPTIONAL_TOP = _schema_of(RunRecord)
# The required fields of each required object (what every record has).
_NESTED: dict[str, dict[str, FieldTypes]] = {
    f.name: _schema_of(hint)[0]
    for f, hint in _fields_of(RunRecord)
    if dataclasses.is_dataclass(hint) and not f.metadata.get("optional")
}
_REQUIRED_WHEN_FAILED_KEYS = frozenset(
    f.name for f in dataclasses.fields(RunRecord) if f.metadata.get("when_failed") == "required"
)

# ----------------------------------------------------------------------------------------------------------
# The header: what every record starts with, whichever writer made it.


def _config_fields(cls: type, prefix: str = "") -> list[tuple[str, str]]:
    out = []
    for f, hint in _fields_of(cls):
        if "config" in f.metadata:
            out.append((prefix + f.name, f.metadata["config"]))
        elif dataclasses.is_dataclass(hint):
            out += _config_fields(hint, f"{prefix}{f.name}.")
    return out


# The record fields that repeat the run's config, as (dotted record field, dotted config key).
HEADER_FROM_CONFIG: tuple[tuple[str, str], ...] = tuple(_config_fields(RunRecord))


def _default(f: dataclasses.Field) -> Any:
    return plain(f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)


def record_header(
    config_value: Callable[[str], Any],
    *,
    status: str,
    config_hash: str | None,
    git: Mapping[str, Any],
    run_dir: str,
    command: str,
    created: str,
    error: str | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """A new run record: the header of the run (status, what ran, where, when) and everything else at the
    schema's empty defaults (no metrics, params, cost, flavours or versions yet), for the writer to fill.

    The one constructor of every record (completed, interrupted, failed, rebuilt from wandb): the fields that
    repeat the config are ``config_value(key)`` for each key of :data:`HEADER_FROM_CONFIG`. ``sections``: what the
    writer measured, by field name (``metrics=Metrics(...)``, ``cost=Cost(...)``, ``extra=Extra(...)``, plain
    values for plain fields), written through :func:`plain`; ``extra`` (optional) is added only when given.
    """
    record: dict[str, Any] = {}
    for f in dataclasses.fields(RunRecord):
        if f.metadata.get("optional"):
            continue
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            record[f.name] = {} if f.name in _NESTED else None  # filled below
        else:
            record[f.name] = _default(f)
    for dotted, key in HEADER_FROM_CONFIG:
        *parents, name = dotted.split(".")
        node = record
        for part in parents:
            node = node[part]
        node[name] = config_value(key)
    record.update(status=status, error=error, config_hash=config_hash, git=dict(git), run_dir=run_dir,
                  command=command, created=created)
    unknown = sorted(set(sections) - set(_TOP) - set(_OPTIONAL_TOP))
    if unknown:
        raise TypeError(f"record_header: no record field(s) {', '.join(unknown)}")
    record.update({name: plain(value) for name, value in sections.items()})
    return record


# ----------------------------------------------------------------------------------------------------------
# Validation.


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


def _check_fields(
    obj: Mapping[str, Any], schema: Mapping, where: str, problems: list[str], lenient: bool = False
) -> None:
    for key, (types, nullable) in schema.items():
        if lenient and key not in _REQUIRED_WHEN_FAILED_KEYS:
            nullable = True
        if key not in obj:
            if not (lenient and where):  # nested keys of a failed record may be absent
                problems.append(f"missing key {where}{key}")
        elif not _type_ok(obj[key], types, nullable):
            problems.append(
                f"{where}{key} must be {_type_name(types, nullable)}, got {type(obj[key]).__name__}"
            )


def _check_object(obj: Mapping[str, Any], cls: type, where: str, problems: list[str], lenient: bool) -> None:
    """An object of the record against its dataclass ``cls``, at any depth: required fields present and typed,
    optional ones typed where present, no other key."""
    required, optional = _schema_of(cls)
    _check_fields(obj, required, where, problems, lenient)
    _check_fields({k: v for k, v in obj.items() if k in optional}, {k: t for k, t in optional.items() if k in obj},
                  where, problems)
    unknown = sorted(set(obj) - set(required) - set(optional))
    if unknown:
        problems.append(f"unknown key(s) {', '.join(where + k for k in unknown)} (a record's fields are "
                        f"results/record.py's {cls.__name__})")
    for f, hint in _fields_of(cls):
        if dataclasses.is_dataclass(hint) and isinstance(obj.get(f.name), Mapping):
            _check_object(obj[f.name], hint, f"{where}{f.name}.", problems, lenient)


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
        problems.append(f"unknown key(s) {', '.join(unknown)} (a record's fields are results/record.py's RunRecord)")
    if version is not None and version != SCHEMA_VERSION and _type_ok(version, _INT, False):
        problems.append(f"schema_version must be {SCHEMA_VERSION}, got {version}")

    for f, hint in _fields_of(RunRecord):
        sub = record.get(f.name)
        if dataclasses.is_dataclass(hint) and isinstance(sub, Mapping):
            _check_object(sub, hint, f"{f.name}.", problems, lenient=failed and f.name != "metrics")

    status = record.get("status")
    if isinstance(status, str) and status not in STATUSES:
        problems.append(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    error = record.get("error")
    if status == "failed" and not (isinstance(error, str) and error.strip()):
        problems.append("a failed record needs a non-empty 'error'")
    if isinstance(error, str) and ("\n" in error or "\r" in error):
        problems.append("error must be one line")
    experiment = record.get("experiment")
    if isinstance(experiment, str) and any(ord(c) < 32 or ord(c) == 127 for c in experiment):
        problems.append(f"experiment must be a preset name, got {experiment!r} (control characters)")
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


# Every atomic writer names its temporary file ``.<name>.<host>-<pid>.<random>.tmp``: the next writer of the same
# file removes those whose process is gone (a kill -9 mid-write), and leaves a live writer's alone.
_HOST = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host"
_TEMP_OF_WRITER = re.compile(r"(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)\.[a-z0-9_]+")
_TEMP_WITHOUT_WRITER = re.compile(r"[a-z0-9_]{8}")  # written before the writer was named: swept when old
_TEMP_WITHOUT_WRITER_AGE_S = 3600.0


def temp_prefix(path: Path) -> str:
    """The name prefix of a temporary file that will be renamed to ``path``; it names this host and process."""
    return f".{path.name}.{_HOST}-{os.getpid()}."


def sweep_stale_temps(path: Path) -> int:
    """Remove the temporary files that killed writers of ``path`` left beside it (the writers' own pattern:
    written on this host by a process that no longer runs, or an unnamed one untouched for an hour); returns how
    many. Such files would otherwise stay for ever (and show in ``git status`` under results/)."""
    head = f".{path.name}."
    removed = 0
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return 0
    for entry in entries:
        if not (entry.name.startswith(head) and entry.name.endswith(".tmp")):
            continue
        rest = entry.name[len(head):-len(".tmp")]
        named = _TEMP_OF_WRITER.fullmatch(rest)
        try:
            if named is not None:
                stale = named["host"] == _HOST and not _process_alive(int(named["pid"]))
            else:
                stale = bool(_TEMP_WITHOUT_WRITER.fullmatch(rest)) and \
                    time.time() - entry.stat(follow_symlinks=False).st_mtime > _TEMP_WITHOUT_WRITER_AGE_S
            if stale and not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.path)
                removed += 1
        except OSError:
            continue  # gone already (another writer swept it), or not ours to remove
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one, never a part (and
    remove what killed writers of ``path`` left, :func:`sweep_stale_temps`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
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
    """Write every file to a temp name beside it, then rename all; on any error remove the temps (and first
    remove what killed writers of these files left, :func:`sweep_stale_temps`)."""
    temps: list[tuple[str, Path]] = []
    mode = file_mode()
    try:
        for path, content in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            sweep_stale_temps(path)
            fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
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
    except ValueError as exc:  # an integer past Python's digit limit (int_max_str_digits): damage, not a number
        raise RecordError(f"{path}: holds a number too long to read ({str(exc).split(':')[0]})") from exc


def read_record(path: str | os.PathLike) -> dict[str, Any]:
    """Read and validate one run record; raises RecordError with a one-line message naming the file."""
    data = load_json(path)
    problems = validate_record(data)
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise RecordError(f"{path}: not a valid run record (schema {SCHEMA_VERSION}): {shown}")
    return data


# The folders the loggers write inside a run folder (training/loggers.py, wandb_run.py). wandb keeps a
# copy of the run's results.json among its files; read as a record it would count the run twice.
LOGGER_FOLDERS = frozenset({"wandb", "csv", "tensorboard"})


def _in_logger_folder(path: Path, root: Path) -> bool:
    try:
        below = path.parent.relative_to(root).parts
    except ValueError:
        return False
    return any(part in LOGGER_FOLDERS for part in below)


def find_records(roots: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Every ``results.json`` under the given folder(s), file(s) or glob pattern(s), sorted, no duplicates.

    A root that does not exist yields nothing (the caller decides whether that is an error). Copies that a
    logger keeps inside a run folder (``wandb/.../files/results.json``) are not records: a folder search skips
    every logger folder below the root; a file named directly is taken as given.
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
                found.update(q for q in p.rglob(RECORD_FILENAME) if q.is_file() and not _in_logger_folder(q, p))
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
    # How fast, not what (training/acceleration.py): at most the summation order changes, as with threads
    "pin_memory", "fused_optimizer", "nan_check", "activation_checkpointing", "compile",
    "print_config",
    "resume",  # whether to pick up a checkpoint: a resumed run is the same run
    "record_attention*",  # what the run also writes (attention-weight captures), not what it trains
    "plugins",  # modules imported for their registrations; what they register is in the config itself
    "optimized_metric",  # what a sweeper reads from the run, not what the run computes
    # The per-scale blocks (training/scale.py): the block of the scale that runs is already applied to the keys
    # it names, and the blocks of the other scales never run; a preset growing an ``at_scale.gpu`` block must
    # not make its laptop records a different configuration.
    "at_scale",
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
