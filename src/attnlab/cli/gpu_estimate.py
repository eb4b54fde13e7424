"""``make gpu-estimates``: every paper preset's one-GPU protocol (``scale=gpu``) composed as the CLI composes it,
its training data sampled, and its GPU time estimated by ``results.gpu_estimate`` (where the arithmetic and its
assumptions are), written to ``results/gpu/estimates.json`` for ``make reproduce-list SCALE=gpu``.

    python -m attnlab.cli.gpu_estimate [--out results/gpu/estimates.json] [--data-root ../shared/data]
        [--only ut/table4] [--mfu 0.3 0.15] [--step-floor-s 0.044 0.109] [--eval-share 0.54]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from attnlab.results.gpu_estimate import DEFAULT_EVAL_SHARE, DEFAULT_MFU, DEFAULT_STEP_FLOOR_S, gpu_protocol_experiments
from attnlab.results.record import atomic_write_text
from attnlab.tasks import DataError
from attnlab.training.gpu_estimates import estimate_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.cli.gpu_estimate", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/gpu/estimates.json"))
    parser.add_argument("--conf", type=Path, default=Path("src/attnlab/conf/experiment"))
    parser.add_argument("--data-root", default=os.environ.get("ATTNLAB_DATA_ROOT"))
    parser.add_argument("--only", action="append", default=[], help="preset folder <paper>/<table> (repeatable)")
    parser.add_argument("--mfu", type=float, nargs=2, default=DEFAULT_MFU, metavar=("LOW_END", "HIGH_END"))
    parser.add_argument("--step-floor-s", type=float, nargs=2, default=DEFAULT_STEP_FLOOR_S,
                        metavar=("LOW_END", "HIGH_END"))
    parser.add_argument("--eval-share", type=float, default=DEFAULT_EVAL_SHARE)
    args = parser.parse_args(argv)
    experiments = gpu_protocol_experiments(args.conf)
    if args.only:
        experiments = [e for e in experiments if e.rsplit("/", 1)[0] in args.only]
        if not experiments:
            print(f"gpu-estimate: error: no preset with a gpu protocol under {', '.join(args.only)}", file=sys.stderr)
            return 2
    try:
        result = estimate_all(experiments, args.data_root, mfu=tuple(args.mfu), step_floor_s=tuple(args.step_floor_s),
                              eval_share=args.eval_share)
    except DataError as exc:
        print(f"gpu-estimate: error: {exc}", file=sys.stderr)
        return 2
    if args.only and args.out.exists():  # refresh some tables, keep the rest
        previous = json.loads(args.out.read_text())
        result["rows"] = {**previous.get("rows", {}), **result["rows"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=1, sort_keys=True) + "\n")  # nothing half-written
    print(f"gpu-estimate: {len(result['rows'])} presets -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
