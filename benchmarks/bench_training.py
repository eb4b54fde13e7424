"""Framework overhead of an attnlab (Lightning) training step vs a plain PyTorch loop on the same module and
batches, fp32 and bf16-mixed (issue 7 goal 4, issue 16 goal 5: <= 3% fp32, <= 5% bf16-mixed); MFU of the MT
base-size model against the matmul peak measured in the same run (issue 16 goal 6: >= 35% of the fp32 peak
in fp32, >= 25% of the bf16 peak in bf16-mixed), with the top operators of one profiled step saying where the
time goes; bf16-mixed vs fp32 tokens/s with their loss curves (issue 7 goal 5).

    python benchmarks/bench_training.py [--steps 12] [--rounds 7] [--quick]

Overhead: plain and Lightning loops alternate ``--rounds`` times (so load drift on a shared machine hits both
alike); each round gives one ratio of median step times, and the goal is judged on the median of those ratios.

Writes results/bench/training.{md,json}.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import fmt, goal, machine, stats, write_results  # noqa: E402

LM_OVERRIDES = ["experiment=demo/copy", "model.d_model=256", "model.d_ff=1024", "model.num_heads=4",
                "trainer.enable_progress_bar=false", "trainer.val_check_interval=100000"]
SMOKE_OVERRIDES = ["experiment=demo/copy", "model=transformer_tiny", "trainer.enable_progress_bar=false",
                   "trainer.val_check_interval=100000"]
MT_OVERRIDES = ["experiment=demo/copy", "model=transformer_base", "model/attention=vanilla", "model.d_model=512",
               "model.d_ff=2048", "model.num_heads=8", "model.dropout=0.1",
                "batch.sentences_per_update=16", "trainer.enable_progress_bar=false",
                "trainer.val_check_interval=100000"]


def _setup(overrides: list[str], precision: str):
    from attnlab.training.build import build_datamodule, build_module
    from attnlab.training.compose import compose

    cfg = compose("train", [*overrides, f"hardware.precision={precision}"])
    torch.manual_seed(0)
    module = build_module(cfg)
    dm = build_datamodule(cfg)
    dm.setup("fit")
    it = iter(dm.train_dataloader())
    batches = [next(it) for _ in range(8)]
    return cfg, module, batches


def plain_loop_optimizer(module, max_steps: int):
    """(optimizer, per-step lr scheduler) as the module configures them for a run of ``max_steps`` updates."""
    from types import SimpleNamespace

    module._trainer = SimpleNamespace(max_steps=max_steps)  # configure_optimizers reads trainer.max_steps
    try:
        conf = module.configure_optimizers()
    finally:
        module._trainer = None
    return conf["optimizer"], conf["lr_scheduler"]["scheduler"]


def train_step(module, batch, opt, sched, grad_clip: float = 0.0, bf16: bool = False):
    """One update as the attnlab trainer takes it, without Lightning: (loss, target tokens)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss, _, n = module.compute_loss(batch)
    loss.backward()
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(module.parameters(), grad_clip)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return loss, n


def plain_loop(module, batches, steps: int, bf16: bool, grad_clip: float = 0.0):
    """Seconds per step (forward, backward, clipping, optimizer and schedule step, zero_grad), losses, and
    tokens per step: what the attnlab trainer does per step, without Lightning."""
    opt, sched = plain_loop_optimizer(module, max_steps=steps)
    module.train()
    times, losses, tokens = [], [], 0
    for i in range(steps):
        batch = batches[i % len(batches)]
        t = time.perf_counter()
        loss, n = train_step(module, batch, opt, sched, grad_clip, bf16)
        times.append(time.perf_counter() - t)
        losses.append(float(loss.detach()))
        tokens = n
    return times, losses, tokens


