"""``make reproduce-list``: the listing of ``attnlab.results.listing`` with the reproduce targets' own skip test.

A target skips a run only where a completed record has the config hash its command composes today
(``results/lookup.py``); a published record of an older config is trained again. The listing applies the same
test, so "0 of 6 runs to train" means the target trains nothing, and where published records are due anyway it
says which keys of their saved config differ from today's.

    python -m attnlab.cli.reproduce_list [--hardware cpu] [--args "..."] [--t5-pretrain-dir runs/t5_pretrain]
        <the arguments of attnlab.results.listing>
"""

from __future__ import annotations

import argparse
import shlex
import sys
from contextlib import ExitStack
from pathlib import Path

from omegaconf import DictConfig

from attnlab.cli.record_hashes import HeadConfigs, _compare, _hydra_once
from attnlab.results import listing
from attnlab.results.record import load_json


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
        finding = _compare(record, load_json(record), self._config(experiment, seed), now)
        if finding.changed:  # key names only: the listing says which keys, `record_hashes check` the values
            keys = [key for key, _, _ in finding.changed]
            return "keys " + ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
        return finding.why()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.cli.reproduce_list", add_help=False)
    parser.add_argument("--hardware", default="cpu", help="make's HARDWARE")
    parser.add_argument("--args", default="", help="make's ARGS: more overrides the targets pass")
    parser.add_argument("--scale", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--published", default=None)
    parser.add_argument("--t5-pretrain-dir", default="runs/t5_pretrain", help="make's T5_PRETRAIN_DIR")
    known, rest = parser.parse_known_args(argv)
    passed = [*rest, "--scale", known.scale] + (["--published", known.published] if known.published else [])
    if known.scale == "gpu" or known.published is None:  # GPU-hours, or no records to test: nothing to compose
        return listing.main(passed)
    try:
        extra = shlex.split(known.args)
    except ValueError as exc:
        print(f"reproduce-list: error: ARGS does not parse: {exc}", file=sys.stderr)
        return 2
    with ExitStack() as stack:
        compose = stack.enter_context(_hydra_once())
        hashes = TargetHashes(HeadConfigs(compose), known.scale, known.hardware, extra, known.t5_pretrain_dir)
        return listing.main(passed, hash_test=hashes)


if __name__ == "__main__":
    raise SystemExit(main())
