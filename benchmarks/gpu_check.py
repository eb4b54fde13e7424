"""``make gpu-check``: one prepared run on a machine with one CUDA GPU that measures what issues 35 and 36 ask of
attnlab on GPUs, and writes ``results/bench/gpu/<device>.{md,json}`` (device, torch, CUDA and Triton versions).

    python benchmarks/gpu_check.py [--budget-s 480] [--only tests,kernels,training,laptop]
    python benchmarks/gpu_check.py --dry-run      # on CPU: every section at toy sizes, report under quick/

Sections, each timed and each recorded even when it fails (a failure is a result; the script goes on):
1. ``tests``: the ``gpu`` test tier (``pytest -m gpu``), passed / failed / errors.
2. ``kernels``: BigBird's attention core, fwd + bwd in bf16, the paper plan (blocks of 64, 3 window, 2 global,
   3 random, per-head plans), 12 heads of 64, about 16k tokens per call, bidirectional and causal, at 4096,
   16384 and 65536 tokens, against dense flash SDPA in the same process: speed-up, the ideal speed-up (dense
   score blocks / the plan's), their ratio, and peak memory against dense. Through the module's own choice
   (``impl=auto``: FlexAttention after its self-test, else the blocked kernel) and named.
3. ``training``: BigBird Table 10 at paper size (RoBERTa-base, bf16, ``hardware=gpu1``) for a few updates: full
   attention and BigBird-ITC at 4096 and 16384 tokens; the Transformer base and UT base MT models at paper size
   on Multi30k: tokens/s, MFU, peak memory, from each run's record.
4. ``laptop``: the Synthesizer Table 2 En-De laptop preset, whole run on the GPU (launch to record): wall time,
   median step, and its test BLEU beside the committed CPU records of the same preset (the cross-device check).

The budget is shared: a section that would start with too little time left is recorded as skipped, never cut
off half-written. GPU figures come only from this script run on a GPU; the dry run proves its logic on CPU
and its numbers are not GPU numbers (written under results/bench/quick/, never committed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from attnlab.results.record import RECORD_FILENAME  # noqa: E402
from benchmarks._common import goal, goal_line, unmeasured_goal  # noqa: E402

SECTIONS = ("tests", "kernels", "training", "laptop")
# Paper plan of BigBird-ITC (Zaheer et al. 2020, App. E): blocks of 64, 3 window, 2 global, 3 random.
PLAN = dict(block_size=64, window_blocks=3, num_global_blocks=2, num_random_blocks=3)
KERNEL_LENGTHS = (4096, 16384, 65536)
KERNEL_TOKENS = 16384  # tokens per call (batch x length), as issue 35 measured dense SDPA
HEADS, HEAD_DIM = 12, 64
LAPTOP_PRESET = "synthesizer/table2/transformer_ende"
# (label, experiment, extra overrides): Table 10's rows at paper size, full attention at the ITC lengths too.
TRAINING_ROWS = [
    ("full attention, 512", "bigbird/table10/full_512", []),
    ("full attention, 4096", "bigbird/table10/full_512", ["task.block_len=4096", "model.max_len=4096"]),
    ("BigBird-ITC, 4096", "bigbird/table10/bigbird_itc_4096", []),
    ("full attention, 16384", "bigbird/table10/full_512", ["task.block_len=16384", "model.max_len=16384"]),
    ("BigBird-ITC, 16384", "bigbird/table10/bigbird_itc_4096", ["task.block_len=16384", "model.max_len=16384"]),
    # Dense base models of the MT tables at paper size, on the local Multi30k (WMT is not on the machine).
    ("Transformer base, MT", "ut/table7/transformer_base", ["task=mt/multi30k_en_de"]),
    ("UT base, MT", "ut/table7/ut_base", ["task=mt/multi30k_en_de"]),
    # hardware.compile at the end: run when the budget allows; the MFU goal takes the better of the two.
    ("Transformer base, MT, compiled", "ut/table7/transformer_base", ["task=mt/multi30k_en_de",
                                                                      "hardware.compile=true"]),
    ("full attention, 4096, compiled", "bigbird/table10/full_512", ["task.block_len=4096", "model.max_len=4096",
                                                                    "hardware.compile=true"]),
]


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


# -- environment ------------------------------------------------------------------------------------------
def describe_device(device: torch.device) -> dict:
    info = {"device": "cpu (dry run)", "torch": torch.__version__, "cuda": torch.version.cuda, "triton": None}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device=torch.cuda.get_device_name(device), capability=f"sm{props.major}{props.minor}",
                    memory_gib=round(props.total_memory / 2**30, 1))
    return info


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


# -- 1. the gpu test tier ---------------------------------------------------------------------------------
def run_gpu_tests(dry_run: bool, budget: Budget) -> dict:
    args = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests"]
    if dry_run:
        args.append("--collect-only")
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=max(60, budget.left() - 30))
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-300:]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|tests? collected)", tail)}
    failed = [ln.split(" ", 1)[1] for ln in proc.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    return {"summary": tail, "counts": counts, "failed": failed[:20], "exit_code": proc.returncode}


# -- 2. BigBird kernels vs dense SDPA ---------------------------------------------------------------------
def _bigbird_module(length: int, causal: bool, heads: int, head_dim: int, device: torch.device):
    from attnlab.attention import build_attention

    torch.manual_seed(0)
    return build_attention("bigbird", d_model=heads * head_dim, num_heads=heads, max_len=length, causal=causal,
                           dense_fallback_len=0, **PLAN).to(device)


def ideal_ratio(plan, causal: bool) -> float:
    """Dense score blocks / the plan's (averaged over the plan's heads): the speed-up of a kernel as efficient
    per computed block as dense SDPA. Causal dense counts the lower triangle of blocks."""
    n = plan.num_blocks
    plan_blocks = plan.key_valid.sum().item() / plan.plan_heads + plan.dense_rows.numel() * n
    return (n * (n + 1) / 2 if causal else n * n) / plan_blocks


def _timed(fn, device: torch.device, repeats: int) -> tuple[list[float], int]:
    """Seconds per call of ``fn`` (after two warm-up calls) and its peak extra memory in bytes (CUDA)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    fn()
    sync()
    peak = 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        sync()
        peak = torch.cuda.max_memory_allocated(device) - base
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return times, peak


