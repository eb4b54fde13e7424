"""Publishing run records: copy the small files of finished runs into ``results/runs`` for committing.

A run folder under ``runs/`` holds checkpoints and logs (megabytes to gigabytes); a committed table needs
only what its numbers came from. ``publish_runs`` copies, for every completed or failed run of a paper preset
(``experiment`` set, not a debug run), the record and the resolved config, plus the small artifacts
that notebooks read, into ``results/runs/<experiment>/s<seed>-<config hash>/``:

    results.json                   the run record (untouched: its run_dir still says where it was trained)
    .hydra/config.yaml             the resolved config, .hydra/overrides.yaml the command-line overrides
    ponder/, attention/            per-position step counts, attention-weight histograms (when recorded)

The destination is keyed by config hash and seed, so publishing the same run twice writes the same bytes,
and a rerun with other settings lands beside the old one (the table then picks per seed, newest first).

    python -m attnlab.results.publish runs results/runs [--only ut/table4]

Like the rest of ``results/``, this imports neither torch nor Hydra.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import UserError
from attnlab.results.configs import header_disagreement
from attnlab.results.record import (
    ATTENTION_DIR,
    BEFORE_SCALE_CONFIG,
    OVERRIDES_FILE,
    PONDER_DIR,
    RECORD_FILENAME,
    RESOLVED_CONFIG,
    RecordError,
    find_records,
    load_json,
    validate_record,
    write_files_atomically,
)

# Files and folders of a run folder that travel with its record (everything else stays behind).
# config_before_scale.yaml: Hydra's composition before the scale blocks, what a table compares across runs
# (attnlab.results.configs); runs from before it existed hold that form as config.yaml.
PUBLISHED_FILES = tuple(str(p) for p in (RESOLVED_CONFIG, BEFORE_SCALE_CONFIG, OVERRIDES_FILE))
PUBLISHED_DIRS = (PONDER_DIR, ATTENTION_DIR)
# An artifact folder bigger than this is refused: results/ is for kilobytes, not checkpoints.
MAX_ARTIFACT_BYTES = 2_000_000


# Completed runs carry the numbers; failed ones are published too, so a table built from results/ shows
# "failed (why)" (a hub-only dataset offline, say) rather than a bare "missing". Running ones are transient.
_STATUS_RANK = {"completed": 0, "failed": 1}


class PublishError(UserError):
    """A record that cannot be published; the message is one line."""


@dataclass(frozen=True)
class Published:
    source: Path
    destination: Path
    changed: bool


def destination_for(record: dict, dest_root: Path) -> Path:
    """``<dest_root>/<experiment>/s<seed>-<first 12 of config hash>`` for one record."""
    experiment = str(record["experiment"]).strip("/")
    if not experiment or ".." in Path(experiment).parts:
        raise PublishError(f"experiment_name {experiment!r} cannot name a folder")
    return dest_root / experiment / f"s{record.get('seed')}-{str(record['config_hash'])[:12]}"


def _publishable(data: object, only: tuple[str, ...]) -> bool:
    if not isinstance(data, dict) or data.get("status") not in _STATUS_RANK or validate_record(data):
        return False
    experiment = data.get("experiment")
    if not experiment or (data.get("extra") or {}).get("debug"):
        return False
    return _in_scope(data, only)


def _in_scope(data: object, only: tuple[str, ...]) -> bool:
    experiment = str(data.get("experiment") or "") if isinstance(data, dict) else ""
    return not only or any(experiment == o or experiment.startswith(o.rstrip("/") + "/") for o in only)


def _refuse_damaged(path: Path, only: tuple[str, ...]) -> dict:
    """The record at ``path``; PublishError (one line naming the file) when it cannot be read, is not a
    valid record, or disagrees with the config beside it, and lies within ``only``: publishing around it
    would leave a table without a seed that the runs folder has. attnlab writes records atomically, so such a
    file was edited, copied or damaged after the run."""
    try:
        data = load_json(path)
    except RecordError as exc:
        raise PublishError(f"{exc}; fix or delete it, then publish again") from None
    finished = isinstance(data, dict) and data.get("status") in _STATUS_RANK
    if finished and _in_scope(data, only):
        problems = validate_record(data)
        problem = f"{path}: not a valid run record: {'; '.join(problems[:3])}" if problems else \
            header_disagreement(path, data)
        if problem:
            raise PublishError(f"{problem}; fix or delete it, then publish again")
    return data


def _already_published(dest: Path) -> dict | None:
    """The finished record already published at ``dest``, if there is a readable one."""
    try:
        data = load_json(dest / RECORD_FILENAME)
    except RecordError:
        return None
    finished = isinstance(data, dict) and data.get("status") in _STATUS_RANK and not validate_record(data)
    return data if finished else None


def _preference(record: dict) -> tuple[int, str]:
    """Smaller is preferred: completed before failed, then the newest."""
    created = str(record.get("created") or "")
    return _STATUS_RANK[record["status"]], "".join(chr(0x10FFFF - ord(c)) for c in created)


def _inside_bytes(run_dir: Path, path: Path) -> bytes | None:
    """The bytes of ``path`` when it is a regular file inside ``run_dir`` (a link is followed only while it
    stays inside); None for something else there (a FIFO, a socket). A link that leaves the run folder is
    refused: the published tree is committed, and a planted link to a private key must not carry it along."""
    target = path.resolve()
    if not target.is_relative_to(run_dir.resolve()):
        raise PublishError(f"{path}: a link out of the run folder (to {target}); publish copies only the run's own "
                           "files: replace the link with the file or delete it")
    if not stat.S_ISREG(target.stat().st_mode):
        return None
    return target.read_bytes()


def _artifacts(run_dir: Path) -> dict[str, bytes]:
    """Relative path -> bytes of the files that travel with a record, checked against the size cap."""
    files: dict[str, bytes] = {}
    for rel in PUBLISHED_FILES:
        if (run_dir / rel).exists():
            content = _inside_bytes(run_dir, run_dir / rel)
            if content is not None:
                files[rel] = content
    for folder in PUBLISHED_DIRS:
        root = run_dir / folder
        if not root.is_dir():
            continue
        _inside_bytes(run_dir, root)  # the folder itself may be a link out
        for path in sorted(root.rglob("*")):
            if path.is_dir() and not path.is_symlink():
                continue
            content = _inside_bytes(run_dir, path)
            if content is not None:
                files[path.relative_to(run_dir).as_posix()] = content
        size = sum(len(b) for k, b in files.items() if k.startswith(folder + "/"))
        if size > MAX_ARTIFACT_BYTES:
            raise PublishError(
                f"{root}: {size} bytes of artifacts, over the {MAX_ARTIFACT_BYTES}-byte cap for results/; "
                "keep big outputs in runs/"
            )
    return files


def publish_runs(
    sources: Iterable[str | os.PathLike], dest_root: str | os.PathLike, only: Iterable[str] = ()
) -> list[Published]:
    """Copy every publishable record under ``sources`` (with its config and artifacts) below ``dest_root``.

    Every file is read first, then all changed ones are renamed into place together (unchanged bytes are
    not rewritten), so an error leaves ``dest_root`` as it was. ``only`` (experiment prefixes) that leaves out
    every finished run found is an error (``PublishError``) naming the experiments there.
    """
    dest_root = Path(dest_root)
    only = tuple(only)
    plan: list[tuple[Path, Path, dict[str, bytes]]] = []
    seen: dict[Path, Path] = {}
    left_out: set[str] = set()  # experiments of publishable runs that ``only`` leaves out
    for path in find_records(list(sources)):
        if dest_root.resolve() in path.resolve().parents:
            continue  # already published
        data = _refuse_damaged(path, only)
        if not _publishable(data, only):
            if only and _publishable(data, ()):
                left_out.add(str(data["experiment"]))
            continue
        dest = destination_for(data, dest_root)
        kept = _already_published(dest)
        if kept is not None and _preference(kept) < _preference(data):
            continue  # "completed wins" across publish calls: a later failed attempt never replaces the result
        if dest in seen:
            # Two runs of one config and seed: keep the completed one, then the newer (as the table chooses).
            if _preference(load_json(seen[dest])) <= _preference(data):
                continue
            plan = [p for p in plan if p[1] != dest]
        seen[dest] = path
        files = {RECORD_FILENAME: _inside_bytes(path.parent, path) or b"", **_artifacts(path.parent)}
        plan.append((path, dest, files))
    if only and not plan and left_out:
        # A table's name (ut/table5_reverse) is not an experiment prefix (ut/table5/ut_reverse): say so rather
        # than report "0 records" as if there were nothing to publish.
        names = sorted(left_out)
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise PublishError(
            f"--only {' '.join(only)} matches none of the {len(names)} experiment(s) with finished runs here "
            f"({shown}); --only takes an experiment prefix such as {names[0].rsplit('/', 1)[0]}"
        )
    published, to_write = [], {}
    for source, dest, files in plan:
        changed = {dest / rel: content for rel, content in files.items() if not _same(dest / rel, content)}
        to_write.update(changed)
        published.append(Published(source, dest, bool(changed)))
    # Each record is renamed into place after its config and artifacts: a publish killed between renames leaves
    # no record beside a config it does not belong to (the next publish completes it).
    write_files_atomically(dict(sorted(to_write.items(), key=lambda item: item[0].name == RECORD_FILENAME)))
    return published


def _same(path: Path, content: bytes) -> bool:
    return path.is_file() and path.read_bytes() == content


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.results.publish", description=__doc__.split("\n")[0])
    parser.add_argument("sources", nargs="+", help="run folders to search (e.g. runs)")
    parser.add_argument("dest", help="where records go (results/runs)")
    parser.add_argument("--only", action="append", default=[], help="experiment prefix, e.g. ut/table4")
    args = parser.parse_args(argv)
    missing = [s for s in args.sources if not Path(s).exists()]
    if missing:
        print(f"error: no such runs folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        published = publish_runs(args.sources, args.dest, args.only)
    except (PublishError, OSError, UnicodeDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for p in published:
        print(f"{'published' if p.changed else 'unchanged'}: {p.destination} <- {p.source.parent}")
    print(f"{len(published)} record(s) under {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
