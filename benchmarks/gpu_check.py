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
import contextlib
import io
import itertools
import json
import os
import re
import shlex
import shutil
import signal
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
# Each section's share of the budget: its time box is this share of the time left, over the shares of the
# sections still to run (time a section leaves unused goes to the later ones), so every section runs, the
# laptop run included, whatever the order.
SECTION_SHARE = {"tests": 0.2, "kernels": 0.3, "training": 0.35, "laptop": 0.15}
STDERR_TAIL = 40  # lines of a failed run's stderr kept in the report
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


_RUN_NUMBERS = itertools.count()  # run folders of one check: run0, run1, ... (a failed one is moved away)


class Budget:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def box(self, section: str, remaining: list[str]) -> Budget:
        """The time box of ``section`` when ``remaining`` (itself first) are still to run."""
        share = SECTION_SHARE[section] / sum(SECTION_SHARE[s] for s in remaining)
        return Budget(max(0.0, self.left() * share))


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
def gpu_test_files() -> list[str]:
    """The test files that hold ``gpu``-marked tests. pytest is given only these: collecting the whole suite
    (about 2,900 tests) to run the ~90 gpu ones took 156 s of a 10-minute GPU call."""
    files = (REPO / "tests").rglob("test_*.py")
    return sorted(str(p.relative_to(REPO)) for p in files if re.search(r"\bmark\.gpu\b", p.read_text()))