def kernel_row(device: torch.device, length: int, causal: bool, *, heads: int, head_dim: int, dtype: torch.dtype,
               batch: int, repeats: int) -> dict:
    """One length and direction: dense SDPA and the kernel BigBird's ``impl=auto`` picks, fwd + bwd."""
    from attnlab.attention.kernels.blocksparse_blocked import blocked_blocksparse_attention
    from attnlab.attention.kernels.blocksparse_flex import flex_blocksparse_attention

    module = _bigbird_module(length, causal, heads, head_dim, device)
    plan = module.plan_for_length(length, device)
    kernel = module.kernel_for(device, True, dtype=dtype, length=length, padded=False)
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, grad = (torch.randn(batch, heads, length, head_dim, device=device, dtype=dtype, generator=g)
                     for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    sparse = {"flex": flex_blocksparse_attention, "blocked": blocked_blocksparse_attention}[kernel]

    def dense_step():
        F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(grad)

    def sparse_step():
        sparse(q, k, v, plan).backward(grad)

    row = {"length": length, "causal": causal, "batch": batch, "kernel": kernel}
    try:
        dense_t, dense_mem = _timed(dense_step, device, repeats)
        sparse_t, sparse_mem = _timed(sparse_step, device, repeats)
    except Exception as exc:  # noqa: BLE001 - a failing kernel is a result to report
        row["error"] = f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        return row
    speedup = statistics.median(dense_t) / statistics.median(sparse_t)
    ideal = ideal_ratio(plan, causal)
    row.update(dense_ms=1e3 * statistics.median(dense_t), sparse_ms=1e3 * statistics.median(sparse_t),
               speedup=speedup, ideal=ideal, of_ideal=speedup / ideal,
               memory_vs_dense=(sparse_mem / dense_mem) if dense_mem else None)
    print(f"kernels: {'causal' if causal else 'bidir.'} L={length} {kernel}: {speedup:.2f}x dense "
          f"(ideal {ideal:.2f}x, {speedup / ideal:.2f} of it)", flush=True)
    return row


def measure_kernels(device: torch.device, dry_run: bool, budget: Budget) -> dict:
    lengths = (256, 512) if dry_run else KERNEL_LENGTHS
    heads, head_dim = (2, 16) if dry_run else (HEADS, HEAD_DIM)
    tokens = 1024 if dry_run else KERNEL_TOKENS
    dtype = torch.float32 if dry_run else torch.bfloat16
    repeats = 2 if dry_run else 10
    rows = []
    for causal in (False, True):
        for length in lengths:
            if budget.left() < 30:
                rows.append({"length": length, "causal": causal, "skipped": "time budget"})
                continue
            rows.append(kernel_row(device, length, causal, heads=heads, head_dim=head_dim, dtype=dtype,
                                   batch=max(1, tokens // length), repeats=repeats))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return {"rows": rows, "dtype": str(dtype), "heads": heads, "head_dim": head_dim, "plan": PLAN}


# -- 3 and 4: training runs through attnlab-train -----------------------------------------------------------
def train(overrides: list[str], runs: Path, timeout: float) -> dict:
    """One ``attnlab-train`` run in a fresh process; its record (or why there is none) and wall time."""
    run_dir = runs / f"run{len(list(runs.iterdir())) if runs.exists() else 0}"
    cmd = [sys.executable, "-m", "attnlab.cli.train", *overrides, f"hydra.run.dir={run_dir}", "logger=csv",
           "trainer.enable_progress_bar=false"]
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p)}
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=max(30, timeout))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "wall_s": time.monotonic() - started}
    wall = time.monotonic() - started
    record_path = run_dir / RECORD_FILENAME
    if proc.returncode != 0 or not record_path.is_file():
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        return {"error": (lines[-1] if lines else f"exit {proc.returncode}")[:300], "wall_s": wall}
    record = json.loads(record_path.read_text())
    cost = record["cost"]
    return {"wall_s": wall, "record_wall_s": cost.get("wall_s"), "tokens_per_s": cost.get("tokens_per_s"),
            "step_s": cost.get("step_s"), "mfu": cost.get("mfu"), "peak_mem_mb": cost.get("peak_mem_mb"),
            "startup_s": cost.get("startup_s"), "steps": cost.get("steps"), "final": record["metrics"]["final"]}


