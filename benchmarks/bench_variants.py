"""Goal 7 of issue 7 (report): training step time and memory vs L for every attention variant in an
encoder classifier (2 layers, d=256), and UT vs UT+ACT vs stacked at equal parameters.

    python benchmarks/bench_variants.py [--repeats 3] [--quick]

Writes results/bench/variants.{md,json,png} and results/bench/recurrence.png. Time: interleaved across
variants at each L (min/median/max over repeats); memory: fresh subprocess per case.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import (  # noqa: E402
    RESULTS,
    fmt,
    interleaved,
    machine,
    memory_in_subprocess,
    peak_extra_bytes,
    plot_vs_length,
    stats,
    write_results,
)

SCRIPT = Path(__file__).resolve()
BATCH, VOCAB = 4, 256
ATTENTION = {"vanilla": {}, "qknorm": {}, "bigbird": {"block_size": 64}, "synth_dense": {},
             "synth_random": {}, "synth_fixed_random": {}, "synth_factorized_dense": {},
             "synth_factorized_random": {}, "synth_dense_vanilla": {}, "synth_random_vanilla": {},
             "synth_random_dense": {}, "synth_mixture": {}}
# Equal parameters: one shared UT layer of width 624 ~ six stacked layers of width 256 (12 d^2 per layer).
RECURRENCE = {"stacked": ({"name": "stacked"}, 256, 6), "ut": ({"name": "ut", "num_steps": 6}, 624, 6),
              "ut_act": ({"name": "ut_act", "act_max_steps": 6}, 624, 6)}


def _cfg(attention: dict, recurrence: dict, d: int, layers: int) -> dict:
    return dict(d_model=d, num_heads=8 if d % 8 == 0 else 4, d_ff=4 * d, dropout=0.0, attention_dropout=0.0,
                activation_dropout=0.0, activation="relu", norm_first=True, attention=attention,
                cross_attention="auto", recurrence=recurrence, encoder_layers=layers, decoder_layers=layers,
                positions="sinusoidal", share_embeddings=True, tie_output=True)


def make_case(name: str, length: int):
    from attnlab.models import EncoderClassifier

    torch.manual_seed(0)
    if name in RECURRENCE:
        rec, d, layers = RECURRENCE[name]
        cfg = _cfg({"name": "vanilla"}, rec, d, layers)
    else:
        cfg = _cfg({"name": name, **ATTENTION[name]}, {"name": "stacked"}, 256, 2)
    model = EncoderClassifier(cfg, vocab=VOCAB, pad_id=0, max_len=length, num_classes=10).train()
    ids = torch.randint(1, VOCAB, (BATCH, length))
    labels = torch.randint(0, 10, (BATCH,))

    def run():
        model.zero_grad(set_to_none=True)
        out = model(ids)
        logits = out[0] if isinstance(out, tuple) else out
        loss = F.cross_entropy(logits, labels)
        if isinstance(out, tuple) and isinstance(out[1], dict):
            loss = loss + sum(v for k, v in out[1].items() if k.startswith("loss/"))
        loss.backward()

    run.params = sum(p.numel() for p in model.parameters())
    return run


def sweep(names, lengths, reps, series, params):
    for length in lengths:
        fns = {}
        for n in names:
            try:
                fns[n] = make_case(n, length)
                params[n] = fns[n].params
            except Exception as err:  # a variant that cannot serve this length is reported, not fatal
                print(f"skip {n} L={length}: {str(err).splitlines()[0]}", flush=True)
        print(f"== L={length}: {list(fns)}", flush=True)
        t = interleaved(fns, reps)
        for n in fns:
            mem = memory_in_subprocess(SCRIPT, ["--memory-case", n, "--length", str(length)])
            series.setdefault(n, {})[length] = (stats(t[n])["median"], mem)
            series[n][f"t{length}"] = stats(t[n])


def table(series, lengths, params):
    rows = ["| variant | params | " + " | ".join(f"L={x}" for x in lengths) + " |",
            "|---|---|" + "---|" * len(lengths)]
    for n, pts in series.items():
        cells = []
        for x in lengths:
            if x in pts:
                tm, mm = pts[x]
                cells.append(f"{fmt(pts[f't{x}'], scale=1e3, digits=0)} ms / "
                             f"{'n/a' if mm is None else f'{mm / 2**20:.0f} MiB'}")
            else:
                cells.append("-")
        rows.append(f"| {n} | {params.get(n, 0) / 1e6:.2f}M | " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--memory-case")
    ap.add_argument("--length", type=int)
    a = ap.parse_args()
    if a.memory_case:
        print(f"PEAK_BYTES={peak_extra_bytes(make_case(a.memory_case, a.length))}", flush=True)
        return
    reps = 2 if a.quick else a.repeats
    lengths = [128, 512] if a.quick else [128, 256, 512, 1024]
    params: dict = {}
    att: dict = {}
    sweep(list(ATTENTION), lengths, reps, att, params)
    rec: dict = {}
    sweep(list(RECURRENCE), lengths, reps, rec, params)
    lines = ["# Attention and recurrence variants: training step vs L (issue 7, goal 7, report)", "",
             f"Machine: {machine()}", "",
             f"Encoder classifier, batch {BATCH}, forward + loss + backward. Time ms min/median/max over {reps} "
             "interleaved repeats / peak extra memory of one step in a fresh subprocess.", "",
             "## Attention variants (2 pre-norm layers, d=256, 8 heads)", "", *table(att, lengths, params), "",
             "![variants](variants.png)", "",
             "## UT vs UT+ACT vs stacked at equal parameters (6 stacked layers d=256 vs one shared layer d=624, "
             "6 steps; ACT at most 6 steps)", "", *table(rec, lengths, params), "", "![recurrence](recurrence.png)", ""]
    clean = {n: {x: v for x, v in pts.items() if isinstance(x, int)} for n, pts in att.items()}
    plot_vs_length(RESULTS / "variants.png", "Attention variants: training step (encoder, 2 layers, d=256)", clean)
    clean_r = {n: {x: v for x, v in pts.items() if isinstance(x, int)} for n, pts in rec.items()}
    plot_vs_length(RESULTS / "recurrence.png", "Stacked vs UT vs UT+ACT at equal parameters", clean_r)
    path = write_results("variants", "\n".join(lines) + "\n", {"attention": att, "recurrence": rec, "params": params})
    print("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
