"""Do the published run records still describe what their recorded command runs today? The scan (each record's
recorded command composed at HEAD, scaled as the run scales it, compared with the config saved beside it) and
the migration of hashes that provably name the same run; ``python -m attnlab.cli.record_hashes`` (``make
check-tables``, ``make migrate-records``) is the command over them, and its docstring says why.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from attnlab.errors import UserError
from attnlab.results.baselines import baselines_document
from attnlab.results.record import (
    DEFAULT_HASH_EXCLUDE,
    RESOLVED_CONFIG,
    RecordError,
    atomic_write_text,
    dumps_record,
    find_records,
    is_excluded,
    load_json,
)

# How a recorded command starts (training/record_writers.py writes the program as the user typed it).
_PROGRAMS = (("attnlab-train",), ("python", "-m", "attnlab.train"), ("python", "-m", "attnlab.cli.train"))


class RecordHashError(UserError):
    """Bad input; the message is one line."""


def recorded_overrides(command: Any) -> list[str]:
    """The Hydra overrides of a recorded ``attnlab-train ...`` command."""
    try:
        tokens = shlex.split(str(command or ""))
    except ValueError as exc:
        raise RecordHashError(f"the recorded command {command!r} does not parse: {exc}") from None
    for program in _PROGRAMS:
        head = [Path(t).name if i == 0 else t for i, t in enumerate(tokens[: len(program)])]
        if tuple(head) == program or (program[0] == "python" and head[:1] and head[0].startswith("python")
                                      and tuple(head[1:]) == program[1:]):
            return tokens[len(program):]
    raise RecordHashError(f"the recorded command {command!r} is not an attnlab-train command")


@contextmanager
def hydra_once() -> Iterator[Any]:
    """Hydra's compose, initialised once for many compositions (initialising is most of a compose's time)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="attnlab.conf", version_base="1.3", job_name="train"):
        yield compose
    GlobalHydra.instance().clear()


class HeadConfigs:
    """The config each recorded command composes at HEAD, scaled as the run scales it. Commands that differ only
    in ``seed=`` are composed once: ``seed`` is a plain root key, so setting it after composing is the override."""

    def __init__(self, compose: Any) -> None:
        self._compose = compose
        self._seedless: dict[tuple[str, ...], DictConfig] = {}

    def config(self, overrides: list[str]) -> DictConfig:
        from attnlab.training.scale import apply_scale

        seeds = [o.split("=", 1)[1] for o in overrides if o.startswith("seed=")]
        rest = tuple(o for o in overrides if not o.startswith("seed="))
        if rest not in self._seedless:
            base = self._compose(config_name="train", overrides=list(rest))
            self._seedless[rest] = base
        cfg = self._seedless[rest].copy()
        if seeds:
            cfg.seed = int(seeds[-1]) if seeds[-1].lstrip("-").isdigit() else seeds[-1]
        apply_scale(cfg, overrides)
        return cfg


def _comparable(cfg: DictConfig) -> dict[str, Any]:
    """``dotted key -> resolved value`` over the keys the hash covers."""
    from attnlab.training.config_hash import drop_excluded

    trimmed = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    drop_excluded(trimmed, DEFAULT_HASH_EXCLUDE, "")
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        elif not is_excluded(prefix[:-1], DEFAULT_HASH_EXCLUDE):
            out[prefix[:-1]] = node

    try:
        plain = OmegaConf.to_container(trimmed, resolve=True)
    except Exception:  # noqa: BLE001 - as the run's hash does (training/record_writers.py): compared as written
        plain = OmegaConf.to_container(trimmed, resolve=False)
    walk(plain, "")
    return out


@dataclass
class Finding:
    path: Path
    recorded: str
    now: str
    changed: list[tuple[str, Any, Any]] = field(default_factory=list)  # (key, saved value, value at HEAD)
    added: list[str] = field(default_factory=list)  # keys only HEAD has
    no_saved_config: bool = False

    @property
    def provably_same(self) -> bool:
        return not self.no_saved_config and not self.changed

    def why(self) -> str:
        if self.no_saved_config:
            return f"no {RESOLVED_CONFIG} beside the record to compare with"
        if self.changed:
            shown = "; ".join(f"{k}: {old!r} -> {new!r}" for k, old, new in self.changed[:4])
            return f"values differ: {shown}" + (f" (and {len(self.changed) - 4} more)" if len(self.changed) > 4 else "")
        return "same values for every saved key" + (f"; new keys {', '.join(self.added[:6])}" if self.added else "") \
            + ("" if len(self.added) <= 6 else f" (and {len(self.added) - 6} more)")


def compare_with_saved(path: Path, data: dict[str, Any], head: DictConfig, now: str) -> Finding:
    finding = Finding(path, str(data.get("config_hash")), now)
    saved_file = path.parent / RESOLVED_CONFIG
    if not saved_file.is_file():
        finding.no_saved_config = True
        return finding
    from attnlab.results.safe_yaml import load_yaml

    saved = _comparable(OmegaConf.create(load_yaml(saved_file.read_text(encoding="utf-8"))))
    at_head = _comparable(head)
    missing = object()
    finding.changed = [(k, v, at_head.get(k, "<absent>")) for k, v in sorted(saved.items())
                       if at_head.get(k, missing) != v]
    finding.added = sorted(at_head.keys() - saved.keys())
    return finding


