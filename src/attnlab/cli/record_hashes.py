"""Do the published run records still describe what their recorded command runs today?

A record's ``config_hash`` is what ``make reproduce-*`` looks for before it trains a row: a clean clone skips a
row whose committed record has the hash its command composes now. When a change of the config schema (a new
option, a new ``at_scale.gpu`` block) moves that hash, the committed records are no longer found and every row
is trained again. This tool holds the two equal:

    python -m attnlab.cli.record_hashes check   [--runs results/runs]      # make check-tables runs it (CI)
    python -m attnlab.cli.record_hashes migrate [--runs results/runs] [--baselines results/baselines]

``check`` composes each record's recorded command at HEAD (as ``attnlab-train`` would, scale applied) and
fails, naming the keys that differ from the config saved beside the record, where the hash differs.

``migrate`` rewrites the hash of such a record only where it can prove that nothing that ran changed: every
key of the saved ``.hydra/config.yaml`` (the config the run trained with, minus what the hash leaves out)
resolves to the same value at HEAD; keys only HEAD has are new options, listed. The baselines files
(``results/baselines``) that name the record by its hash are rewritten with it. A record whose values changed
is left alone and listed: its rows must be trained again (``make reproduce-...``). The record's folder keeps
its name (``s<seed>-<hash at publication>``): tables cite records by path.

Exit status: 0 all equal (check) or every differing record migrated (migrate), 1 otherwise, 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from attnlab.training.record_hashes import migrate, scan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.cli.record_hashes", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("check", "migrate"))
    parser.add_argument("--runs", type=Path, default=Path("results/runs"), help="the published records")
    parser.add_argument("--baselines", type=Path, default=Path("results/baselines"),
                        help="baselines files naming records by hash (migrate rewrites them)")
    args = parser.parse_args(argv)
    if not args.runs.is_dir():
        print(f"record_hashes: error: no folder {args.runs}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    checked, findings, problems = scan(args.runs)
    for problem in problems:
        print(f"record_hashes: {problem}", file=sys.stderr)
    if args.action == "check":
        for f in findings:
            print(f"{f.path}: recorded hash {f.recorded[:12]}, its command composes {f.now[:12]} at HEAD ({f.why()})")
        if findings:
            print(f"{len(findings)} of {checked} published records are not found by their own command at HEAD: if "
                  "what runs did not change, `make migrate-records` proves it and rewrites their hashes; else "
                  "train those rows again", file=sys.stderr)
        else:
            print(f"record hashes: all {checked} published records match what their command composes at HEAD "
                  f"({time.perf_counter() - started:.0f} s)")
        return 1 if findings or problems else 0
    left = migrate(findings, args.baselines)
    print(f"record hashes: {len(findings) - len(left)} of {checked} records migrated "
          "(same resolved values for every saved key)")
    for f in left:
        print(f"not migrated, train again: {f.path}: {f.why()}")
    return 1 if left or problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