class _StepTimer:
    def __init__(self):
        from lightning.pytorch.callbacks import Callback

        outer = self

        class T(Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                outer._t = time.perf_counter()

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                outer.times.append(time.perf_counter() - outer._t)
                loss = outputs["loss"] if isinstance(outputs, dict) else outputs
                outer.losses.append(float(loss) if loss is not None else float("nan"))

        self.times: list[float] = []
        self.losses: list[float] = []
        self.callback = T()


def lightning_loop(cfg, module, batches, steps: int, tmp: Path) -> tuple[list[float], list[float]]:
    """The attnlab trainer (build_trainer: precision, clipping, accumulation as configured) over the same
    batches; step time from on_train_batch_start to on_train_batch_end."""
    from torch.utils.data import DataLoader

    from attnlab.training.run import build_trainer

    cfg = copy.deepcopy(cfg)
    cfg.trainer.max_steps = steps
    timer = _StepTimer()
    trainer = build_trainer(cfg, tmp, callbacks=[timer.callback], loggers=[])
    loader = DataLoader([batches[i % len(batches)] for i in range(steps)], batch_size=None, shuffle=False)
    trainer.fit(module, train_dataloaders=loader)
    return timer.times, timer.losses


def top_ops(step, count: int = 8) -> list[tuple[str, float]]:
    """The ``count`` operators with the most self CPU time over one call of ``step``, with their share."""
    from torch.profiler import ProfilerActivity, profile

    step()  # warm: allocator and kernels selected outside the profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    events.sort(key=lambda e: -e.self_cpu_time_total)
    return [(e.key, e.self_cpu_time_total / total) for e in events[:count]]


def main() -> None:
    import tempfile

    from attnlab.training.perf import count_flops, measure_matmul_peak

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="steps per loop (the first 3 are dropped)")
    ap.add_argument("--rounds", type=int, default=7, help="plain/Lightning rounds per precision")
    ap.add_argument("--mfu-steps", type=int, default=12, help="steps of the MT base-size model per precision")
    ap.add_argument("--quick", action="store_true", help="smoke run: a tiny model, 2 rounds of 5 steps")
    a = ap.parse_args()
    steps = 5 if a.quick else a.steps
    warm = 3 if not a.quick else 2
    rounds = 2 if a.quick else a.rounds
    lines = ["# Training throughput on CPU (issue 16 goals 5-6, issue 7 goals 4-5)", "", f"Machine: {machine()}", "",
             f"{steps} steps per loop, the first {warm} dropped, {rounds} rounds; step times in ms as "
             "min/median/max.", ""]
    data: dict = {"machine": machine()}
    goals: list[dict] = []

    # Goal 4: Lightning vs plain loop, fp32 and bf16-mixed, interleaved loop by loop
    lines += ["## attnlab (Lightning) step vs plain PyTorch loop (issue 16 goal 5, issue 7 goal 4)", "",
              "| precision | plain ms | attnlab ms | overhead per round (min/med/max) | target |",
              "|---|---|---|---|---|"]
    for precision, target in (("32", 0.03), ("bf16-mixed", 0.05)):
        cfg, module, batches = _setup(SMOKE_OVERRIDES if a.quick else LM_OVERRIDES, precision)
        state = copy.deepcopy(module.state_dict())
        per_round, plain_all, light_all = [], [], []
        for _ in range(rounds):  # plain and Lightning alternate, so load drift hits both alike
            module.load_state_dict(state)
            plain, _, _ = plain_loop(module, batches, steps, precision.startswith("bf16"), cfg.optim.grad_clip or 0.0)
            module.load_state_dict(state)
            with tempfile.TemporaryDirectory() as tmp:
                light, _ = lightning_loop(cfg, module, batches, steps, Path(tmp))
            ps, ls_ = stats(plain[warm:]), stats(light[warm:])
            per_round.append(ls_["median"] / ps["median"] - 1)
            plain_all += plain[warm:]
            light_all += light[warm:]
        over = stats(per_round)
        record = goal("16.5", f"Lightning step / plain loop - 1, {precision}, median of per-round ratios", over,
                      target, "<=", unit="%", digits=1, scale=100)
        goals.append(record)
        lines.append(f"| {precision} | {fmt(stats(plain_all), scale=1e3, digits=1)} | "
                     f"{fmt(stats(light_all), scale=1e3, digits=1)} | {fmt(over, scale=100, digits=1)}% | "
                     f"{record['target']}: {record['status']} |")
        data[f"goal4_{precision}"] = {"plain": stats(plain_all), "lightning": stats(light_all), "overhead": over}
    lines.append("")

    # Goal 5: MFU of the MT base model (fp32) vs the measured matmul peak; bf16-mixed speed-up
    peak32 = measure_matmul_peak(torch.float32)
    peak16 = measure_matmul_peak(torch.bfloat16)
    res, profiles = {}, {}
    mfu_steps = 4 if a.quick else a.mfu_steps
    for precision in ("32", "bf16-mixed"):
        cfg, module, batches = _setup(SMOKE_OVERRIDES if a.quick else MT_OVERRIDES, precision)
        bf16 = precision.startswith("bf16")
        module.train()

        def one_step(module=module, batch=batches[0], bf16=bf16):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss, _, n = module.compute_loss(batch)
            loss.backward()
            module.zero_grad(set_to_none=True)
            return n

        flops, tokens = count_flops(one_step)
        profiles[precision] = top_ops(one_step)
        times, losses, tokens = plain_loop(module, batches, mfu_steps, bf16, cfg.optim.grad_clip or 0.0)
        tps = tokens / stats(times[warm:])["median"]
        res[precision] = {"flops_per_token": flops / tokens, "tokens_per_s": tps, "losses": losses,
                          "step": stats(times[warm:])}
    mfu32 = res["32"]["flops_per_token"] * res["32"]["tokens_per_s"] / peak32
    mfu16 = res["bf16-mixed"]["flops_per_token"] * res["bf16-mixed"]["tokens_per_s"] / peak16
    speed = res["bf16-mixed"]["tokens_per_s"] / res["32"]["tokens_per_s"]
    l32, l16 = res["32"]["losses"], res["bf16-mixed"]["losses"]
    gap = max(abs(x - y) for x, y in zip(l32, l16))

    model_name = "transformer_tiny (smoke)" if a.quick else "transformer_base"
    mfu_fp32, mfu_bf16, bf16_speed = (
        goal("16.6", f"MFU fp32, {model_name}, vs the measured fp32 matmul peak", mfu32, 0.35, unit="%",
             digits=1, scale=100, note=f"peak {peak32 / 1e9:.1f} GFLOP/s"),
        goal("16.6", f"MFU bf16-mixed, {model_name}, vs the measured bf16 matmul peak", mfu16, 0.25,
             unit="%", digits=1, scale=100, note=f"peak {peak16 / 1e9:.1f} GFLOP/s"),
        goal("7.5", f"bf16-mixed / fp32 tokens per second, {model_name}", speed, 1.6,
             note=f"{res['bf16-mixed']['tokens_per_s']:.0f} vs {res['32']['tokens_per_s']:.0f} tokens/s"))
    goals += [mfu_fp32, mfu_bf16, bf16_speed]

    model = "transformer_tiny (smoke)" if a.quick else "transformer_base, vanilla attention"
    lines += [f"## MFU of the MT base-size model ({model}; issue 16 goal 6, issue 7 goal 5)", "",
              f"- measured matmul peak (1024^3, this process): fp32 {peak32 / 1e9:.1f} GFLOP/s, "
              f"bf16 {peak16 / 1e9:.1f} GFLOP/s",
              f"- model FLOPs per token (FlopCounterMode, fwd+bwd): {res['32']['flops_per_token'] / 1e6:.1f} MFLOP",
              f"- fp32: {res['32']['tokens_per_s']:.0f} tokens/s, **MFU {100 * mfu32:.1f}%** of the measured fp32 "
              f"peak ({mfu_fp32['target']}: {mfu_fp32['status']})",
              f"- bf16-mixed: {res['bf16-mixed']['tokens_per_s']:.0f} tokens/s, **MFU {100 * mfu16:.1f}%** of the "
              f"measured bf16 peak ({mfu_bf16['target']}: {mfu_bf16['status']}); **{speed:.2f}x fp32** "
              f"({bf16_speed['target']}: {bf16_speed['status']})",
              f"- loss curves over {mfu_steps} steps from the same initialisation: largest |fp32 - bf16| gap "
              f"{gap:.4f} (first/last fp32 {l32[0]:.3f}/{l32[-1]:.3f}, bf16 {l16[0]:.3f}/{l16[-1]:.3f})", "",
              "Where the time of one training step goes (torch.profiler, forward + backward, operators by self CPU "
              "time, share of the step):", ""]
    for precision, ops in profiles.items():
        lines.append(f"- {precision}: " + ", ".join(f"{name} {100 * share:.0f}%" for name, share in ops))
    lines.append("")
    print("\n".join(lines[-14:]), flush=True)
    data["mfu"] = {"peak_fp32": peak32, "peak_bf16": peak16, "mfu_fp32": mfu32, "mfu_bf16": mfu16,
                   "bf16_speedup": speed, "top_ops": profiles, **res}
    path = write_results("training", "\n".join(lines) + "\n", data, goals)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