def scan(runs: Path) -> tuple[int, list[Finding], list[str]]:
    """(records checked, the records whose hash differs from their command's at HEAD, unreadable records)."""
    from attnlab.training.config_hash import asked_config_hash

    checked, findings, problems = 0, [], []
    with hydra_once() as compose:
        configs = HeadConfigs(compose)
        for path in find_records(runs):
            try:
                data = load_json(path)
                if not isinstance(data, dict):
                    raise RecordError(f"{path}: not a JSON object")
                head = configs.config(recorded_overrides(data.get("command")))
            except (RecordError, RecordHashError) as exc:
                problems.append(f"{path}: {exc}")
                continue
            except Exception as exc:  # noqa: BLE001 - Hydra's many errors: the command no longer composes
                problems.append(f"{path}: its recorded command no longer composes: {str(exc).splitlines()[0]}")
                continue
            checked += 1
            now = asked_config_hash(head)
            if now != data.get("config_hash"):
                findings.append(compare_with_saved(path, data, head, now))
    return checked, findings, problems


def migrate(findings: list[Finding], baselines: Path | None) -> list[Finding]:
    """Rewrite the hash of every provably unchanged record (and the baselines files that name it); returns
    the records left alone."""
    renamed: dict[str, str] = {}
    left = []
    for finding in findings:
        if not finding.provably_same:
            left.append(finding)
            continue
        data = load_json(finding.path)
        data["config_hash"] = finding.now
        atomic_write_text(finding.path, dumps_record(data))
        renamed[finding.recorded] = finding.now
    if baselines is not None and baselines.is_dir() and renamed:
        for path in sorted(baselines.rglob("*.json")):
            doc = json.loads(path.read_text(encoding="utf-8"))
            runs = doc.get("runs")
            if not isinstance(runs, dict) or not renamed.keys() & runs.keys():
                continue
            new_runs = {renamed.get(h, h): key for h, key in runs.items()}
            text = baselines_document(doc["table"], doc["baselines"], new_runs, doc["made_by"])
            atomic_write_text(path, text)
    return left


class TargetHashes:
    """What ``make reproduce-* SCALE=<scale> HARDWARE=<hardware> ARGS=<args>`` composes for one (row, seed):
    ``attnlab-train experiment=<row> seed=<seed> scale=... hardware=... <args>``, composed once per row
    (``HeadConfigs`` sets the seed after composing) and hashed as the run hashes itself."""

    def __init__(self, configs: HeadConfigs, scale: str, hardware: str, args: list[str],
                 t5_pretrain_dir: str = "runs/t5_pretrain") -> None:
        self._configs = configs
        self._common = [f"scale={scale}", f"hardware={hardware}", *args]
        self._t5_pretrain_dir = t5_pretrain_dir
        self._hashes: dict[tuple[str, int], str] = {}

    def _config(self, experiment: str, seed: int) -> DictConfig:
        extra = []
        if experiment.startswith("synthesizer/t5/multitask_"):  # the T5 targets train these from their pre-training
            extra = [f"init_from={self._t5_pretrain_dir}/${{pretrain_experiment}}-s${{seed}}/checkpoints/last.ckpt"]
        return self._configs.config([f"experiment={experiment}", f"seed={seed}", *self._common, *extra])

    def target_hash(self, experiment: str, seed: int) -> str:
        from attnlab.training.config_hash import asked_config_hash

        key = (experiment, seed)
        if key not in self._hashes:
            try:
                self._hashes[key] = asked_config_hash(self._config(experiment, seed))
            except Exception as exc:  # noqa: BLE001 - Hydra's many errors: the preset no longer composes
                self._hashes[key] = f"(does not compose: {str(exc).splitlines()[0]})"
        return self._hashes[key]

    def why_differs(self, record: Path, experiment: str, seed: int) -> str:
        now = self.target_hash(experiment, seed)
        if now.startswith("(does not compose"):
            return f"{experiment} {now[1:-1]}"
        finding = compare_with_saved(record, load_json(record), self._config(experiment, seed), now)
        if finding.changed:  # key names only: the listing says which keys, `record_hashes check` the values
            keys = [key for key, _, _ in finding.changed]
            return "keys " + ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
        return finding.why()


def listing_with_hash_test(argv: list[str], scale: str, hardware: str, args: list[str],
                           t5_pretrain_dir: str) -> int:
    """``attnlab.results.listing``'s main with the targets' hash test (``make reproduce-list``)."""
    from attnlab.results import listing

    with hydra_once() as compose:
        hashes = TargetHashes(HeadConfigs(compose), scale, hardware, args, t5_pretrain_dir)
        return listing.main(argv, hash_test=hashes)
