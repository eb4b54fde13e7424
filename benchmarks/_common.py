"""Shared benchmark helpers: interleaved timing with min/median/max, ratio statistics, peak memory of one
case in a fresh subprocess, and the markdown/PNG writers. Benchmarks are scripts, not tests."""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# A ``--quick`` smoke run writes under results/bench/quick/ (ignored by git), so it never replaces the
# committed measurements.
RESULTS = REPO / "results" / "bench" / ("quick" if "--quick" in sys.argv[1:] else "")


def stats(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def fmt(s: dict[str, float], unit: str = "", scale: float = 1.0, digits: int = 2) -> str:
    return "/".join(f"{scale * s[k]:.{digits}f}" for k in ("min", "median", "max")) + unit


def interleaved(cases: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of every case, measured round-robin in this process so that load changes on a
    shared machine hit every case alike; each round runs each case once."""
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            gc.collect()
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return times


def ratios(times: dict[str, list[float]], baseline: str, candidate: str) -> dict[str, float]:
    """Per-round speed-up baseline / candidate (same round = same machine load), as min/median/max."""
    return stats([b / c for b, c in zip(times[baseline], times[candidate])])


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_extra_bytes(run: Callable[[], object]) -> int:
    """In the current (fresh) process: peak RSS growth while ``run()`` executes, after one warm-up call.

    The caller sets MALLOC_MMAP_THRESHOLD_ (see ``memory_in_subprocess``) so that glibc returns large
    blocks to the OS on free and RSS follows live memory; the high-water mark is reset through
    /proc/self/clear_refs after the warm-up."""
    run()
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    base = _rss_kib("VmRSS")
    run()
    return (_rss_kib("VmHWM") - base) * 1024


def memory_in_subprocess(script: Path, args: list[str], timeout: float = 900) -> int | None:
    """Run ``script --memory-case ... args`` in a fresh interpreter; it prints ``PEAK_BYTES=<n>``."""
    # The repository's own src/ first, so a checkout (or worktree) measures its code, not an installed copy.
    path = os.pathsep.join(p for p in (str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": path}
    try:
        out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                             timeout=timeout, env=env, cwd=REPO)
    except subprocess.TimeoutExpired:
        return None
    for line in out.stdout.splitlines():
        if line.startswith("PEAK_BYTES="):
            return int(line.split("=", 1)[1])
    sys.stderr.write(out.stderr[-2000:])
    return None


def machine() -> str:
    import platform

    import torch

    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, {torch.get_num_threads()} "
            f"threads, Python {platform.python_version()}, load average at start {load:.1f}")


def goal(key: str, what: str, value: dict[str, float] | float, target: float | None = None, op: str = ">=",
         unit: str = "x", digits: int = 2, scale: float = 1.0, note: str = "") -> dict:
    """One goal's verdict: judged on the median (or the single value) against ``target`` (``None``: a number
    reported without a target). Printed as one line and returned for ``write_results(goals=...)``, from
    which benchmarks/summary.py writes the performance table of docs/performance.md."""
    median = value["median"] if isinstance(value, dict) else value
    if target is None:
        met, status = None, "report"
    else:
        if op not in (">=", "<="):
            raise ValueError(f"goal {key}: op must be '>=' or '<=', not {op!r}")
        met = median >= target if op == ">=" else median <= target
        status = "MET" if met else f"MISSED by {100 * abs(median - target) / abs(target):.0f}%"
    shown = fmt(value, digits=digits, scale=scale) if isinstance(value, dict) else f"{scale * value:.{digits}f}"
    record = {"key": key, "what": what, "measured": value, "shown": f"{shown}{unit}",
              "target": None if target is None else f"{op} {scale * target:g}{unit}", "met": met, "status": status,
              "note": note}
    print(f"- goal {record['key']}: {goal_line(record).removeprefix('- ')}", flush=True)
    return record


def unmeasured_goal(key: str, what: str, target: str, why: str) -> dict:
    """A goal this run could not measure, kept (and printed) so that the docs say so instead of dropping it."""
    record = {"key": key, "what": what, "measured": None, "shown": "-", "target": target, "met": None,
              "status": f"not measured: {why}", "note": ""}
    print(f"- goal {record['key']}: {goal_line(record).removeprefix('- ')}", flush=True)
    return record


def goal_line(record: dict) -> str:
    """A goal as a markdown bullet (a benchmark's own results file, and what it prints)."""
    target_text = "no target" if record["target"] is None else f"target {record['target']}"
    return (f"- **{record['what']}** = {record['shown']} ({target_text}: {record['status']})"
            + (f"; {record['note']}" if record["note"] else ""))


def write_results(name: str, markdown: str, data: dict, goals: list[dict] | None = None) -> Path:
    """results/bench/<name>.md and .json; the json keeps the goals' verdicts and when they were measured."""
    import datetime

    data = {**data, "goals": goals or [], "measured_at": datetime.datetime.now(datetime.UTC).strftime(
        "%Y-%m-%d %H:%M UTC")}
    data.setdefault("machine", machine())
    if hasattr(os, "getloadavg"):
        data["load_at_end"] = list(os.getloadavg())
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.md"
    path.write_text(markdown)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))
    return path


def plot_vs_length(path: Path, title: str, series: dict[str, dict[int, tuple[float | None, float | None]]]):
    """series: variant -> {L: (median seconds, peak extra bytes)}; two panels, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, pts in series.items():
        ls = sorted(pts)
        t = [(x, pts[x][0]) for x in ls if pts[x][0] is not None]
        m = [(x, pts[x][1]) for x in ls if pts[x][1] is not None]
        if t:
            ax_t.plot(*zip(*[(x, 1e3 * y) for x, y in t]), marker="o", label=name)
        if m:
            ax_m.plot(*zip(*[(x, y / 2**20) for x, y in m]), marker="o", label=name)
    for ax, ylabel in ((ax_t, "median time (ms)"), (ax_m, "peak extra memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
