"""Rerunning one committed cell's run with its recorded command, and saying whether it lands where the table says.

A table cell is a mean over seeds of runs that share one configuration. Its numbers are only worth something
if they come back when the run is repeated: this module takes one published record, runs the command the
record stores (the same overrides, the training written to a fresh folder instead of ``runs/``, skipping of
published runs turned off), and compares the rerun's test metrics with

- the recorded value of the same seed (on one machine with the same code and threads a CPU run repeats
  exactly; another machine or another torch may move it a little),
- the cell's reported spread: mean +- sample std over the seeds of the cell (the published records with the
  same experiment and the same configuration apart from the seed, the rule a table pools by), and the seeds'
  range.

It also checks that the rerun resolved the same configuration (equal config hash): a preset or default that
changed since the record was made shows up there before it shows up in the numbers.

    python -m attnlab.results.rerun results/runs/ut/table5/transformer_copy/s1-<hash> [--published results/runs]
    make rerun RECORD=results/runs/ut/table5/transformer_copy/s1-<hash> [RERUN_ARGS='key=value ...']

The recorded command is data: overrides that could run code (``plugins``, ``hydra.*`` such as
``hydra.searchpath`` and launchers, anything with ``_target_``, flags such as ``--config-dir``), write
elsewhere (``paths.run_dir``) or read this machine's environment or files (``${oc.env:...}``) are refused
unless the rerunning user passes them again; the record's own run, sweep and runs folders are replaced by
``--out``.

Exit status: 0 when every compared metric is identical to the record or inside the cell's mean +- std, 1 when
one is outside, 2 for bad input (one line on stderr). Like the rest of ``results/``, this imports neither torch
nor Hydra: the training runs in a child process.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.errors import UserError
from attnlab.results.configs import differing_keys, seedless_config
from attnlab.results.loading import Loaded, load_records
from attnlab.results.lookup import PUBLISHED_ENV, SKIP_ENV
from attnlab.results.record import RECORD_FILENAME, RecordError, find_records, load_json, validate_record
from attnlab.results.stats import Stat, summarize

# Two floats this close are "identical": a deterministic rerun, printed with a few digits.
_IDENTICAL_REL = 1e-6
IDENTICAL, WITHIN_STD, WITHIN_RANGE, OUTSIDE, NO_SPREAD = (
    "identical to the record",
    "within mean +- std",
    "within the seeds' range",
    "outside the spread",
    "differs; the cell has one seed (no spread)",
)


class RerunError(UserError):
    """Bad input or a rerun that produced no record; the message is one line."""


@dataclass
class MetricComparison:
    metric: str
    recorded: float
    rerun: float | None
    cell: Stat | None  # over the seeds of the cell (the recorded run included)
    low: float | None  # the seeds' range
    high: float | None
    verdict: str

    @property
    def ok(self) -> bool:
        return self.verdict in (IDENTICAL, WITHIN_STD)


def _record_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / RECORD_FILENAME
    if not path.is_file():
        raise RerunError(f"no run record at {path}: give a results.json or the folder that holds it")
    return path


def read_completed(path: Path) -> dict[str, Any]:
    try:
        data = load_json(path)
    except RecordError as exc:
        raise RerunError(str(exc)) from exc
    problems = validate_record(data)
    if problems:
        raise RerunError(f"{path}: not a valid run record: {'; '.join(problems[:2])}")
    if data.get("status") != "completed":
        raise RerunError(f"{path}: the run is {data.get('status')!r}, not completed: there is nothing to compare with")
    return data


def comparable_metrics(data: Mapping[str, Any], wanted: Sequence[str] = ()) -> dict[str, float]:
    """The record's finite numeric final test metrics (``test/*``, ``test_<split>/*``), or the ``wanted`` ones."""
    final = _final(data)
    if wanted:
        missing = [m for m in wanted if not _finite(final.get(m))]
        if missing:
            raise RerunError(
                f"the record has no numeric final metric {', '.join(missing)} (it has: {', '.join(sorted(final))})"
            )
        return {m: float(final[m]) for m in wanted}
    found = {k: float(v) for k, v in final.items() if k.startswith("test") and _finite(v)}
    if not found:
        raise RerunError("the record has no numeric final test metric to compare; name one with --metric")
    return found