def run_gpu_tests(dry_run: bool, budget: Budget) -> dict:
    files = gpu_test_files()
    args = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *files]
    if dry_run:
        args.append("--collect-only")
    try:
        proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=max(10, budget.left() - 5))
    except subprocess.TimeoutExpired as exc:
        return {"summary": f"timed out after {exc.timeout:.0f} s (its time box)", "counts": {}, "files": files,
                "stdout_tail": _tail(exc.stdout), "exit_code": None}
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-300:]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|tests? collected)", tail)}
    failed = [ln.split(" ", 1)[1] for ln in proc.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    return {"summary": tail, "counts": counts, "failed": failed[:20], "exit_code": proc.returncode, "files": files}


def _tail(text, lines: int = STDERR_TAIL) -> list[str]:
    """The last ``lines`` lines of a process's output (str, bytes or None)."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "").rstrip().splitlines()[-lines:]


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


def _kernel_fn(name: str):
    from attnlab.attention.kernels.blocksparse_blocked import blocked_blocksparse_attention
    from attnlab.attention.kernels.blocksparse_flex import flex_blocksparse_attention
    from attnlab.attention.kernels.blocksparse_triton import triton_blocksparse_attention

    return {"flex": flex_blocksparse_attention, "blocked": blocked_blocksparse_attention,
            "triton": triton_blocksparse_attention}[name]


def _error(exc: Exception) -> str:
    return f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


def kernel_row(device: torch.device, length: int, causal: bool, *, heads: int, head_dim: int, dtype: torch.dtype,
               batch: int, repeats: int, kernels: list[str]) -> dict:
    """One length and direction: dense SDPA and each sparse kernel (the one BigBird's ``impl=auto`` picks
    first, then ``kernels``), fwd + bwd and fwd alone. A kernel that fails is a result of its own row."""
    module = _bigbird_module(length, causal, heads, head_dim, device)
    plan = module.plan_for_length(length, device)
    chosen = module.kernel_for(device, True, dtype=dtype, length=length, padded=False)
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, grad = (torch.randn(batch, heads, length, head_dim, device=device, dtype=dtype, generator=g)
                     for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    ideal = ideal_ratio(plan, causal)
    row = {"length": length, "causal": causal, "batch": batch, "kernel": chosen, "ideal": ideal, "kernels": {}}
    try:
        dense_t, dense_mem = _timed(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(grad), device, repeats)
        with torch.no_grad():
            dense_fwd, _ = _timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), device, repeats)
    except Exception as exc:  # noqa: BLE001 - a failing baseline is a result to report
        row["error"] = f"dense SDPA: {_error(exc)}"
        return row
    row.update(dense_ms=1e3 * statistics.median(dense_t), dense_fwd_ms=1e3 * statistics.median(dense_fwd))
    for name in dict.fromkeys([chosen, *kernels]):
        fn = _kernel_fn(name)
        try:
            sparse_t, sparse_mem = _timed(lambda fn=fn: fn(q, k, v, plan).backward(grad), device, repeats)
            with torch.no_grad():
                sparse_fwd, _ = _timed(lambda fn=fn: fn(q, k, v, plan), device, repeats)
        except Exception as exc:  # noqa: BLE001 - a failing kernel is a result to report
            row["kernels"][name] = {"error": _error(exc)}
            continue
        speedup = statistics.median(dense_t) / statistics.median(sparse_t)
        row["kernels"][name] = {
            "ms": 1e3 * statistics.median(sparse_t), "fwd_ms": 1e3 * statistics.median(sparse_fwd),
            "speedup": speedup, "fwd_speedup": statistics.median(dense_fwd) / statistics.median(sparse_fwd),
            "of_ideal": speedup / ideal, "memory_vs_dense": (sparse_mem / dense_mem) if dense_mem else None}
        print(f"kernels: {'causal' if causal else 'bidir.'} L={length} {name}: {speedup:.2f}x dense fwd+bwd "
              f"(ideal {ideal:.2f}x, {speedup / ideal:.2f} of it)", flush=True)
    first = row["kernels"].get(chosen, {})
    if "speedup" in first:
        row.update(sparse_ms=first["ms"], speedup=first["speedup"], of_ideal=first["of_ideal"],
                   memory_vs_dense=first["memory_vs_dense"])
    else:
        row["error"] = first.get("error", "not run")
    return row


def triton_configs_row(device: torch.device, length: int, *, heads: int, head_dim: int, dtype: torch.dtype,
                       batch: int, repeats: int, budget: Budget) -> dict:
    """The Triton kernel's fwd + bwd at ``length`` (bidirectional) under each launch setting of
    ``TRITON_CONFIGS``: the fastest is the one to make the default (``blocksparse_triton.LAUNCH``)."""
    from attnlab.attention.kernels import blocksparse_triton as bt

    module = _bigbird_module(length, False, heads, head_dim, device)
    plan = module.plan_for_length(length, device)
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, grad = (torch.randn(batch, heads, length, head_dim, device=device, dtype=dtype, generator=g)
                     for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    default, rows = dict(bt.LAUNCH), []
    try:
        for config in bt.TRITON_CONFIGS:
            if budget.left() < 20:
                rows.append({**config, "skipped": "time box"})
                continue
            bt.LAUNCH.clear()
            bt.LAUNCH.update(config)
            try:
                times, _ = _timed(lambda: bt.triton_blocksparse_attention(q, k, v, plan).backward(grad), device,
                                  repeats)
                rows.append({**config, "ms": 1e3 * statistics.median(times)})
            except Exception as exc:  # noqa: BLE001 - a config that does not compile is a result
                rows.append({**config, "error": _error(exc)})
    finally:
        bt.LAUNCH.clear()
        bt.LAUNCH.update(default)
    timed = [r for r in rows if "ms" in r]
    best = min(timed, key=lambda r: r["ms"]) if timed else None
    return {"length": length, "configs": rows, "best": best, "default": default}


def measure_kernels(device: torch.device, dry_run: bool, budget: Budget, save=lambda: None) -> dict:
    """The kernel rows, each saved as it finishes (``save``). The dry run times the Triton kernel (in the
    interpreter, when it is on) at its first row only: the interpreter takes seconds per call."""
    from attnlab.attention.kernels.blocksparse_triton import triton_unavailable

    lengths = (256, 512) if dry_run else KERNEL_LENGTHS
    heads, head_dim = (2, 16) if dry_run else (HEADS, HEAD_DIM)
    tokens = 1024 if dry_run else KERNEL_TOKENS
    dtype = torch.float32 if dry_run else torch.bfloat16
    repeats = 2 if dry_run else 10
    extra = [name for name in ("triton", "flex") if name != "triton" or triton_unavailable(device) is None]
    if device.type != "cuda":
        extra = [name for name in extra if name == "triton"]  # compiled flex has no CPU backward
    section = {"rows": [], "dtype": str(dtype), "heads": heads, "head_dim": head_dim, "plan": PLAN}
    rows = section["rows"]
    for causal in (False, True):
        for length in lengths:
            if budget.left() < 30:
                rows.append({"length": length, "causal": causal, "skipped": "time box"})
                continue
            kernels = extra if (not dry_run or not rows) else []
            try:
                rows.append(kernel_row(device, length, causal, heads=heads, head_dim=head_dim, dtype=dtype,
                                       batch=max(1, tokens // length), repeats=repeats, kernels=kernels))
            except Exception as exc:  # noqa: BLE001 - one row's failure must not drop the section
                rows.append({"length": length, "causal": causal, "error": _error(exc)})
            save(section)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if device.type == "cuda" and "triton" in extra and budget.left() > 60:
        length = 16384
        try:
            section["triton_configs"] = triton_configs_row(device, length, heads=heads, head_dim=head_dim,
                                                           dtype=dtype, batch=max(1, tokens // length),
                                                           repeats=repeats, budget=budget)
        except Exception as exc:  # noqa: BLE001
            section["triton_configs"] = {"error": _error(exc)}
        save(section)
    return section


# -- 3 and 4: training runs through attnlab-train -----------------------------------------------------------
def train(overrides: list[str], runs: Path, timeout: float, failed_runs: Path | None = None) -> dict:
    """One ``attnlab-train`` run in a fresh process; its record (or why there is none) and wall time. A failed
    run keeps its folder (moved under ``failed_runs``) and the last lines of its stderr."""
    run_dir = runs / f"run{next(_RUN_NUMBERS)}"
    cmd = [sys.executable, "-m", "attnlab.train", *overrides, f"hydra.run.dir={run_dir}", "logger=csv",
           "trainer.enable_progress_bar=false"]
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p)}
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=max(30, timeout))
        error, stderr = None, proc.stderr
    except subprocess.TimeoutExpired as exc:
        proc, error, stderr = None, f"timed out after {timeout:.0f} s", exc.stderr
    wall = time.monotonic() - started
    record_path = run_dir / RECORD_FILENAME
    if error is None and (proc.returncode != 0 or not record_path.is_file()):
        lines = [ln for ln in (stderr or "").strip().splitlines() if ln.strip()]
        error = (lines[-1] if lines else f"exit {proc.returncode}")[:300]
    if error is not None:
        result = {"error": error, "wall_s": wall, "stderr_tail": _tail(stderr), "command": shlex.join(cmd)}
        if failed_runs is not None and run_dir.exists():
            failed_runs.mkdir(parents=True, exist_ok=True)
            kept = failed_runs / f"{run_dir.name}-{int(time.time())}"  # a rerun's report folder keeps both
            shutil.move(str(run_dir), kept)
            result["folder"] = str(kept)
        return result
    record = json.loads(record_path.read_text())
    cost = record["cost"]
    keys = ("tokens_per_s", "step_s", "mfu", "steady_tokens_per_s", "steady_step_s", "steady_mfu", "steady_steps",
            "peak_mem_mb", "startup_s", "steps")
    return {"wall_s": wall, "record_wall_s": cost.get("wall_s"), **{k: cost.get(k) for k in keys},
            "attention_kernels": record.get("extra", {}).get("attention_kernels"), "final": record["metrics"]["final"]}


def measure_training(dry_run: bool, budget: Budget, runs: Path, save=lambda value: None,
                     failed_runs: Path | None = None) -> dict:
    if dry_run:
        common = ["scale=cpu", "hardware=cpu", "trainer.max_steps=2", "trainer.val_check_interval=2",
                  "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "batch.sentences_per_update=2",
                  "task.max_train_tokens=40000", "task.max_val_tokens=9000", "task.max_test_tokens=9000"]
        # the two 4096-token rows at 512 tokens: the dry run checks the path, a CPU cannot train 4096 in its box
        small = ["task.block_len=512", "model.max_len=512"]
        rows = [(label, exp, [*(e for e in extra if e.split("=")[0] not in ("task.block_len", "model.max_len")),
                              *small]) for label, exp, extra in TRAINING_ROWS[1:3]]
    else:
        common = ["scale=paper", "hardware=gpu1", "trainer.max_steps=30", "trainer.val_check_interval=30",
                  "trainer.limit_val_batches=1", "trainer.limit_test_batches=2", "batch.sentences_per_update=16",
                  "trainer.num_sanity_val_steps=0"]
        rows = TRAINING_ROWS
    out: dict = {}
    for label, experiment, extra in rows:
        if budget.left() < 90:
            out[label] = {"skipped": "time box"}
            continue
        try:
            out[label] = train([f"experiment={experiment}", *common, *extra], runs, timeout=budget.left() - 30,
                               failed_runs=failed_runs)
        except Exception as exc:  # noqa: BLE001 - one row's failure must not drop the section
            out[label] = {"error": _error(exc)}
        print(f"training: {label}: {out[label].get('steady_tokens_per_s') or out[label].get('error')}", flush=True)
        save(out)
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


def measure_laptop(dry_run: bool, budget: Budget, runs: Path, failed_runs: Path | None = None) -> dict:
    if budget.left() < 60:
        return {"skipped": "time box"}
    extra = (["hardware=cpu", "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=1",
              "trainer.limit_test_batches=1"] if dry_run else ["hardware=gpu1"])
    result = train([f"experiment={LAPTOP_PRESET}", "seed=1", *extra], runs, timeout=budget.left() - 10,
                   failed_runs=failed_runs)
    cpu = committed_cpu_metrics(LAPTOP_PRESET, "test/bleu")
    result["cpu_test_bleu"] = cpu
    gpu = (result.get("final") or {}).get("test/bleu")
    if gpu is not None and cpu:
        result["within_cpu_seed_spread"] = min(cpu) <= gpu <= max(cpu)
    return result


# -- the report -------------------------------------------------------------------------------------------
def _speed(run: dict) -> float | None:
    """A training row's tokens/s: the steady state where the record has it, else the whole-run average."""
    return run.get("steady_tokens_per_s") or run.get("tokens_per_s")


def _mfu(run: dict) -> float | None:
    return run.get("steady_mfu") if run.get("steady_mfu") is not None else run.get("mfu")


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
        if _speed(full) and _speed(itc) and not report["dry_run"]:
            note = "steady state" if full.get("steady_tokens_per_s") and itc.get("steady_tokens_per_s") else ""
            if full.get("tokens_per_s") and itc.get("tokens_per_s"):
                note += f"; whole-run averages {itc['tokens_per_s'] / full['tokens_per_s']:.2f}x"
            goals.append(goal(f"35.table10.{length}", what, _speed(itc) / _speed(full), target,
                              note=note.strip("; ")))
        else:
            goals.append(unmeasured_goal(f"35.table10.{length}", what, f">= {target}x",
                                         full.get("error") or itc.get("error") or "no GPU run"))
    for label in ("full attention, 512", "full attention, 4096", "Transformer base, MT"):
        eager, compiled = training.get(label, {}), training.get(f"{label}, compiled", {})
        run = max((r for r in (eager, compiled) if _mfu(r) is not None), key=_mfu, default=eager)
        what = f"dense MFU (executed FLOPs, bf16): {label}"
        if _mfu(run) is not None and not report["dry_run"]:
            note = "hardware.compile=true" if run is compiled else "eager"
            if run.get("steady_mfu") is not None and run.get("mfu") is not None:
                note += f", steady state (whole run {run['mfu']:.3f})"
            goals.append(goal(f"36.mfu.{label}", what, _mfu(run), 0.40, unit="", digits=3, note=note))
        else:
            goals.append(unmeasured_goal(f"36.mfu.{label}", what, ">= 0.40", run.get("error") or "no GPU run"))
    laptop = report.get("laptop") or {}
    step = laptop.get("steady_step_s") or laptop.get("step_s")  # the steady state where the record has it
    if step and not report["dry_run"]:
        goals.append(goal("36.laptop.step", "Syn. Table 2 En-De laptop preset, step after warm-up", step, 0.015,
                          op="<=", unit=" s", digits=3))
        goals.append(goal("36.laptop.run", "its whole run, launch to record", laptop["wall_s"], 45, op="<=",
                          unit=" s", digits=0))
    else:
        goals.append(unmeasured_goal("36.laptop", "laptop preset step and run time on a GPU", "<= 15 ms, <= 45 s",
                                     laptop.get("error") or laptop.get("skipped") or "no GPU run"))
    return goals


def _kernel_lines(report: dict) -> list[str]:
    lines = ["", "## BigBird attention core vs dense SDPA", "",
             "fwd + bwd and fwd alone; the first kernel of each row is the one `impl=auto` picked.", "",
             "| L | causal | batch | kernel | dense ms | kernel ms | speed-up | ideal | of ideal | fwd speed-up "
             "| memory / dense |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    section = report.get("kernels") or {}
    for r in section.get("rows", []):
        head = f"| {r['length']} | {r['causal']} | {r.get('batch', '')} |"
        if not r.get("kernels"):
            lines.append(f"{head} {r.get('kernel', '')} | {r.get('error') or r.get('skipped')} | | | | | | |")
        for name, k in r.get("kernels", {}).items():
            if "speedup" in k:
                mem = "-" if k["memory_vs_dense"] is None else f"{k['memory_vs_dense']:.2f}"
                lines.append(f"{head} {name} | {r['dense_ms']:.2f} | {k['ms']:.2f} | {k['speedup']:.2f}x | "
                             f"{r['ideal']:.2f}x | {k['of_ideal']:.2f} | {k['fwd_speedup']:.2f}x | {mem} |")
            else:
                lines.append(f"{head} {name} | {k.get('error')} | | | | | | |")
    configs = section.get("triton_configs") or {}
    if configs.get("configs"):
        lines += ["", f"Triton launch settings at L={configs['length']} (fwd + bwd, bidirectional; default "
                      f"{configs['default']}):", ""]
        lines += [f"- warps {c['num_warps']}, stages {c['num_stages']}: "
                  f"{_config_time(c)}"
                  for c in configs["configs"]]
        if configs.get("best"):
            lines.append(f"- fastest: {configs['best']}")
    elif configs.get("error"):
        lines += ["", f"Triton launch settings: {configs['error']}"]
    return lines


def _config_time(config: dict) -> str:
    return f"{config['ms']:.2f} ms" if "ms" in config else str(config.get("error") or config.get("skipped"))


def _training_lines(report: dict) -> list[str]:
    lines = ["", "## Training runs (from their records)", "",
             "Steady state: the steps after the warm-up (a tenth of the run, 2-50 steps); whole run: every step.",
             "", "| run | tokens/s steady | tokens/s whole run | MFU steady | MFU whole run | step s steady | peak MB "
             "| wall s | kernels | note |", "|---|---|---|---|---|---|---|---|---|---|"]
    runs = dict(report.get("training") or {})
    if report.get("laptop"):
        runs[f"laptop {LAPTOP_PRESET}"] = report["laptop"]

    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    failures = []
    for label, r in runs.items():
        if r.get("tokens_per_s") is not None:
            mfu_s = None if r.get("steady_mfu") is None else 100 * r["steady_mfu"]
            mfu_w = None if r.get("mfu") is None else 100 * r["mfu"]
            lines.append(f"| {label} | {num(r.get('steady_tokens_per_s'), '.0f')} | {r['tokens_per_s']:.0f} | "
                         f"{num(mfu_s, '.1f')}% | {num(mfu_w, '.1f')}% | {num(r.get('steady_step_s'), '.3f')} | "
                         f"{num(r.get('peak_mem_mb'), '.0f')} | {r['wall_s']:.0f} | "
                         f"{', '.join(r.get('attention_kernels') or [])} | |")
        else:
            lines.append(f"| {label} | | | | | | | | | {r.get('error') or r.get('skipped')} |")
        if r.get("stderr_tail"):
            failures += ["", f"### {label}: failed ({r.get('folder') or 'no folder'})", "", f"`{r.get('command')}`",
                         "", "```", *r["stderr_tail"], "```"]
    return lines + failures


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [f"# GPU check: {env['device']}", "",
             f"{env['device']}{' (' + env['capability'] + ')' if env.get('capability') else ''}, torch "
             f"{env['torch']}, CUDA {env['cuda']}, Triton {env['triton']}; `python benchmarks/gpu_check.py`"
             f"{' --dry-run (CPU: logic only, no GPU figures)' if report['dry_run'] else ''}, "
             f"{report['elapsed_s']:.0f} s{'' if report.get('finished') else ' so far (the check did not finish)'}.",
             "", "## Goals", ""]
    lines += [goal_line(g) for g in report["goals"]]
    boxes = report.get("boxes") or {}
    if boxes:
        lines += ["", "## Sections and their time boxes", "", "| section | box s | used s | within |",
                  "|---|---|---|---|"]
        lines += [f"| {name} | {b['box_s']:.0f} | {num_or_dash(b.get('used_s'))} | "
                  f"{'-' if b.get('used_s') is None else b['used_s'] <= b['box_s'] + 5} |" for name, b in boxes.items()]
    tests = report.get("tests") or {}
    lines += ["", "## gpu test tier", "", f"`{tests.get('summary', 'not run')}`"]
    lines += [f"- {name}" for name in tests.get("failed", [])]
    lines += _kernel_lines(report)
    lines += _training_lines(report)
    laptop = report.get("laptop") or {}
    if "cpu_test_bleu" in laptop:
        gpu = (laptop.get("final") or {}).get("test/bleu")
        lines += ["", f"Cross-device: test BLEU on this device {gpu}, committed CPU records "
                      f"{laptop['cpu_test_bleu']} (within their spread: {laptop.get('within_cpu_seed_spread')})."]
    return "\n".join(lines) + "\n"


def num_or_dash(value) -> str:
    return "-" if value is None else f"{value:.0f}"


class ReportWriter:
    """Writes ``<name>.json`` and ``.md`` now and after every measured row (each file replaced whole), so a
    timeout or a SIGTERM leaves every measured row on disk."""

    def __init__(self, report: dict, out: Path, name: str, started: float) -> None:
        self.report, self.out, self.name, self.started = report, out, name, started
        out.mkdir(parents=True, exist_ok=True)

    def put(self, section: str, value) -> None:
        self.report[section] = value
        self.save()

    def save(self, final: bool = False) -> Path:
        """Write the report; ``final`` also prints the goals (each save judges them again, quietly)."""
        self.report["elapsed_s"] = time.monotonic() - self.started
        with contextlib.redirect_stdout(sys.stdout if final else io.StringIO()):
            self.report["goals"] = goals_of(self.report)
        for suffix, text in ((".json", json.dumps(self.report, indent=1, default=str)),
                             (".md", markdown(self.report))):
            path = self.out / f"{self.name}{suffix}"
            partial = path.with_name(path.name + ".partial")
            partial.write_text(text)
            partial.replace(path)
        return self.out / f"{self.name}.md"


def _terminated(signum, frame):
    raise SystemExit(128 + signum)


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
    report: dict = {"dry_run": args.dry_run, "environment": describe_device(device), "sections": sections,
                    "boxes": {}, "finished": False}
    out = args.out or (REPO / "results" / "bench" / ("quick/gpu" if args.dry_run else "gpu"))
    name = "dry-run" if args.dry_run else device_slug(report["environment"]["device"])
    writer = ReportWriter(report, out, name, started)
    failed_runs = out / f"{name}-failed-runs"
    runs = Path(tempfile.mkdtemp(prefix="attnlab-gpu-check-"))
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        writer.save()
        for index, section in enumerate(sections):
            box = budget.box(section, sections[index:])
            report["boxes"][section] = {"box_s": box.seconds}
            print(f"== {section} ({box.seconds:.0f} s box, {budget.left():.0f} s left)", flush=True)
            section_started = time.monotonic()
            try:
                if section == "tests":
                    report["tests"] = run_gpu_tests(args.dry_run, box)
                elif section == "kernels":
                    report["kernels"] = measure_kernels(device, args.dry_run, box,
                                                        lambda value: writer.put("kernels", value))
                elif section == "training":
                    report["training"] = measure_training(args.dry_run, box, runs,
                                                          lambda value: writer.put("training", value), failed_runs)
                elif section == "laptop":
                    report["laptop"] = measure_laptop(args.dry_run, box, runs, failed_runs)
            except Exception as exc:  # noqa: BLE001 - one section's failure must not lose the others' numbers
                report[section] = {**(report.get(section) or {}), "error": _error(exc)}
            report["boxes"][section]["used_s"] = time.monotonic() - section_started
            writer.save()
        report["finished"] = True
    finally:
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(runs, ignore_errors=True)
        path = writer.save(final=True)
        print(f"report: {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
