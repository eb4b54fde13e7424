"""Issue 16 goal 2 (first half): time to the first training step of a Multi30k run, first run vs second run.

    python benchmarks/bench_startup.py [--rounds 3] [--quick]

Each round trains ``experiment=synthesizer/table2/transformer_ende scale=cpu`` (Multi30k En-De at cpu scale)
for one step twice in fresh processes, sharing one empty tokenizer cache: the first run trains the BPE
vocabulary and tokenizes the data, the second finds both cached. The time measured is the run record's
``cost.startup_s`` (from the start of the run to its first training batch: config checks, data, tokenizer,
model, trainer); the time from process launch (Python, library imports, Hydra) is printed beside it.
Writes results/bench/startup.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from attnlab.results.record import RECORD_FILENAME  # noqa: E402
from benchmarks._common import REPO, fmt, goal, goal_line, machine, stats, write_results  # noqa: E402

GOAL = 1 / 3
OVERRIDES = ["experiment=synthesizer/table2/transformer_ende", "scale=cpu", "trainer.max_steps=1",
             "trainer.limit_val_batches=0", "trainer.num_sanity_val_steps=0", "trainer.limit_test_batches=1",
             "trainer.enable_progress_bar=false", "logger=csv", "callbacks=none"]


def one_run(run_dir: Path, tokenizer_cache: Path) -> tuple[float, float]:
    """(record's startup_s, seconds from process launch to the first step) of one fresh training process.

    The second is approximate: the process wall time less the run's own wall time (after the first step:
    training, testing, writing the record) adds Python, library imports and Hydra composition (and the
    process exit) to ``startup_s``."""
    env = {**os.environ, "ATTNLAB_TOKENIZER_CACHE": str(tokenizer_cache), "ATTNLAB_SKIP_EXISTING": "0",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "WANDB_MODE": "offline"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "attnlab.train", *OVERRIDES, f"hydra.run.dir={run_dir}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    record = run_dir / RECORD_FILENAME
    if proc.returncode or not record.is_file():
        raise SystemExit(f"training failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    cost = json.loads(record.read_text())["cost"]
    return float(cost["startup_s"]), wall - float(cost["wall_s"]) + float(cost["startup_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one round")
    a = ap.parse_args()
    rounds = 1 if a.quick else a.rounds
    first, second, first_wall, second_wall = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="attnlab-startup-") as tmp:
        for r in range(rounds):
            cache = Path(tmp) / f"cache{r}"  # empty: the first run trains and tokenizes
            s1, w1 = one_run(Path(tmp) / f"run{r}a", cache)
            s2, w2 = one_run(Path(tmp) / f"run{r}b", cache)
            first.append(s1), second.append(s2), first_wall.append(w1), second_wall.append(w2)
            print(f"round {r + 1}: first {s1:.2f} s, second {s2:.2f} s (ratio {s2 / s1:.3f}); "
                  f"from process launch {w1:.1f} s / {w2:.1f} s", flush=True)
    ratio = stats([b / a_ for a_, b in zip(first, second)])
    wall_ratio = stats([b / a_ for a_, b in zip(first_wall, second_wall)])
    record = goal("16.2", "time to the first training step, second run / first run (Multi30k)", ratio, GOAL, "<=",
                  unit="", digits=3)
    lines = ["# Start-up: time to the first training step, Multi30k (issue 16, goal 2)", "",
             f"Machine: {machine()}", "",
             f"`attnlab-train {' '.join(OVERRIDES[:2])}`, one step, {rounds} round(s) of a first run (empty "
             f"tokenizer cache: BPE training + tokenizing) and a second run (both cached).", "",
             f"- first run, start of run to first step: {fmt(stats(first), ' s')}",
             f"- second run: {fmt(stats(second), ' s')}",
             goal_line(record),
             f"- from process launch (imports and Hydra included), first / second: {fmt(stats(first_wall), ' s')} / "
             f"{fmt(stats(second_wall), ' s')}; ratio {fmt(wall_ratio, digits=3)}", ""]
    print("\n".join(lines), flush=True)
    write_results("startup", "\n".join(lines) + "\n",
                  {"first_s": first, "second_s": second, "ratio": ratio, "first_wall_s": first_wall,
                   "second_wall_s": second_wall, "wall_ratio": wall_ratio}, [record])


if __name__ == "__main__":
    main()
