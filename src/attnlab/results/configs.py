"""Which run records share a configuration apart from the seed: the rule that decides what a cell may pool.

A cell's mean over seeds is only a mean over seeds when everything else is equal: a cpu-scale 800-step seed
and a paper-scale seed of the same preset are two experiments, not two seeds. The configuration of a run is
read from its ``.hydra/config_before_scale.yaml`` (else ``.hydra/config.yaml``; both beside ``results.json``,
both published), minus the top-level ``seed`` and the keys that never change a result
(:data:`DEFAULT_HASH_EXCLUDE`: paths, loggers, Hydra's runtime). A record without that file (a wandb run)
falls back to the fields of the record that name its configuration: experiment, task, model, scale,
hardware, and the overrides of its command.

``init_from`` (the checkpoint a run starts from, e.g. the T5 path's pre-training) is compared relative to the
run's ``paths.runs_dir``: ``runs_t1/t5_pretrain/...`` and ``runs_t2/t5_pretrain/...`` name the same step of two
sweeps kept in different folders, as paths never change a result.

Two configurations are the same when they agree on every key both have: a key that only one has was added
to (or removed from) a preset after the other ran, with its old behaviour as the default (the rule for
adding keys, docs/tables_and_claims.md, "Tables"), so a committed record stays valid when a preset grows.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnlab.results.record import (
    BEFORE_SCALE_CONFIG,
    DEFAULT_HASH_EXCLUDE,
    HEADER_FROM_CONFIG,
    RESOLVED_CONFIG,
    _strip,
    is_excluded,
)
from attnlab.results.safe_yaml import UnsafeYamlError, load_yaml

RUNS_DIR = "${paths.runs_dir}"
# The hash's exclusions, less the per-scale blocks: a config read here is the form before the scale blocks are
# applied, where an edited ``at_scale.cpu`` block (800 laptop steps instead of 500) is the only trace of the change.
_BEFORE_SCALE_EXCLUDE = tuple(p for p in DEFAULT_HASH_EXCLUDE if p != "at_scale")


def relative_init_from(init_from: Any, runs_dir: Any) -> Any:
    """``init_from`` with a leading ``<runs_dir>/`` written as ``${paths.runs_dir}/`` (else unchanged)."""
    if not isinstance(init_from, str) or not isinstance(runs_dir, str) or not runs_dir.strip("/"):
        return init_from
    prefix = runs_dir.rstrip("/") + "/"
    return RUNS_DIR + "/" + init_from[len(prefix):] if init_from.startswith(prefix) else init_from


def _flatten(node: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(node, Mapping) and node:
        for key, value in node.items():
            _flatten(value, f"{prefix}{key}.", out)
    else:
        out[prefix[:-1]] = json.dumps(node, sort_keys=True, default=str) if isinstance(node, (list, dict)) else node


def _not_config(key: str) -> bool:
    """Whether a command-line key does not make a different experiment: the seed (what a cell pools over) and
    what the config hash leaves out (paths, loggers, Hydra's runtime, ...), the key itself or a group above it.
    A config-group override (``hydra/launcher=joblib_attnlab``, ``logger/wandb=...``) names its groups with "/"."""
    parts = key.replace("/", ".").split(".")
    groups = (".".join(parts[:n]) for n in range(1, len(parts) + 1))
    return key == "seed" or any(is_excluded(group, DEFAULT_HASH_EXCLUDE) for group in groups)


def _command_overrides(command: Any) -> dict[str, str]:
    out, runs_dir = {}, None
    for token in str(command or "").split()[1:]:
        key, sep, value = token.partition("=")
        key = key.lstrip("+~")
        if key == "paths.runs_dir":
            runs_dir = value
        if sep and not token.startswith("-") and not _not_config(key):
            out[f"override:{key}"] = value
    if "override:init_from" in out:
        out["override:init_from"] = relative_init_from(out["override:init_from"], runs_dir)
    return out


# The fields of a record's header that name its run, checked against the config saved beside it, as
# (record field, config key) from the schema's HEADER_FROM_CONFIG.
_HEADER_CHECKED = ("experiment", "seed", "scale", "task", "model.name", "model.attention", "model.recurrence")
_HEADER_FROM_CONFIG = tuple((field, dict(HEADER_FROM_CONFIG)[field]) for field in _HEADER_CHECKED)


def header_disagreement(record_path: Path, data: Mapping[str, Any]) -> str | None:
    """Where a record's header and the config saved beside it name different runs (a record copied into
    another run's folder, or edited by hand), one line; None when they agree or there is no config."""
    saved_file = saved_config(record_path)
    if saved_file is None:  # none, or unreadable: the table's "configs differ" business, not a header mismatch
        return None
    config_file, config = saved_file
    for field, key in _HEADER_FROM_CONFIG:
        said, saved = get_field(data, field, _MISSING), get_field(config, key, _MISSING)
        if _MISSING not in (said, saved) and said != saved:
            return (f"{record_path}: the record says {field} {said!r} but the config beside it "
                    f"({config_file.relative_to(record_path.parent)}) says {key} {saved!r}: the record and the config "
                    f"are of two different runs")
    return None


_MISSING = object()


def get_field(record: Mapping[str, Any], dotted: str, missing: Any = None) -> Any:
    """``record["a"]["b"]`` for ``"a.b"``; ``missing`` where a part is absent."""
    node: Any = record
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return missing
        node = node[part]
    return node


def saved_config(record_path: Path) -> tuple[Path, Mapping[str, Any]] | None:
    """(file, parsed config) saved beside a record (the before-scale form when present: the form every record
    has, since older runs wrote exactly it as config.yaml, so old and new seeds of one configuration compare
    alike); None when there is none or it does not parse. Parsed once per file version: loading a table checks
    every record's header against it and then compares the configs of a cell's runs."""
    before, resolved = record_path.parent / BEFORE_SCALE_CONFIG, record_path.parent / RESOLVED_CONFIG
    config_file = before if before.is_file() else resolved
    try:
        stat = config_file.stat()
    except OSError:
        return None
    config = _parse_config(str(config_file), stat.st_mtime_ns, stat.st_size)
    return (config_file, config) if config is not None else None


@functools.lru_cache(maxsize=4096)
def _parse_config(path: str, mtime_ns: int, size: int) -> Mapping[str, Any] | None:
    try:
        config = load_yaml(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, UnsafeYamlError):
        return None
    return config if isinstance(config, Mapping) else None


def seedless_config(record_path: Path | None, data: Mapping[str, Any]) -> dict[str, Any]:
    """The run's configuration apart from its seed, as ``dotted key -> value``."""
    saved_file = saved_config(record_path) if record_path is not None else None
    if saved_file is not None:
        config = dict(saved_file[1])  # a copy: the parsed config is shared (cached)
        if "init_from" in config:
            paths = config.get("paths") if isinstance(config.get("paths"), Mapping) else {}
            config["init_from"] = relative_init_from(config["init_from"], paths.get("runs_dir"))
        stripped = _strip({k: v for k, v in config.items() if k != "seed"}, _BEFORE_SCALE_EXCLUDE, "")
        flat: dict[str, Any] = {}
        _flatten(stripped, "", flat)
        return flat
    model = data.get("model") if isinstance(data.get("model"), Mapping) else {}
    hardware = data.get("hardware") if isinstance(data.get("hardware"), Mapping) else {}
    return {
        "experiment": data.get("experiment"),
        "task.name": data.get("task"),
        "model.name": model.get("name"),
        "model.attention.name": model.get("attention"),
        "model.recurrence.name": model.get("recurrence"),
        "scale.name": data.get("scale"),
        "hardware.name": hardware.get("name"),
        "hardware.precision": str(hardware.get("precision")),
        **_command_overrides(data.get("command")),
    }


def differing_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Keys both configurations have, with different values (what makes them two experiments)."""
    return sorted(k for k in a.keys() & b.keys() if a[k] != b[k])


def config_groups(configs: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    """Indices of ``configs`` grouped into configurations that agree on every key they share."""
    groups: list[list[int]] = []
    for i, config in enumerate(configs):
        for group in groups:
            if all(not differing_keys(configs[j], config) for j in group):
                group.append(i)
                break
        else:
            groups.append([i])
    return groups
