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
from attnlab.results.record import RECORD_FILENAME  # noqa: E402
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
    metrics, run_walls = {}, {}
    for record in runs.rglob(RECORD_FILENAME):
        data = json.loads(record.read_text())
        metrics[data["experiment"]] = data["metrics"]["final"]
        run_walls[data["experiment"]] = data["cost"]["wall_s"]  # the run's own wall time, start-up to record
    return wall, metrics, run_walls


def packed_wall(run_walls: list[float], jobs: int) -> float:
    """Wall time of running these jobs in list order on ``jobs`` slots, each job taking the next free slot
    (what joblib does): the sweep's lower bound if the runs took exactly these times."""
    slots = [0.0] * jobs
    for t in run_walls:
        slots[slots.index(min(slots))] += t
    return max(slots)


def explain(seq_walls: dict[str, float], par_walls: dict[str, float], seq_sweep: float, par_sweep: float,
            jobs: int) -> tuple[list[str], dict[str, float]]:
    """Split the ratio into its causes: how much slower a run gets with cores/jobs threads beside other runs
    (thread scaling), how well the runs pack onto the slots, and what the sweep costs outside its runs."""
    shared = sorted(set(seq_walls) & set(par_walls))
    slowdown = stats([par_walls[e] / seq_walls[e] for e in shared])
    seq_sum = sum(seq_walls[e] for e in shared)
    packed = packed_wall([par_walls[e] for e in shared], jobs)
    parts = {"run_slowdown_median": slowdown["median"], "runs_sequential_s": seq_sum, "packed_parallel_s": packed,
             "outside_runs_sequential_s": seq_sweep - seq_sum, "outside_runs_parallel_s": par_sweep - packed,
             "ceiling_from_slowdown": jobs / slowdown["median"]}
    lines = [f"- one run with cores/{jobs} threads beside {jobs - 1} other(s) / the same run alone with all threads "
             f"(wall, per run): {fmt(slowdown, 'x')}; with runs this much slower, {jobs} at once can gain at most "
             f"{parts['ceiling_from_slowdown']:.2f}x",
             f"- sum of the runs' own wall times, sequential: {seq_sum:.0f} s (the sweep outside them: "
             f"{parts['outside_runs_sequential_s']:.0f} s); parallel runs packed onto {jobs} slots in launch order: "
             f"{packed:.0f} s (outside them: {parts['outside_runs_parallel_s']:.0f} s)",
             "", "| run | sequential (s) | parallel (s) | parallel / sequential |", "|---|---|---|---|"]
    lines += [f"| {e} | {seq_walls[e]:.0f} | {par_walls[e]:.0f} | {par_walls[e] / seq_walls[e]:.2f} |" for e in shared]
    return lines, parts


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
    largest_gap, gap_at = 0.0, ""
    for r in range(a.rounds):
        order = ("sequential", "parallel") if r % 2 == 0 else ("parallel", "sequential")
        results, walls = {}, {}
        for name in order:
            with tempfile.TemporaryDirectory() as tmp:
                wall, metrics, run_walls = sweep("basic" if name == "sequential" else "joblib", Path(tmp), a.steps,
                                                 a.jobs, extra)
            times[name].append(wall)
            results[name], walls[name] = metrics, run_walls
        for exp, seq in results["sequential"].items():
            par = results["parallel"].get(exp, {})
            for key, value in seq.items():
                if isinstance(value, float) and isinstance(par.get(key), float) and abs(value - par[key]) > largest_gap:
                    largest_gap, gap_at = abs(value - par[key]), f"{key} of {exp}"
    # The breakdown comes from the last round (its per-run wall times are in the JSON's ``run_walls``).
    breakdown, parts = explain(walls["sequential"], walls["parallel"], times["sequential"][-1],
                               times["parallel"][-1], a.jobs)
    ratio = stats([s / p for s, p in zip(times["sequential"], times["parallel"])])
    load = os.getloadavg()
    record = goal("16.1", f"sweep of six UT Table 4 runs, sequential / {a.jobs} at once (wall time)", ratio, 1.6,
                  note=f"a run takes {parts['run_slowdown_median']:.2f}x its time alone when run at cores/{a.jobs} "
                  f"threads beside others: ceiling {parts['ceiling_from_slowdown']:.2f}x")
    lines = ["# Sweeps fill the machine (issue 16, goal 1)", "", f"Machine: {machine()}; load average at the end "
             f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} (1/5/15 min)", "",
             f"Six UT Table 4 laptop rows (seed 1, {a.steps} updates each), {a.rounds} round(s).", "",
             f"- one after the other (basic launcher, default threads): {fmt(stats(times['sequential']), ' s')}",
             f"- {a.jobs} at once (joblib_attnlab, cores/{a.jobs} threads each): {fmt(stats(times['parallel']), ' s')}",
             goal_line(record), *breakdown, "",
             f"- largest per-run metric difference between the two sweeps: {largest_gap:.2e} "
             f"({gap_at or 'none'}; the thread count changes the float summation order, and training amplifies it; "
             "equal threads give equal metrics, see the slow test tests/experiments/test_parallel_sweeps.py)", ""]
    print("\n".join(lines), flush=True)
    write_results("sweep", "\n".join(lines) + "\n", {"times": times, "ratio": ratio, "largest_gap": largest_gap,
                                                     "largest_gap_at": gap_at, "breakdown": parts,
                                                     "run_walls": walls, "load": load}, [record])


if __name__ == "__main__":
    main()