def measure_training(dry_run: bool, budget: Budget, runs: Path) -> dict:
    if dry_run:
        common = ["scale=cpu", "hardware=cpu", "trainer.max_steps=2", "trainer.val_check_interval=2",
                  "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "batch.sentences_per_update=2",
                  "task.max_train_tokens=40000", "task.max_val_tokens=9000", "task.max_test_tokens=9000"]
        rows = [(label, exp, extra) for label, exp, extra in TRAINING_ROWS[1:3]]
    else:
        common = ["scale=paper", "hardware=gpu1", "trainer.max_steps=30", "trainer.val_check_interval=30",
                  "trainer.limit_val_batches=1", "trainer.limit_test_batches=2", "batch.sentences_per_update=16",
                  "trainer.num_sanity_val_steps=0"]
        rows = TRAINING_ROWS
    out = {}
    for label, experiment, extra in rows:
        if budget.left() < 90:
            out[label] = {"skipped": "time budget"}
            continue
        out[label] = train([f"experiment={experiment}", *common, *extra], runs, timeout=budget.left() - 60)
        print(f"training: {label}: {out[label].get('tokens_per_s') or out[label].get('error')}", flush=True)
    return out


def committed_cpu_metrics(preset: str, metric: str) -> list[float]:
    """``metric`` of the committed CPU records of ``preset`` (results/runs), one per seed."""
    values = []
    for path in sorted((REPO / "results" / "runs" / preset).glob(f"s*/{RECORD_FILENAME}")):
        record = json.loads(path.read_text())
        if record.get("status") == "completed" and record["hardware"]["accelerator"] == "cpu":
            value = record["metrics"]["final"].get(metric)
            if value is not None:
                values.append(float(value))
    return values


def measure_laptop(dry_run: bool, budget: Budget, runs: Path) -> dict:
    if budget.left() < 120:
        return {"skipped": "time budget"}
    extra = (["hardware=cpu", "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=1",
              "trainer.limit_test_batches=1"] if dry_run else ["hardware=gpu1"])
    result = train([f"experiment={LAPTOP_PRESET}", "seed=1", *extra], runs, timeout=budget.left() - 30)
    cpu = committed_cpu_metrics(LAPTOP_PRESET, "test/bleu")
    result["cpu_test_bleu"] = cpu
    gpu = (result.get("final") or {}).get("test/bleu")
    if gpu is not None and cpu:
        result["within_cpu_seed_spread"] = min(cpu) <= gpu <= max(cpu)
    return result


