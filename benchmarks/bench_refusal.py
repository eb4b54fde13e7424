"""Time to refuse a bad command (issue 15.8): wall seconds from starting ``attnlab-train`` / ``attnlab-eval`` in a
fresh process to its exit, for a few bad overrides and ``--help``; also whether torch / Lightning were imported
on the way (the preflight must not need them for a bad key or number). The goal is <= 3 s on our machines.

    python benchmarks/bench_refusal.py [--repeats N] [--only LABEL ...] [--src path/to/src]

Prints min/median/max per case and the machine load; a script, not a timed test (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import REPO, fmt, stats  # noqa: E402

# (label, console module, arguments); every train case must be refused with exit code 2.
CASES = [
    ("misspelled key", "attnlab.train", ["trainer.max_stpes=3"]),
    ("non-finite lr", "attnlab.train", ["optim.lr=nan"]),
    ("seed out of range", "attnlab.train", [f"seed={2**64}"]),
    ("unknown preset", "attnlab.train", ["experiment=../../x"]),
    ("bad attention option", "attnlab.train", ["model/attention=bigbird", "model.attention.window_blocks=2"]),
    ("eval --help", "attnlab.evaluate", ["--help"]),
]
# Runs the CLI's main in-process after the interpreter starts, then says which heavy modules it imported.
PROBE = ("import importlib, sys\n"
         "main = importlib.import_module(sys.argv[1]).main\n"
         "try:\n    main(sys.argv[2:])\n    code = 0\n"
         "except SystemExit as exc:\n    code = exc.code\n"
         "print('HEAVY', ','.join(m for m in ('torch', 'lightning') if m in sys.modules) or '-', file=sys.stderr)\n"
         "sys.exit(code)\n")


def once(module: str, args: list[str], cwd: str, src: str) -> tuple[float, int, str]:
    env = {**os.environ, "ATTNLAB_RUNS_DIR": os.path.join(cwd, "runs"), "PYTHONPATH": src}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PROBE, module, *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)
    seconds = time.perf_counter() - start
    heavy = next((ln.split(" ", 1)[1] for ln in proc.stderr.splitlines() if ln.startswith("HEAVY ")), "?")
    return seconds, proc.returncode, heavy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", help="case labels to run (default: all)")
    parser.add_argument("--src", default=str(REPO / "src"), help="the attnlab source tree to time (e.g. an older "
                        "checkout's src, for a before/after comparison)")
    opts = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    bad = 0
    with tempfile.TemporaryDirectory() as cwd:
        for label, module, args in CASES:
            if opts.only and label not in opts.only:
                continue
            runs = [once(module, args, cwd, opts.src) for _ in range(opts.repeats)]
            codes = {code for _, code, _ in runs}
            heavy = {h for _, _, h in runs}
            expected = 0 if "--help" in args else 2
            ok = codes == {expected} and not os.path.exists(os.path.join(cwd, "runs"))
            bad += not ok
            print(f"{label:22s} {fmt(stats([s for s, _, _ in runs]), ' s')}  exit {sorted(codes)}  "
                  f"imported: {'/'.join(sorted(heavy))}{'' if ok else '  UNEXPECTED'}")
    print(f"load average after: {os.getloadavg()}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
