"""``make bench``: every benchmark in turn; each prints its goals' ratios (min/median/max) and writes
results/bench/<name>.md (+ .json, .png); then benchmarks/summary.py writes the benchmark table of
docs/performance.md from them. Pass --quick for a smoke run (results/bench/quick/, docs untouched)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = ["bench_bigbird.py", "bench_decoding.py", "bench_training.py", "bench_variants.py", "bench_startup.py",
           "bench_batching.py", "bench_sweep.py"]
# What a --quick smoke (CI) leaves out: these time whole training runs, which no tiny size makes cheap.
NOT_QUICK = {"bench_startup.py": "trains a Multi30k run twice", "bench_sweep.py": "trains twelve UT Table 4 runs"}


def main() -> int:
    args = sys.argv[1:]
    failed = []
    for script in SCRIPTS:
        print(f"\n##### {script} {' '.join(args)}", flush=True)
        if "--quick" in args and script in NOT_QUICK:
            print(f"skipped in --quick: {NOT_QUICK[script]} (run `python benchmarks/{script}` for it)", flush=True)
            continue
        extra = [a for a in args if a == "--quick"]
        if subprocess.run([sys.executable, str(HERE / script), *extra], cwd=HERE.parent).returncode:
            failed.append(script)
    if "--quick" not in args:  # a smoke run writes under results/bench/quick/, never into the docs
        subprocess.run([sys.executable, str(HERE / "summary.py")], cwd=HERE.parent, check=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