# -- the report -------------------------------------------------------------------------------------------
def goals_of(report: dict) -> list[dict]:
    goals = []
    tests = report.get("tests") or {}
    if "counts" in tests and not report["dry_run"]:
        c = tests["counts"]
        total = c.get("passed", 0) + c.get("failed", 0) + c.get("error", 0) + c.get("errors", 0)
        goals.append(goal("35.tests", "gpu test tier pass rate", c.get("passed", 0) / max(1, total), 1.0,
                          unit="", note=tests["summary"]))
    else:
        goals.append(unmeasured_goal("35.tests", "gpu test tier pass rate", "100%", "no GPU run"))
    for row in (report.get("kernels") or {}).get("rows", []):
        what = f"BigBird fwd+bwd of ideal, {'causal' if row['causal'] else 'bidirectional'} L={row['length']}"
        if "of_ideal" in row and not report["dry_run"]:
            note = f"{row['kernel']}, {row['speedup']:.2f}x dense, ideal {row['ideal']:.2f}x"
            goals.append(goal(f"35.kernel.{row['length']}.{int(row['causal'])}", what, row["of_ideal"], 0.5,
                              unit="", note=note))
            if row.get("memory_vs_dense") is not None:
                goals.append(goal(f"35.memory.{row['length']}.{int(row['causal'])}",
                                  f"BigBird peak memory / dense, {'causal' if row['causal'] else 'bidirectional'} "
                                  f"L={row['length']}", row["memory_vs_dense"], 1.5, op="<="))
        else:
            goals.append(unmeasured_goal(f"35.kernel.{row['length']}.{int(row['causal'])}", what, ">= 0.5",
                                         row.get("error") or row.get("skipped") or "no GPU run"))
    training = report.get("training") or {}
    for length, target in ((4096, 1.3), (16384, 3.0)):
        full, itc = training.get(f"full attention, {length}", {}), training.get(f"BigBird-ITC, {length}", {})
        what = f"Table 10 at paper size: ITC / full tokens/s at {length}"
        if full.get("tokens_per_s") and itc.get("tokens_per_s") and not report["dry_run"]:
            goals.append(goal(f"35.table10.{length}", what, itc["tokens_per_s"] / full["tokens_per_s"], target))
        else:
            goals.append(unmeasured_goal(f"35.table10.{length}", what, f">= {target}x",
                                         full.get("error") or itc.get("error") or "no GPU run"))
    for label in ("full attention, 512", "full attention, 4096", "Transformer base, MT"):
        eager, compiled = training.get(label, {}), training.get(f"{label}, compiled", {})
        run = max((r for r in (eager, compiled) if r.get("mfu") is not None), key=lambda r: r["mfu"], default=eager)
        what = f"dense MFU (executed FLOPs, bf16): {label}"
        if run.get("mfu") is not None and not report["dry_run"]:
            note = "hardware.compile=true" if run is compiled else "eager"
            goals.append(goal(f"36.mfu.{label}", what, run["mfu"], 0.40, unit="", digits=3, note=note))
        else:
            goals.append(unmeasured_goal(f"36.mfu.{label}", what, ">= 0.40", run.get("error") or "no GPU run"))
    laptop = report.get("laptop") or {}
    if laptop.get("step_s") and not report["dry_run"]:
        goals.append(goal("36.laptop.step", "Syn. Table 2 En-De laptop preset, median step", laptop["step_s"], 0.015,
                          op="<=", unit=" s", digits=3))
        goals.append(goal("36.laptop.run", "its whole run, launch to record", laptop["wall_s"], 45, op="<=",
                          unit=" s", digits=0))
    else:
        goals.append(unmeasured_goal("36.laptop", "laptop preset step and run time on a GPU", "<= 15 ms, <= 45 s",
                                     laptop.get("error") or laptop.get("skipped") or "no GPU run"))
    return goals


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [f"# GPU check: {env['device']}", "",
             f"{env['device']}{' (' + env['capability'] + ')' if env.get('capability') else ''}, torch "
             f"{env['torch']}, CUDA {env['cuda']}, Triton {env['triton']}; `python benchmarks/gpu_check.py`"
             f"{' --dry-run (CPU: logic only, no GPU figures)' if report['dry_run'] else ''}, "
             f"{report['elapsed_s']:.0f} s.", "", "## Goals", ""]
    lines += [goal_line(g) for g in report["goals"]]
    tests = report.get("tests") or {}
    lines += ["", "## gpu test tier", "", f"`{tests.get('summary', 'not run')}`"]
    lines += [f"- {name}" for name in tests.get("failed", [])]
    lines += ["", "## BigBird attention core vs dense SDPA (fwd + bwd)", "",
              "| L | causal | batch | kernel | dense ms | BigBird ms | speed-up | ideal | of ideal | memory / dense |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in (report.get("kernels") or {}).get("rows", []):
        if "speedup" in r:
            mem = "-" if r["memory_vs_dense"] is None else f"{r['memory_vs_dense']:.2f}"
            lines.append(f"| {r['length']} | {r['causal']} | {r['batch']} | {r['kernel']} | {r['dense_ms']:.2f} | "
                         f"{r['sparse_ms']:.2f} | {r['speedup']:.2f}x | {r['ideal']:.2f}x | {r['of_ideal']:.2f} | "
                         f"{mem} |")
        else:
            lines.append(f"| {r['length']} | {r['causal']} | | {r.get('kernel', '')} | "
                         f"{r.get('error') or r.get('skipped')} | | | | | |")
    lines += ["", "## Training runs (from their records)", "",
              "| run | tokens/s | MFU | step s | peak MB | wall s | note |", "|---|---|---|---|---|---|---|"]
    runs = dict(report.get("training") or {})
    if report.get("laptop"):
        runs[f"laptop {LAPTOP_PRESET}"] = report["laptop"]
    for label, r in runs.items():
        if r.get("tokens_per_s") is not None:
            mfu = "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
            lines.append(f"| {label} | {r['tokens_per_s']:.0f} | {mfu} | {r.get('step_s') or 0:.3f} | "
                         f"{r.get('peak_mem_mb') or 0:.0f} | {r['wall_s']:.0f} | |")
        else:
            lines.append(f"| {label} | | | | | | {r.get('error') or r.get('skipped')} |")
    laptop = report.get("laptop") or {}
    if "cpu_test_bleu" in laptop:
        gpu = (laptop.get("final") or {}).get("test/bleu")
        lines += ["", f"Cross-device: test BLEU on this device {gpu}, committed CPU records "
                      f"{laptop['cpu_test_bleu']} (within their spread: {laptop.get('within_cpu_seed_spread')})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="on CPU, toy sizes: check this script's logic")
    ap.add_argument("--budget-s", type=float, default=480.0, help="the whole check's time budget (seconds)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    ap.add_argument("--out", type=Path, default=None, help="folder for the report (default results/bench/gpu)")
    args = ap.parse_args(argv)
    sections = [s for s in args.only.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        print(f"gpu_check: error: unknown section(s) {', '.join(unknown)}; valid: {', '.join(SECTIONS)}",
              file=sys.stderr)
        return 2
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: error: no CUDA device here; run it on a GPU machine, or --dry-run to check the script "
              "on CPU", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.dry_run else "cuda")
    budget = Budget(args.budget_s)
    started = time.monotonic()
    report: dict = {"dry_run": args.dry_run, "environment": describe_device(device), "sections": sections}
    runs = Path(tempfile.mkdtemp(prefix="attnlab-gpu-check-"))
    try:
        for section in sections:
            print(f"== {section} ({budget.left():.0f} s left)", flush=True)
            try:
                if section == "tests":
                    report["tests"] = run_gpu_tests(args.dry_run, budget)
                elif section == "kernels":
                    report["kernels"] = measure_kernels(device, args.dry_run, budget)
                elif section == "training":
                    report["training"] = measure_training(args.dry_run, budget, runs)
                elif section == "laptop":
                    report["laptop"] = measure_laptop(args.dry_run, budget, runs)
            except Exception as exc:  # noqa: BLE001 - one section's failure must not lose the others' numbers
                report[section] = {"error": f"{exc.__class__.__name__}: {exc}"[:300]}
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    report["elapsed_s"] = time.monotonic() - started
    report["goals"] = goals_of(report)
    out = args.out or (REPO / "results" / "bench" / ("quick/gpu" if args.dry_run else "gpu"))
    out.mkdir(parents=True, exist_ok=True)
    name = "dry-run" if args.dry_run else device_slug(report["environment"]["device"])
    (out / f"{name}.json").write_text(json.dumps(report, indent=1, default=str))
    (out / f"{name}.md").write_text(markdown(report))
    print(f"report: {out / (name + '.md')}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
