"""BigBird block-sparse attention on CPU vs dense SDPA, transformers' BigBird and compiled FlexAttention
(issue 7 goals 1-3; issue 16 goals 4 and 4b: per-head, per-layer random plans, efficiency against the
ideal ratio dense FLOPs / plan FLOPs, peak memory against fused dense SDPA); time and memory vs L for
every variant (results/bench/bigbird.{md,json,png}).

    python benchmarks/bench_bigbird.py [--repeats 5] [--quick]

Shapes (issue 7): batch 1, 8 heads, head dim 64, fp32; BigBird block 64, window 3, 2 global, 3 random,
one random plan per head (the module's default).
Attention core = q, k, v in, output out (projections excluded); "layer" = the attnlab attention module
(q/k/v/output projections included), input (1, L, 512). Timings are interleaved in one process; ratios
are per round (baseline / candidate) with min/median/max over rounds. Memory is the peak RSS growth of one
call in a fresh subprocess per case (after a warm-up call).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import (  # noqa: E402
    RESULTS,
    fmt,
    goal,
    goal_line,
    interleaved,
    machine,
    memory_in_subprocess,
    peak_extra_bytes,
    plot_vs_length,
    ratios,
    stats,
    unmeasured_goal,
    write_results,
)

B, H, D, BS = 1, 8, 64, 64
SCRIPT = Path(__file__).resolve()


def _bigbird(length: int, causal: bool, impl: str = "blocked"):
    from attnlab.attention import build_attention

    torch.manual_seed(0)
    return build_attention("bigbird", d_model=H * D, num_heads=H, max_len=length, causal=causal, impl=impl,
                           block_size=BS, window_blocks=3, num_global_blocks=2, num_random_blocks=3)


def make_case(name: str, length: int):
    """A zero-argument callable running the named case once (inputs built here, outside the timing)."""
    causal = name.endswith("_causal")
    base = name.removesuffix("_causal")
    g = torch.Generator().manual_seed(0)
    fwd_only = base.endswith("_fwd")
    q, k, v = (torch.randn(B, H, length, D, generator=g).requires_grad_(not fwd_only) for _ in range(3))
    grad = torch.randn(B, H, length, D, generator=g)

    def clear():
        for t in (q, k, v):
            t.grad = None

    if base.startswith("layer_"):
        kind = base.removeprefix("layer_")
        if kind == "vanilla":
            from attnlab.attention import build_attention

            torch.manual_seed(0)
            mod = build_attention("vanilla", d_model=H * D, num_heads=H, max_len=length, causal=causal)
        else:
            mod = _bigbird(length, causal)
        mod.train()
        x = torch.randn(B, length, H * D, generator=g, requires_grad=True)
        gx = torch.randn(B, length, H * D, generator=g)

        def run():
            mod.zero_grad(set_to_none=True)
            x.grad = None
            mod(x).backward(gx)
        return run

    if base in ("dense", "dense_fwd"):
        def run():
            clear()
            with torch.set_grad_enabled(not fwd_only):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                if not fwd_only:
                    o.backward(grad)
        return run

    if base == "hf":
        from transformers.models.big_bird.modeling_big_bird import (
            BigBirdBlockSparseAttention,
            BigBirdConfig,
            BigBirdModel,
        )

        cfg = BigBirdConfig(hidden_size=H * D, num_attention_heads=H, block_size=BS, num_random_blocks=3,
                            attention_type="block_sparse", max_position_embeddings=length)
        hf = BigBirdBlockSparseAttention(cfg, seed=0).train()
        blocked_mask, band, from_mask, to_mask = BigBirdModel.create_masks_for_block_sparse_attn(
            torch.ones(B, length), BS)

        def run():
            clear()
            o, _ = hf.bigbird_block_sparse_attention(
                q, k, v, band, from_mask, to_mask, blocked_mask, blocked_mask, H, 3, D, BS, BS, B, length, length,
                seed=0, plan_from_length=None, plan_num_rand_blocks=None)
            o.backward(grad.transpose(1, 2).reshape(o.shape))
        return run

    module = _bigbird(length, causal)
    plan = module.plan_for_length(length)
    if base in ("blocked", "reference", "blocked_recompute", "blocked_saveprobs"):
        from attnlab.attention.kernels.blocksparse_blocked import blocked_blocksparse_attention
        from attnlab.attention.kernels.blocksparse_reference import blocksparse_attention

        fn = {"blocked": blocked_blocksparse_attention, "reference": blocksparse_attention,
              "blocked_recompute": lambda *a: blocked_blocksparse_attention(*a, save_probs=False),
              "blocked_saveprobs": lambda *a: blocked_blocksparse_attention(*a, save_probs=True)}[base]

        def run():
            clear()
            fn(q, k, v, plan).backward(grad)
        return run
    if base == "blocked_fwd":
        from attnlab.attention.kernels.blocksparse_blocked import blocked_blocksparse_attention

        def run():
            with torch.no_grad():
                blocked_blocksparse_attention(q, k, v, plan)
        return run
    if base == "flex_fwd":
        from attnlab.attention.kernels.blocksparse_flex import flex_blocksparse_attention, plan_to_block_mask

        mask = plan_to_block_mask(plan, None, B)

        def run():
            with torch.no_grad():
                flex_blocksparse_attention(q, k, v, plan, block_mask=mask)
        return run
    raise SystemExit(f"unknown case {name}")


def ideal_ratio(length: int, causal: bool) -> float:
    """Dense score FLOPs / the plan's score FLOPs (both in key blocks per query block, averaged over the
    heads' plans): the speed-up a kernel as efficient as dense SDPA would reach. Causal dense counts the
    lower triangle of blocks (causal SDPA skips the rest)."""
    plan = _bigbird(length, causal).plan_for_length(length)
    n = plan.num_blocks
    plan_blocks = plan.key_valid.sum().item() / plan.plan_heads + plan.dense_rows.numel() * n
    dense_blocks = n * (n + 1) / 2 if causal else n * n
    return dense_blocks / plan_blocks


def memory(name: str, length: int) -> int | None:
    return memory_in_subprocess(SCRIPT, ["--memory-case", name, "--length", str(length)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer lengths and repeats (smoke run)")
    ap.add_argument("--memory-case")
    ap.add_argument("--length", type=int)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.memory_case:
        print(f"PEAK_BYTES={peak_extra_bytes(make_case(a.memory_case, a.length))}", flush=True)
        return
    reps = 2 if a.quick else a.repeats
    L0 = 4096
    lines = ["# BigBird block-sparse attention on CPU (issue 7, goals 1-3)", "", f"Machine: {machine()}", "",
             "Ratios are baseline time / candidate time per interleaved round: min/median/max over "
             f"{reps} rounds. Times in ms as min/median/max. Memory: peak RSS growth of one call in a "
             "fresh subprocess (MiB).", ""]
    data: dict = {"machine": machine(), "repeats": reps}
    # The Hugging Face baseline needs the `bench` extra, which `make install` does not install.
    has_hf = importlib.util.find_spec("transformers") is not None
    if not has_hf:
        skip = ("skipping the Hugging Face BigBird baseline: transformers is not installed (add it with "
                "`.venv/bin/pip install 'transformers>=4.40'`, the `bench` extra of pyproject.toml)")
        print(skip, flush=True)
        lines += [skip, ""]
    why_no_hf = "transformers is not installed (the `bench` extra)"

    goals: list[dict] = []

    def note(record):
        goals.append(record)
        lines.append(goal_line(record))

    if not has_hf:
        note(unmeasured_goal("7.1", "hf / blocked, fwd+bwd, bidirectional, L=4096", ">= 2.5x", why_no_hf))
        note(unmeasured_goal("7.1", "blocked / hf peak extra memory, L=4096", "<= 0.25", why_no_hf))

    def timed(title, cases, pairs, length):
        """Interleaved rounds of ``cases``; ``pairs``: (baseline, candidate, target or None, goal key)."""
        cases = [n for n in cases if has_hf or n != "hf"]
        pairs = [p for p in pairs if has_hf or "hf" not in p[:2]]
        print(f"== {title} (L={length})", flush=True)
        fns = {n: make_case(n, length) for n in cases}
        t = interleaved(fns, reps)
        del fns
        res = {"times": {n: stats(v) for n, v in t.items()}, "ratios": {}}
        lines.append(f"## {title} (L={length})")
        lines.append("")
        lines.append("| case | time ms (min/med/max) |")
        lines.append("|---|---|")
        for n in cases:
            lines.append(f"| {n} | {fmt(res['times'][n], scale=1e3, digits=1)} |")
        lines.append("")
        for base, cand, target, key in pairs:
            r = ratios(t, base, cand)
            res["ratios"][f"{base}/{cand}"] = r
            note(goal(key, f"{base} / {cand}, {title.split(': ', 1)[-1]}, L={length}", r, target))
        lines.append("")
        data[f"{title} L={length}"] = res
        return res

    def efficiency(res, base, cand, length, causal, target):
        r = res["ratios"][f"{base}/{cand}"]
        ideal = ideal_ratio(length, causal)
        eff = {k: v / ideal for k, v in r.items()}
        note(goal("16.4", f"{base} / {cand} against the ideal ratio, L={length}", eff, target, unit=" of ideal",
                  note=f"ideal {ideal:.2f}x, measured {fmt(r, 'x')}"))
        lines.append("")
        data.setdefault("efficiency", {})[f"{base}/{cand} L={length}"] = {"ideal": ideal, "efficiency": eff}

    # Goal 1 (issue 7) and 4 (issue 16): training step of the attention core, per-head plans
    res = timed("Goal 1/4: fwd+bwd, bidirectional", ["dense", "hf", "blocked"],
                [("dense", "blocked", 5.0, "7.1"), ("hf", "blocked", 2.5, "7.1")], L0)
    efficiency(res, "dense", "blocked", L0, False, 0.8)
    if not a.quick:
        res = timed("Goal 4: fwd+bwd, bidirectional", ["dense", "blocked"], [("dense", "blocked", None, "16.4")],
                    4 * L0)
        efficiency(res, "dense", "blocked", 4 * L0, False, 0.8)
    mem = {n: memory(n, L0) if has_hf or n != "hf" else None for n in ("hf", "blocked", "dense")}
    mem_16k = memory("blocked", 4 * L0)
    lines.append("Memory at L=4096 (MiB): " + ", ".join(
        f"{n} {m / 2**20:.0f}" if m is not None else f"{n} n/a" for n, m in mem.items()))
    lines.append("")
    if mem["hf"] and mem["blocked"]:
        note(goal("7.1", "blocked / hf peak extra memory, L=4096", mem["blocked"] / mem["hf"], 0.25, "<=", unit="",
                  digits=3, note=f"{mem['blocked'] / 2**20:.0f} vs {mem['hf'] / 2**20:.0f} MiB"))
    if mem_16k and mem["blocked"]:
        note(goal("16.4", "blocked peak extra memory, L=16384 / L=4096", mem_16k / mem["blocked"], 4.5, "<=",
                  note=f"{mem_16k / 2**20:.0f} vs {mem['blocked'] / 2**20:.0f} MiB"))
    # Goal 4b (issue 16): peak extra memory of fwd+bwd against fused dense SDPA at the same length
    mem_4b = {}
    for length in (L0,) if a.quick else (L0, 4 * L0):
        for causal in (False, True):
            suffix = "_causal" if causal else ""
            pair = {n: (mem.get(n) if length == L0 and not causal else None) or memory(n + suffix, length)
                    for n in ("blocked", "dense")}
            if pair["blocked"] and pair["dense"]:
                note(goal("16.4b", f"blocked{suffix} / dense{suffix} SDPA peak extra memory, L={length}",
                          pair["blocked"] / pair["dense"], 2.0, "<=",
                          note=f"{pair['blocked'] / 2**20:.0f} vs {pair['dense'] / 2**20:.0f} MiB"))
            mem_4b[f"{length}{suffix}"] = pair
    lines.append("")
    data["memory_goal1"] = {"L4096": mem, "blocked_L16384": mem_16k}
    data["memory_goal4b"] = mem_4b

    # Goal 2: forward vs compiled flex (compilation happens in the warm-up round, outside the timing)
    for length in (4096, 8192):
        timed("Goal 2: forward vs compiled flex_attention", ["flex_fwd", "blocked_fwd"],
              [("flex_fwd", "blocked_fwd", 0.9, "7.2")], length)

    # Goal 3: causal, and whole layers
    res = timed("Goal 3/4: fwd+bwd, causal", ["dense_causal", "blocked_causal"],
                [("dense_causal", "blocked_causal", 5.0, "7.3")], L0)
    efficiency(res, "dense_causal", "blocked_causal", L0, True, 0.7)
    if not a.quick:
        res = timed("Goal 4: fwd+bwd, causal", ["dense_causal", "blocked_causal"],
                    [("dense_causal", "blocked_causal", None, "16.4")], 4 * L0)
        efficiency(res, "dense_causal", "blocked_causal", 4 * L0, True, 0.7)
    mem_c = {n: memory(n, L0) for n in ("dense_causal", "blocked_causal")}
    lines.append("Memory at L=4096 (MiB): " + ", ".join(
        f"{n} {m / 2**20:.0f}" if m is not None else f"{n} n/a" for n, m in mem_c.items()))
    lines.append("")
    timed("Goal 3: whole attention layers (projections included), fwd+bwd",
          ["layer_vanilla", "layer_bigbird", "layer_vanilla_causal", "layer_bigbird_causal"],
          [("layer_vanilla", "layer_bigbird", None, "7.3"), ("layer_vanilla_causal", "layer_bigbird_causal", None,
                                                             "7.3")], L0)

    # Sweep: time and memory vs L for every variant
    lengths = [1024, 4096] if a.quick else [1024, 2048, 4096, 8192, 16384]
    variants = {"dense": 8192, "hf": 8192, "reference": 8192, "blocked": 16384, "blocked_saveprobs": 16384,
                "dense_causal": 8192, "reference_causal": 8192, "blocked_causal": 16384}
    if not has_hf:
        del variants["hf"]
    series: dict = {n: {} for n in variants}
    lines += ["## Time and memory vs L (fwd+bwd, attention core)", "",
              "| variant | " + " | ".join(f"L={x}" for x in lengths) + " |",
              "|---|" + "---|" * len(lengths)]
    for length in lengths:
        names = [n for n, top in variants.items() if length <= top]
        print(f"== sweep L={length}: {names}", flush=True)
        fns = {n: make_case(n, length) for n in names}
        t = interleaved(fns, max(1, reps // 2 + 1) if length >= 8192 else reps)
        del fns
        for n in names:
            series[n][length] = (stats(t[n])["median"], memory(n, length))
    for n, pts in series.items():
        cells = []
        for x in lengths:
            if x in pts:
                tm, mm = pts[x]
                cells.append(f"{1e3 * tm:.0f} ms / {mm / 2**20:.0f} MiB" if mm else f"{1e3 * tm:.0f} ms / n/a")
            else:
                cells.append("-")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["", "![time and memory vs L](bigbird.png)", ""]
    data["sweep"] = series
    plot_vs_length(RESULTS / "bigbird.png", "BigBird attention core fwd+bwd (B=1, H=8, Dh=64, fp32, CPU)", series)
    path = write_results("bigbird", "\n".join(lines) + "\n", data, goals)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