def _final(data: Mapping[str, Any]) -> Mapping[str, Any]:
    final = (data.get("metrics") or {}).get("final")
    return final if isinstance(final, Mapping) else {}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def cell_records(record_path: Path, data: Mapping[str, Any], published: Path) -> list[Loaded]:
    """The completed published records of the record's cell: same experiment, same config apart from the seed,
    one per seed (the newest), the record itself included."""
    mine = seedless_config(record_path, data)
    loaded, _corrupt = load_records([published], skip_corrupt=True) if published.is_dir() else ([], [])
    by_seed: dict[Any, Loaded] = {}
    for other in loaded:
        if other.data.get("status") != "completed" or other.data.get("experiment") != data.get("experiment"):
            continue
        if differing_keys(mine, other.config):
            continue
        seed = other.data.get("seed")
        if seed not in by_seed or str(other.data.get("created")) > str(by_seed[seed].data.get("created")):
            by_seed[seed] = other
    if data.get("seed") not in by_seed:
        by_seed[data.get("seed")] = Loaded(record_path, dict(data))
    return [by_seed[s] for s in sorted(by_seed, key=str)]


# What a recorded command cannot be trusted with (a record is data, and may come from anyone): code to
# import (plugins, config search paths, launchers, Hydra callbacks, anything built through _target_),
# folders to write to, and interpolations that read this machine's environment. Keys are matched after any
# leading "+", "++" or "~".
_UNTRUSTED_KEYS = ("plugins", "hydra", "paths.run_dir", "paths.results_dir")
_UNTRUSTED_TEXT = ("_target_", "oc.env", "oc.decode", "hydra:")
# The rerun writes where it is told (``out_dir``): the record's own folders are replaced, not refused.
_REPLACED_KEYS = ("paths.runs_dir", "hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir")


def _key(token: str) -> str:
    return token.split("=", 1)[0].lstrip("+~")


def _is_untrusted(token: str) -> bool:
    key = _key(token)
    if token.startswith("-") or "=" not in token:
        return True  # a flag (--config-dir, -cp, --cfg) or a bare word: nothing a rerun needs from a record
    if any(key == k or key.startswith((k + ".", k + "/")) for k in _UNTRUSTED_KEYS):
        return True
    return any(text in token for text in _UNTRUSTED_TEXT)


def recorded_overrides(command: str, overrides: Sequence[str] = ()) -> list[str]:
    """The recorded command's overrides a rerun keeps: not its folders (the rerun chooses those), not a key the
    rerunning user's ``overrides`` set again. One that could run code, write elsewhere or read the environment
    is refused (RerunError naming them) unless ``overrides`` holds it again."""
    tokens = shlex.split(command)
    if not tokens or Path(tokens[0]).name != "attnlab-train":
        raise RerunError(f"the recorded command does not start with attnlab-train: {command!r}")
    if any(t in ("-m", "--multirun") for t in tokens[1:]):
        raise RerunError(f"the recorded command is a multirun, not one run: {command!r}")
    mine = {_key(t) for t in overrides if "=" in t}
    recorded = [t for t in tokens[1:] if _key(t) not in _REPLACED_KEYS and _key(t) not in mine]
    refused = [t for t in recorded if _is_untrusted(t) and t not in overrides]
    if refused:
        raise RerunError(
            f"the recorded command holds overrides a record is not trusted with (code, folders or environment): "
            f"{shlex.join(refused)}; pass them again on the rerun's command line (RERUN_ARGS=...) if you trust them"
        )
    return recorded


def rerun_command(
    command: str, out_dir: Path, train_executable: str | None = None, overrides: Sequence[str] = ()
) -> list[str]:
    """The recorded command as an argv: its runs folder replaced by ``out_dir``, the trainer of this environment,
    then ``overrides`` (the rerunning user's own, trusted, and winning over the record's value of the same key)."""
    recorded = recorded_overrides(command, overrides)
    return [train_executable or _trainer(), *recorded, f"paths.runs_dir={out_dir}", *overrides]


def _trainer() -> str:
    beside = Path(sys.executable).with_name("attnlab-train")  # the virtual environment's entry point
    return str(beside) if beside.is_file() else "attnlab-train"


def _run(argv: list[str]) -> int:
    env = {k: v for k, v in os.environ.items() if k not in (SKIP_ENV, PUBLISHED_ENV)}
    return subprocess.run(argv, env=env, check=False).returncode


def compare(recorded: Mapping[str, float], rerun: Mapping[str, Any], cell: list[Loaded]) -> list[MetricComparison]:
    out = []
    for metric, value in recorded.items():
        new = rerun.get(metric)
        new = float(new) if _finite(new) else None
        seeds = [float(_final(r.data)[metric]) for r in cell if _finite(_final(r.data).get(metric))]
        stat = summarize(seeds)
        low, high = (min(seeds), max(seeds)) if seeds else (None, None)
        out.append(MetricComparison(metric, value, new, stat, low, high, _verdict(value, new, stat, low, high)))
    return out


