"""Issue 16 goal 1: a sweep fills the machine. The six UT Table 4 laptop rows as one multirun, run one after
the other (Hydra's basic launcher, every job with torch's default threads: what `make reproduce-*` did
before) vs JOBS at once (hydra/launcher=joblib_attnlab, cores/JOBS threads each: what it does now).

    python benchmarks/bench_sweep.py [--steps 300] [--rounds 1] [--quick]

Both sweeps train the same rows and seeds; the wall time of each whole sweep is measured, rounds alternate
the order of the two. Goal: >= 1.6x on 2 cores. Per-run metrics are compared too: the same seed gives the
same numbers up to the float summation order that a different thread count changes (the slow test
tests/experiments/test_parallel_sweeps.py holds them exactly equal at equal thread counts).
Writes results/bench/sweep.{md,json}.
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
from benchmarks._common import REPO, fmt, goal, goal_line, machine, stats, write_results  # noqa: E402

ROWS = ",".join(f"ut/table4/{m}_{t}" for m in ("transformer", "ut") for t in ("addition", "copy", "reverse"))


def sweep(launcher: str, runs: Path, steps: int, jobs: int, extra: list[str]) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "attnlab.train", "-m", f"experiment={ROWS}", "seed=1", "scale=cpu",
           f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "logger=csv",
           "trainer.enable_progress_bar=false", f"paths.runs_dir={runs}", f"hydra.sweep.dir={runs}/sweep", *extra]
    if launcher == "joblib":
        cores = os.cpu_count() or 1
        cmd += ["hydra/launcher=joblib_attnlab", f"hydra.launcher.n_jobs={jobs}",
                f"hardware.torch_threads={max(1, cores // jobs)}"]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{launcher} sweep failed:\n{done.stderr[-3000:]}")
    metrics = {}
    for record in runs.rglob("results.json"):
        data = json.loads(record.read_text())
        metrics[data["experiment"]] = data["metrics"]["final"]
    return wall, metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="20 steps, small test sets: a smoke run")
    a = ap.parse_args()
    extra = []
    if a.quick:
        a.steps = 20
        extra = ["++task.test_size=16", "++task.val_size=16", "++task.train_size=256"]
    times: dict[str, list[float]] = {"sequential": [], "parallel": []}
    largest_gap = 0.0
    for r in range(a.rounds):
        order = ("sequential", "parallel") if r % 2 == 0 else ("parallel", "sequential")
        results = {}
        for name in order:
            with tempfile.TemporaryDirectory() as tmp:
                wall, metrics = sweep("basic" if name == "sequential" else "joblib", Path(tmp), a.steps, a.jobs, extra)
            times[name].append(wall)
            results[name] = metrics
        for exp, seq in results["sequential"].items():
            par = results["parallel"].get(exp, {})
            for key, value in seq.items():
                if isinstance(value, float) and isinstance(par.get(key), float):
                    largest_gap = max(largest_gap, abs(value - par[key]))
    ratio = stats([s / p for s, p in zip(times["sequential"], times["parallel"])])
    load = os.getloadavg()
    record = goal("16.1", f"sweep of six UT Table 4 runs, sequential / {a.jobs} at once (wall time)", ratio, 1.6,
                  note=f"largest per-run metric difference {largest_gap:.2e}")
    lines = ["# Sweeps fill the machine (issue 16, goal 1)", "", f"Machine: {machine()}; load average at the end "
             f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} (1/5/15 min)", "",
             f"Six UT Table 4 laptop rows (seed 1, {a.steps} updates each), {a.rounds} round(s).", "",
             f"- one after the other (basic launcher, default threads): {fmt(stats(times['sequential']), ' s')}",
             f"- {a.jobs} at once (joblib_attnlab, cores/{a.jobs} threads each): {fmt(stats(times['parallel']), ' s')}",
             goal_line(record),
             f"- largest per-run metric difference between the two sweeps: {largest_gap:.2e} "
             "(thread count changes float summation order; equal threads give equal metrics, see the slow test)", ""]
    print("\n".join(lines), flush=True)
    write_results("sweep", "\n".join(lines) + "\n", {"times": times, "ratio": ratio, "largest_gap": largest_gap,
                                                     "load": load}, [record])


if __name__ == "__main__":
    main()
