"""Issue 16 goal 2 (second half): target tokens trained per second on the QKNorm TED gl-en laptop run, token
batches (the preset) against padded sentence batches (what the cpu scale trained before the preset).

    python benchmarks/bench_batching.py [--steps 16] [--rounds 3] [--threads N] [--quick]

One process builds the ``experiment=qknorm/table1/baseline_gl_en scale=cpu`` task and model once, then two data
modules over the same training set: the preset's token batches (length-bucketed micro-batches of at most
~2000 padded tokens, ``batch.tokens_per_update=2000``) and 64-sentence batches drawn in random order and padded to
their longest pair (``batch.sentences_per_update=64``, the cpu scale's default and the old gl-en cpu preset's
batch). Only the batching differs: same vocabulary (the 3k BPE), model, optimizer and thread count.

A round times ``--steps`` consecutive training steps of each mode, as a run takes them (drawing the batch from the
loader, forward, backward, clipping, optimizer step), the two modes one after the other (which goes first
alternates), so that load drift on a shared machine hits both alike. Target tokens are the non-padding target
tokens a step trains on (what the loss counts). Each round gives one ratio of tokens per second; the goal is
judged on the median ratio.

Writes results/bench/batching.{md,json}.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import fmt, goal, goal_line, machine, stats, write_results  # noqa: E402
from benchmarks.bench_training import plain_loop_optimizer, train_step  # noqa: E402

GOAL = 3.0
PRESET = ["experiment=qknorm/table1/baseline_gl_en", "scale=cpu", "trainer.enable_progress_bar=false"]
MODES = {
    "token batches (preset)": [],
    "padded 64-sentence batches": ["batch.tokens_per_update=null", "batch.sentences_per_update=64"],
}


def padded_tokens(batch: dict) -> tuple[int, int]:
    """(source, target) positions of a batch including padding: the work its step pays for."""
    return batch["src"].numel(), batch["tgt_out"].numel()


def timed_steps(module, loader_iter, opt, sched, steps: int, grad_clip: float) -> dict[str, float]:
    """``steps`` training steps drawing batches from ``loader_iter``; seconds, target tokens, padded positions."""
    module.train()
    seconds, target, padded_src, padded_tgt, loss = 0.0, 0, 0, 0, None
    for _ in range(steps):
        start = time.perf_counter()
        batch = next(loader_iter)
        loss, n = train_step(module, batch, opt, sched, grad_clip)
        seconds += time.perf_counter() - start
        target += int(n)
        src, tgt = padded_tokens(batch)
        padded_src, padded_tgt = padded_src + src, padded_tgt + tgt
    return {"seconds": seconds, "target_tokens": target, "padded_src": padded_src, "padded_tgt": padded_tgt,
            "last_loss": float(loss.detach())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16, help="training steps per mode and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the hardware config's, "
                    "else torch's default); the same for both modes")
    ap.add_argument("--quick", action="store_true", help="smoke: 1 round of 3 steps")
    a = ap.parse_args()
    steps, rounds = (3, 1) if a.quick else (a.steps, a.rounds)

    from attnlab.tasks.sources import DataError, find_file
    from attnlab.training.build import build_datamodule, build_module, build_task_data
    from attnlab.training.compose import compose_checked

    base = compose_checked("train", PRESET)
    try:  # the data is local only (no download): say where it is looked for instead of a traceback
        find_file(Path(base.task.data_root), base.task.train.src)
    except DataError as exc:
        if a.quick:  # the CI smoke on a machine without the shared data: nothing to time, not a failure
            print(f"skipped: {exc}", flush=True)
            return
        raise SystemExit(f"error: {exc}") from None
    torch.set_num_threads(a.threads or int(base.hardware.get("torch_threads") or torch.get_num_threads()))
    where = machine()  # before the timing: its load average is the one at the start
    task = build_task_data(base)  # one task (and tokenizer) for both modes: only the batching differs
    torch.manual_seed(0)
    module = build_module(base, task)
    iters = {}
    for mode, extra in MODES.items():
        cfg = compose_checked("train", [*PRESET, *extra])
        dm = build_datamodule(cfg, task)
        dm.setup("fit")
        iters[mode] = iter(dm.train_dataloader())
    opt, sched = plain_loop_optimizer(module, max_steps=10 * steps * rounds)
    clip = float(base.optim.grad_clip or 0.0)

    token_mode, sentence_mode = MODES
    timed_steps(module, iters[token_mode], opt, sched, 2, clip)  # warm-up (allocator, kernels)
    per_mode: dict[str, list[dict]] = {mode: [] for mode in MODES}
    round_ratios = []
    for r in range(rounds):
        for mode in (list(MODES) if r % 2 == 0 else list(MODES)[::-1]):  # neither mode always goes first
            per_mode[mode].append(timed_steps(module, iters[mode], opt, sched, steps, clip))
        tps = {mode: per_mode[mode][-1]["target_tokens"] / per_mode[mode][-1]["seconds"] for mode in MODES}
        round_ratios.append(tps[token_mode] / tps[sentence_mode])
        print(f"round {r + 1}: " + ", ".join(f"{m} {v:.0f} target tokens/s" for m, v in tps.items())
              + f"; ratio {round_ratios[-1]:.2f}", flush=True)

    summary = {}
    for mode, runs in per_mode.items():
        seconds = sum(x["seconds"] for x in runs)
        target = sum(x["target_tokens"] for x in runs)
        summary[mode] = {
            "tokens_per_s": stats([x["target_tokens"] / x["seconds"] for x in runs]),
            "step_s": seconds / (steps * rounds),
            "target_tokens_per_step": target / (steps * rounds),
            "target_share_of_padded": target / sum(x["padded_tgt"] for x in runs),
            "padded_positions_per_step": sum(x["padded_src"] + x["padded_tgt"] for x in runs) / (steps * rounds),
        }
    record = goal("16.2", "QKNorm TED gl-en laptop run, target tokens/s, token batches / padded sentence batches",
                  stats(round_ratios), GOAL, ">=", unit="x", digits=2,
                  note=f"{summary[token_mode]['tokens_per_s']['median']:.0f} vs "
                       f"{summary[sentence_mode]['tokens_per_s']['median']:.0f} target tokens/s")
    threads = torch.get_num_threads()
    lines = ["# Token batches vs padded sentence batches: QKNorm TED gl-en laptop run (issue 16, goal 2)", "",
             f"Machine: {where}; load average at the end {os.getloadavg()[0]:.1f}", "",
             f"`attnlab-train {' '.join(PRESET[:2])}` (model, 3k BPE, optimizer as the preset), {rounds} round(s) of "
             f"{steps} training steps per mode, one mode after the other within a round (which goes first alternates).",
             ""]
    for mode in MODES:
        s = summary[mode]
        lines.append(f"- {mode}: {fmt(s['tokens_per_s'], ' target tokens/s', digits=0)}; "
                     f"{s['step_s']:.3f} s and {s['target_tokens_per_step']:.0f} target tokens per step; "
                     f"{100 * s['target_share_of_padded']:.0f}% of the padded target positions are real tokens "
                     f"({s['padded_positions_per_step']:.0f} padded source + target positions per step)")
    lines += [goal_line(record), "",
              "Same vocabulary on both sides: the old gl-en cpu preset also had an 8k BPE, whose extra softmax work "
              "this ratio leaves out (experiments/qknorm/README.md measured the old preset as a whole: x4.0).", ""]
    print("\n".join(lines), flush=True)
    data = {"steps": steps, "rounds": rounds, "threads": threads, "round_ratios": round_ratios,
            "modes": summary, "quick": a.quick,
            "machine": where}
    path = write_results("batching", "\n".join(lines) + "\n", data, [record])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
