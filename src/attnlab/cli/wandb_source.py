"""``attnlab-table source=wandb``: wandb runs read, from the wandb API or from offline runs'
files (this floor may import wandb; results/ may not).

An offline run (``WANDB_MODE=offline``, attnlab's default here) keeps everything in its transaction log
``<run>/wandb/offline-run-*/run-<id>.wandb`` until ``wandb sync`` uploads it: a LevelDB-style log of
protobuf ``Record`` messages (wandb's own format, read with wandb's own message classes). Reading it gives
``attnlab-table source=wandb`` the same summary and config the wandb API would return after the sync, so
the round trip training -> wandb -> table is testable without network.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from attnlab.errors import TableError, UserError
from attnlab.results.loading import Corrupt, Loaded
from attnlab.results.record import validate_record
from attnlab.results.wandb_records import record_from_wandb, sort_wandb_record

BLOCK = 32768          # the log's block size
HEADER = b":W&B"       # file header: ident, magic 0xBEE1, version (7 bytes)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class OfflineRunError(UserError, ValueError):
    """An offline wandb run file that cannot be read; the message is one line."""


def log_records(path: Path) -> Iterator[bytes]:
    """The payloads of a wandb transaction log, chunks joined (LevelDB log format: 7-byte chunk headers of
    checksum, little-endian length and type; a block tail too short for a header is padding)."""
    data = path.read_bytes()
    if not data.startswith(HEADER):
        raise OfflineRunError(f"{path}: not a wandb run file (no {HEADER!r} header)")
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        room = BLOCK - pos % BLOCK
        if room < 7:
            pos += room
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if kind == 0:  # zero fill up to the next block
            pos += room
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


def _apply(target: dict[str, Any], items, removals=()) -> None:
    for item in items:
        keys = list(item.nested_key) or [item.key]
        node = target
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = json.loads(item.value_json)
    for item in removals:
        target.pop(item.key, None)


def read_offline_run(path: Path) -> dict[str, Any]:
    """{run_id, name, tags, config, summary, state} of one offline run's ``run-<id>.wandb``."""
    from wandb.proto import wandb_internal_pb2

    out: dict[str, Any] = {"run_id": None, "name": None, "tags": [], "config": {}, "summary": {},
                           "state": "running", "artifacts": []}
    for payload in log_records(path):
        rec = wandb_internal_pb2.Record()
        try:
            rec.ParseFromString(payload)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError; a torn tail after a crash
            raise OfflineRunError(f"{path}: damaged record ({exc.__class__.__name__})") from None
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out.update(run_id=rec.run.run_id, name=rec.run.display_name, tags=list(rec.run.tags))
            _apply(out["config"], rec.run.config.update)
            _apply(out["summary"], rec.run.summary.update)
        elif kind == "config":
            _apply(out["config"], rec.config.update, rec.config.remove)
        elif kind == "summary":
            _apply(out["summary"], rec.summary.update, rec.summary.remove)
        elif kind == "exit":
            out["state"] = "finished" if rec.exit.exit_code == 0 else "failed"
        elif kind == "artifact":
            out["artifacts"].append({"name": rec.artifact.name, "type": rec.artifact.type,
                                     "files": [e.path for e in rec.artifact.manifest.contents]})
    # wandb keeps each config value as {"value": ..., "desc": ...}
    out["config"] = {k: v.get("value") if isinstance(v, Mapping) and "value" in v else v
                     for k, v in out["config"].items()}
    return out


def offline_run_files(roots: list[str]) -> list[Path]:
    """Every ``offline-run-*/run-*.wandb`` under the given folders (run folders or a runs/ tree)."""
    found: set[Path] = set()
    for root in roots:
        base = Path(root)
        if base.is_file() and base.suffix == ".wandb":
            found.add(base.resolve())
        elif base.is_dir():
            found.update(p.resolve() for p in base.rglob("offline-run-*/run-*.wandb"))
    return sorted(found)


def offline_wandb_records(roots: list[str], skip_corrupt: bool = False):
    """(loaded, corrupt) run records of the offline wandb runs under ``roots``, through the same mapping as
    the wandb API source (``record_from_wandb``)."""
    loaded, corrupt = [], []
    for path in offline_run_files(roots):
        try:
            run = read_offline_run(path)
            data = record_from_wandb(run["summary"], run["config"], run["state"], run["run_id"] or path.stem,
                                     str(path.parent))
            problems = validate_record(data)
        except OfflineRunError as exc:
            data, problems = {}, [str(exc)]
        sort_wandb_record(path, data, problems, skip_corrupt, loaded, corrupt)
    return loaded, corrupt


def wandb_records(
    entity: Any, project: Any, skip_corrupt: bool = False
) -> tuple[list[Loaded], list[Corrupt]]:
    if not entity or not project:
        raise TableError("source=wandb needs entity=<wandb entity> project=<wandb project>")
    try:
        import wandb
    except ImportError as exc:
        raise TableError("source=wandb needs the wandb package (pip install wandb)") from exc
    try:
        api = wandb.Api(timeout=30)
        runs = list(api.runs(f"{entity}/{project}"))
    except Exception as exc:  # wandb raises many kinds (network, auth, 404); all mean the same to the user
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TableError(
            f"cannot read wandb runs of {entity}/{project} ({first[:200]}); check the network and "
            "WANDB_API_KEY, or use source=local with the run folders"
        ) from exc
    loaded, corrupt = [], []
    for run in runs:
        where = Path(f"wandb:{entity}/{project}/{run.id}")
        data = record_from_wandb(dict(run.summary), dict(run.config), run.state, run.id, run.url)
        sort_wandb_record(where, data, validate_record(data), skip_corrupt, loaded, corrupt)
    return loaded, corrupt
