"""Finding run records that already hold a result: what lets ``make reproduce-*`` skip finished rows.

A row of a paper table is one config (preset, seed, scale, hardware, overrides); its run record stores the
hash of the resolved config (:func:`attnlab.results.record.config_hash`). Before training, the training
floor hashes the config the same way and asks :func:`find_completed` whether a completed record with that
hash exists under the runs folder or the published records (``results/runs``); if so, the run is skipped
and that record stands for it.

Only ``completed`` records count: a failed or still-running record (or one that cannot be read) never
stops a row from being trained. Like the rest of ``results/``, this imports neither torch nor Hydra.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attnlab.results.record import find_records, validate_record

# Environment switch read by the training floor (``make reproduce-*`` sets it): "1" turns skipping on.
SKIP_ENV = "ATTNLAB_SKIP_EXISTING"
# Where the committed run records are (the Makefile's PUBLISHED); relative to the current folder.
PUBLISHED_ENV = "ATTNLAB_PUBLISHED_RUNS"
DEFAULT_PUBLISHED = Path("results") / "runs"


def skip_existing_requested(environ: dict[str, str] | None = None) -> bool:
    """True when ``ATTNLAB_SKIP_EXISTING`` is set to 1/true/yes (case-insensitive)."""
    value = (os.environ if environ is None else environ).get(SKIP_ENV, "")
    return value.strip().lower() in ("1", "true", "yes")


def _read(path: Path, wanted_hash: str | None = None) -> dict[str, Any] | None:
    """The record at ``path`` when it is a valid completed record (with ``wanted_hash`` when given)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("status") != "completed":
        return None
    if wanted_hash is not None and data.get("config_hash") != wanted_hash:
        return None  # cheap test first: most records under runs/ are other configs
    if validate_record(data):
        return None
    return data


def _newest_by_hash(
    roots: str | os.PathLike | Iterable[str | os.PathLike], wanted_hash: str | None
) -> dict[str, Path]:
    best: dict[str, tuple[str, Path]] = {}
    for path in find_records(roots):
        data = _read(path, wanted_hash)
        if data is None:
            continue
        chash, created = data.get("config_hash"), str(data.get("created") or "")
        if not isinstance(chash, str) or not chash:
            continue
        # ISO times of one writer sort as strings; ties go to the lexically last path (deterministic).
        key = (created, str(path))
        if chash not in best or key > (best[chash][0], str(best[chash][1])):
            best[chash] = (created, path)
    return {h: p for h, (_, p) in best.items()}


def find_completed(
    runs_root: str | os.PathLike | Iterable[str | os.PathLike], config_hash: str
) -> Path | None:
    """The ``results.json`` of the newest completed run with ``config_hash`` under ``runs_root``, or None.

    ``runs_root`` (a folder or several) is searched recursively (single runs and multirun sweeps alike); a
    missing folder or an empty hash gives None. A record whose run folder has moved still counts: only its
    hash matters.
    """
    if not config_hash:
        return None
    roots = [runs_root] if isinstance(runs_root, (str, os.PathLike)) else list(runs_root)
    roots = [Path(r) for r in roots if Path(r).exists()]
    if not roots:
        return None
    return _newest_by_hash(roots, config_hash).get(config_hash)


def search_roots(runs_dir: str | os.PathLike, environ: dict[str, str] | None = None) -> list[Path]:
    """Where completed runs are looked for: the run folder, then the published records.

    The published records (what the committed tables are built from) are ``$ATTNLAB_PUBLISHED_RUNS``
    (``make reproduce-*`` sets it to its ``PUBLISHED``), else ``results/runs`` under the current folder: a
    clean clone has an empty ``runs/`` but the committed records, and must not train them again.
    """
    env = os.environ if environ is None else environ
    published = Path(env.get(PUBLISHED_ENV) or DEFAULT_PUBLISHED)
    roots = [Path(runs_dir)]
    if published.resolve() != Path(runs_dir).resolve():
        roots.append(published)
    return roots