def _verdict(recorded: float, new: float | None, stat: Stat | None, low: float | None, high: float | None) -> str:
    if new is None:
        return "missing from the rerun"
    if abs(new - recorded) <= _IDENTICAL_REL * max(1.0, abs(recorded)):
        return IDENTICAL
    if stat is None or stat.std is None:
        return NO_SPREAD
    if abs(new - stat.mean) <= stat.std:
        return WITHIN_STD
    if low is not None and high is not None and low <= new <= high:
        return WITHIN_RANGE
    return OUTSIDE


def report_lines(
    data: Mapping[str, Any], new: Mapping[str, Any], comparisons: list[MetricComparison], head: str | None
) -> list[str]:
    lines = [f"rerun of {data.get('experiment')} seed {data.get('seed')} ({data.get('scale')} scale)"]
    recorded_commit = str((data.get("git") or {}).get("commit") or "unknown")
    if head and recorded_commit != "unknown" and head != recorded_commit:
        lines.append(
            f"note: recorded at commit {recorded_commit[:12]}, rerun at {head[:12]}: code changed since may move the "
            "numbers (check out the recorded commit for an exact repeat)"
        )
    same = new.get("config_hash") == data.get("config_hash")
    lines.append(
        "config: the same resolved configuration (equal config hash)"
        if same
        else f"config: DIFFERENT resolved configuration ({str(data.get('config_hash'))[:12]} recorded, "
        f"{str(new.get('config_hash'))[:12]} now): a preset or default changed since the record"
    )
    for c in comparisons:
        spread = "-"
        if c.cell is not None:
            std = f" +- {c.cell.std:.4g}" if c.cell.std is not None else ""
            spread = f"{c.cell.mean:.4g}{std} (n={c.cell.n}, seeds {c.low:.4g}..{c.high:.4g})"
        rerun = "-" if c.rerun is None else f"{c.rerun:.6g}"
        lines.append(f"{c.metric}: recorded {c.recorded:.6g}, rerun {rerun}; cell {spread}: {c.verdict}")
    ok = all(c.ok for c in comparisons)
    lines.append(
        "verdict: "
        + ("the rerun lands within the reported spread" if ok else "the rerun lands OUTSIDE the reported spread")
    )
    return lines


def _git_head() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def rerun_record(
    record: str | os.PathLike,
    published: str | os.PathLike = "results/runs",
    out_dir: str | os.PathLike | None = None,
    metrics: Sequence[str] = (),
    runner: Callable[[list[str]], int] | None = None,
    overrides: Sequence[str] = (),
) -> tuple[list[str], bool]:
    """Rerun one record's command and compare; returns the report lines and whether every metric is inside."""
    path = _record_path(record)
    data = read_completed(path)
    recorded = comparable_metrics(data, metrics)
    cell = cell_records(path, data, Path(published))
    recorded_overrides(str(data["command"]), overrides)  # a refusal comes before any folder is made
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="attnlab-rerun-"))
    if out.exists() and find_records([out]):
        raise RerunError(f"{out} already holds run records: give an empty or new --out folder")
    argv = rerun_command(str(data["command"]), out, overrides=overrides)
    print("running: " + shlex.join(argv), flush=True)
    code = (runner or _run)(argv)
    found = find_records([out]) if out.exists() else []
    if code != 0 or not found:
        raise RerunError(f"the rerun failed (exit {code}); its output is under {out}")
    new = load_json(found[0])
    if new.get("status") != "completed":
        raise RerunError(f"the rerun's record is {new.get('status')!r}: {new.get('error')}; see {found[0].parent}")
    comparisons = compare(recorded, _final(new), cell)
    lines = report_lines(data, new, comparisons, _git_head())
    lines.append(f"rerun record: {found[0]}")
    return lines, all(c.ok for c in comparisons)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.results.rerun", description=__doc__.split("\n")[0])
    parser.add_argument(
        "record", help="a published results.json or its folder (results/runs/<experiment>/s<seed>-<hash>)"
    )
    parser.add_argument("--published", default="results/runs", help="where the cell's other seeds are (results/runs)")
    parser.add_argument("--out", default=None, help="an empty folder for the rerun (default: a new temporary folder)")
    parser.add_argument("--metric", action="append", default=[], help="compare only this metric (repeatable)")
    parser.add_argument(
        "overrides", nargs="*", help="key=value overrides you trust, after the record's (make rerun RERUN_ARGS=...)"
    )
    args = parser.parse_args(argv)
    try:
        lines, ok = rerun_record(args.record, args.published, args.out, args.metric, overrides=args.overrides)
    except RerunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
