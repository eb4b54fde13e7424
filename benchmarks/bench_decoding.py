"""Decoding speed: beam 4 over the Multi30k test set vs greedy (issue 16, goal 3) and beam search with
incremental caches vs re-running the prefix (issue 7, goal 6).

    python benchmarks/bench_decoding.py [--repeats 3] [--rounds 3] [--train-steps 300] [--quick]

Writes results/bench/decoding.{md,json}.

Goal 3: the laptop model (transformer_small: d 128, 4 heads, 2+2 layers) on Multi30k En-De, briefly trained
in this process (``--train-steps``, so hypotheses end at EOS as a trained model's do; 0 keeps it random),
decodes the test set as ``attnlab-train``'s test loop does (``Seq2SeqModule.decode`` over the test loader:
batches of ``eval_batch_size`` sources sorted by length). Greedy and beam 4 alternate round by round; the
ratio is per round. Beam 4 in split order (unsorted batches) shows what length grouping buys, and a sample of
sources decoded one at a time by ``beam_search_reference`` (the unbatched reference) checks that batched
beam search returns the same hypotheses.

Goal 6 (issue 7): the end-of-sentence id is one the model can never emit, so every hypothesis runs the full
``--length`` steps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import fmt, goal, goal_line, interleaved, machine, ratios, stats, write_results  # noqa: E402

CFG = dict(d_model=256, num_heads=4, d_ff=1024, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
           activation="relu", norm_first=False, attention={"name": "vanilla"}, cross_attention="auto",
           recurrence={"name": "stacked"}, encoder_layers=3, decoder_layers=3, positions="sinusoidal",
           share_embeddings=True, tie_output=True)


MT_OVERRIDES = ["task=mt/multi30k_en_de", "model=transformer_small", "trainer.enable_progress_bar=false"]
# --quick: the plumbing on a generated task (no tokenizer to train, no data files), in seconds
SMOKE_OVERRIDES = ["task=algo/copy", "model=transformer_tiny", "task.at_scale.cpu.train_size=64",
                   "task.at_scale.cpu.val_size=8", "task.at_scale.cpu.test_size=24",
                   "task.at_scale.cpu.train_max_len=6", "task.at_scale.cpu.test_max_len=12", "batch.eval_batch_size=8"]


def _train_briefly(module, loader, steps: int) -> float:
    """``steps`` Adam updates (linear warm-up over a tenth) on the training batches; returns the last loss."""
    opt = torch.optim.Adam(module.parameters(), lr=1e-3, betas=(0.9, 0.98))
    warm = max(steps // 10, 1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    module.train()
    loss = torch.tensor(float("nan"))
    batches = iter(loader)
    for _ in range(steps):
        try:
            batch = next(batches)
        except StopIteration:
            batches = iter(loader)
            batch = next(batches)
        loss, _, _ = module.compute_loss(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    return float(loss)


def goal_beam_vs_greedy(a) -> tuple[list[str], dict]:
    """Issue 16 goal 3 (module doc)."""
    import dataclasses

    from torch.utils.data import DataLoader, Subset

    from attnlab.decoding.search import beam_search_reference
    from attnlab.training.build import build_datamodule, build_module, build_task_data
    from attnlab.training.compose import compose
    from attnlab.training.data import TaskDataModule
    from attnlab.training.scale import apply_scale

    overrides = SMOKE_OVERRIDES if a.quick else MT_OVERRIDES
    cfg = compose("train", overrides)
    apply_scale(cfg, overrides)
    task = build_task_data(cfg)
    torch.manual_seed(0)
    module = build_module(cfg, task)
    loss = _train_briefly(module, build_datamodule(cfg, task).train_dataloader(), a.train_steps)
    module.eval()
    test = task.datasets["test"]
    if a.sentences < len(test):
        task = dataclasses.replace(task, datasets={**task.datasets, "test": Subset(test, range(a.sentences))})
    dm = TaskDataModule(task, micro_batch=1, eval_batch=int(cfg.batch.eval_batch_size))
    sorted_batches = list(dm.test_loader("test"))
    split_order = list(DataLoader(task.datasets["test"], batch_size=dm.eval_batch, collate_fn=task.collate))
    greedy_cfg = {**module.eval_cfg, "strategy": "greedy"}
    beam_cfg = {**module.eval_cfg, "strategy": "beam", "beam_size": 4}

    def decode_all(batches, eval_cfg):
        module.eval_cfg = eval_cfg
        with torch.inference_mode():
            return [module.decode(b["src"]) for b in batches]

    cases = {"greedy": lambda: decode_all(sorted_batches, greedy_cfg),
             "beam4": lambda: decode_all(sorted_batches, beam_cfg)}
    if not a.quick:
        cases["beam4_split_order"] = lambda: decode_all(split_order, beam_cfg)
    t = interleaved(cases, a.rounds, warmup=0)
    r = ratios(t, "beam4", "greedy")  # beam time / greedy time, per round

    # the same hypotheses as the unbatched reference beam search on each source alone, on a sample
    outputs = decode_all(sorted_batches, beam_cfg)
    e, info = beam_cfg, module.task_info
    checked = same = 0
    for batch, out in zip(sorted_batches, outputs):
        for row in range(0, batch["src"].shape[0], max(batch["src"].shape[0] // 2, 1)):
            src = batch["src"][row: row + 1]
            src = src[:, : int(src.ne(info["pad_id"]).sum())]
            max_len = min(int(e["max_len_a"] * batch["src"].shape[1] + e["max_len_b"]), module.model_cfg["max_len"] - 1)
            with torch.inference_mode():
                alone = beam_search_reference(module.model, src, bos_id=info["bos_id"], eos_id=info["eos_id"],
                                              max_len=max_len, beam_size=4, alpha=e["length_penalty_alpha"],
                                              length_penalty=e["length_penalty"])
            hyp = out[row].tolist()
            ref = alone[0].tolist()
            checked += 1
            same += hyp[: len(ref)] == ref and all(x == info["eos_id"] for x in hyp[len(ref):])
    lengths = [int(b["src"].ne(info["pad_id"]).sum(1).max()) for b in sorted_batches]
    record = goal("16.3", "beam 4 / greedy decoding time, Multi30k test", r, 2.5, "<=")
    same_record = goal("16.3", "batched beam search = unbatched reference, sampled sources", same / max(checked, 1),
                       1.0, unit="", note=f"{same}/{checked} identical")
    lines = ["## Beam 4 vs greedy over the Multi30k test set (issue 16, goal 3)", "",
             f"{cfg.task.name}, {cfg.model.name} (d {cfg.model.d_model}, {cfg.model.num_heads} heads, "
             f"{cfg.model.encoder_layers}+{cfg.model.decoder_layers} layers), "
             f"trained {a.train_steps} steps in this process (last loss {loss:.2f}); "
             f"{min(len(test), a.sentences)} test sentences in "
             f"{len(sorted_batches)} batches of <= {dm.eval_batch} sorted by source length "
             f"(longest source per batch {min(lengths)}..{max(lengths)}); {a.rounds} interleaved rounds.", "",
             f"- greedy: {fmt(stats(t['greedy']), ' s')}",
             f"- beam 4: {fmt(stats(t['beam4']), ' s')}"]
    if "beam4_split_order" in t:
        lines.append(f"- beam 4, batches in split order (unsorted): {fmt(stats(t['beam4_split_order']), ' s')} "
                     f"(sorting buys {fmt(ratios(t, 'beam4_split_order', 'beam4'), 'x')})")
    lines += [goal_line(record),
              f"- batched beam search = unbatched reference (`beam_search_reference`, each source alone): "
              f"{same}/{checked} sampled sources", ""]
    return lines, {"times": t, "beam_over_greedy": r, "same_as_alone": [same, checked], "train_loss": loss,
                   "goals": [record, same_record]}


def main() -> None:
    from attnlab.decoding.search import beam_search
    from attnlab.models import EncoderDecoder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="rounds of the cache goal (issue 7, goal 6)")
    ap.add_argument("--length", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of beam vs greedy (issue 16, goal 3)")
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument("--sentences", type=int, default=10**9, help="decode only the first N test sentences")
    ap.add_argument("--quick", action="store_true", help="smoke run: few sentences, no training, short outputs")
    a = ap.parse_args()
    if a.quick:
        a.repeats, a.length, a.rounds, a.train_steps, a.sentences = 1, 12, 1, 0, 24
    where = machine()
    head = ["# Decoding speed", "", f"Machine: {where}", ""]
    goal3, data3 = goal_beam_vs_greedy(a)
    print("\n".join(goal3), flush=True)
    torch.manual_seed(0)
    model = EncoderDecoder(CFG, src_vocab=1000, tgt_vocab=1000, pad_id=0, max_len=256).eval()
    src = torch.randint(3, 1000, (4, 30))
    kw = dict(bos_id=1, eos_id=10**6, max_len=a.length, beam_size=4)

    def run(cache):
        with torch.inference_mode():
            return beam_search(model, src, use_cache=cache, **kw)

    assert torch.equal(run(True), run(False))
    t = interleaved({"no_cache": lambda: run(False), "cache": lambda: run(True)}, a.repeats, warmup=0)
    r = ratios(t, "no_cache", "cache")
    cache_goal = goal("7.6", f"beam search, re-running the prefix / incremental caches, {a.length} tokens", r, 5.0)
    lines = ["## Beam search with incremental caches (issue 7, goal 6)", "",
             f"Encoder-decoder d=256, 3+3 layers, batch 4, beam 4, source length 30, output length {a.length}.", "",
             f"- re-running the prefix: {fmt(stats(t['no_cache']), ' s')}",
             f"- incremental caches: {fmt(stats(t['cache']), ' s')}",
             goal_line(cache_goal), ""]
    print("\n".join(lines), flush=True)
    write_results("decoding", "\n".join(head + goal3 + lines) + "\n",
                  {"machine": where, "goal16_3": data3, "times": t, "ratio": r},
                  [*data3["goals"], cache_goal])


if __name__ == "__main__":
    main()
