"""``make reproduce-list``: the listing of ``attnlab.results.listing`` with the reproduce targets' own skip test.

A target skips a run only where a completed record has the config hash its command composes today
(``results/lookup.py``); a published record of an older config is trained again. The listing applies the same
test (``training/record_hashes.TargetHashes``), so "0 of 6 runs to train" means the target trains nothing, and
where published records are due anyway it says which keys of their saved config differ from today's.

    python -m attnlab.cli.reproduce_list [--hardware cpu] [--args "..."] [--t5-pretrain-dir runs/t5_pretrain]
        <the arguments of attnlab.results.listing>
"""

from __future__ import annotations

import argparse
import shlex
import sys

from attnlab.results import listing
from attnlab.training.record_hashes import listing_with_hash_test


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
    return listing_with_hash_test(passed, known.scale, known.hardware, extra, known.t5_pretrain_dir)


if __name__ == "__main__":
    raise SystemExit(main())
