"""A wandb run read back as a run record: the mapping from a run's summary and config (from the wandb API or an
offline run's files, read by ``cli/wandb_source.py``) to the record shape, and the sorting of what does not map.
Imports no wandb: the readers above hand it plain mappings.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnlab.errors import TableError
from attnlab.results.loading import Corrupt, Loaded, corrupt_hint
from attnlab.results.record import Cost, Metrics, ParamCount, config_hash, record_header, sanitize_record

_STATE = {
    "finished": "completed",
    "running": "running",
    "failed": "failed",
    "crashed": "failed",
    "killed": "failed",
}


def _first(mapping: Mapping[str, Any], *paths: str) -> Any:
    for dotted in paths:
        node: Any = mapping
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is not None:
            return node
    return None


# Where a wandb run's config may hold a header field (older runs logged the trainer's arguments), and what the
# field is when it holds none of them.
_WANDB_CONFIG_KEYS = {
    "experiment_name": ("experiment_name", "experiment.name"),
    "row": ("row", "experiment.row"),
    "hardware.accelerator": ("hardware.accelerator", "trainer.accelerator"),
    "hardware.devices": ("hardware.devices", "trainer.devices"),
    "hardware.num_nodes": ("hardware.num_nodes", "trainer.num_nodes"),
    "hardware.precision": ("hardware.precision", "trainer.precision"),
}
_WANDB_DEFAULTS = {
    "task.name": "unknown",
    "model.name": "unknown",
    "model.attention.name": "unknown",
    "model.recurrence.name": "unknown",
    "scale.name": "cpu",
    "hardware.name": "unknown",
    "hardware.accelerator": "unknown",
    "hardware.devices": 1,
    "hardware.num_nodes": 1,
    "hardware.precision": "32-true",
}


def _wandb_config_value(config: Mapping[str, Any]):
    def value(key: str) -> Any:
        found = _first(config, *_WANDB_CONFIG_KEYS.get(key, (key,)))
        if key == "seed":
            return found if isinstance(found, int) else -1
        return found or _WANDB_DEFAULTS.get(key, found)

    return value


def record_from_wandb(summary: Mapping, config: Mapping, state: str, run_id: str, url: str) -> dict[str, Any]:
    """The run-record shape from a wandb run's summary and config (the resolved Hydra config).

    A run that logged its whole record (summary key ``attnlab/record``) is taken as is; otherwise the
    fields are read from the config groups and the slash-named metrics of the summary.
    """
    logged = summary.get("attnlab/record")
    if isinstance(logged, Mapping):
        return sanitize_record({**logged, "wandb_run_id": run_id})
    final = {
        k: v
        for k, v in summary.items()
        if "/" in k
        and not k.startswith(("_", "model/params/"))  # params go to their own field
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
    }
    status = _STATE.get(state, "failed")
    plain_config = {k: v for k, v in config.items() if not k.startswith("_")}
    record = record_header(
        _wandb_config_value(config),
        status=status,
        error=None if status != "failed" else f"wandb run state {state}",
        config_hash=summary.get("config_hash") or config_hash(plain_config),
        git={"commit": _first(config, "git.commit"), "dirty": _first(config, "git.dirty")},
        run_dir=url,
        command=f"(wandb run {url})",
        created=summary.get("created") or "1970-01-01T00:00:00",
        metrics=Metrics(final=final, best={}),
        params=ParamCount(total=summary.get("model/params/total"), trainable=summary.get("model/params/trainable")),
        cost=Cost(wall_s=summary.get("_runtime"), tokens_per_s=summary.get("perf/tokens_per_s"),
                  peak_mem_mb=summary.get("perf/peak_mem_mb")),
        wandb_run_id=run_id,
    )
    return sanitize_record(record)


def sort_wandb_record(where: Path, data: dict, problems: list[str], skip_corrupt: bool, loaded: list,
                      corrupt: list) -> None:
    """Append a record mapped from wandb to ``loaded``, or (with its problems) to ``corrupt``; without
    ``skip_corrupt`` a problem stops the build with one line."""
    if problems:
        msg = f"{where}: does not map to a run record: {'; '.join(problems[:3])}"
        if not skip_corrupt:
            raise TableError(corrupt_hint(msg))
        corrupt.append(Corrupt(where, msg, data))
    else:
        loaded.append(Loaded(where, data))
