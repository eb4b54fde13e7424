"""Goal 6 of issue 7: beam search with incremental caches vs re-running the prefix, output length 100.

    python benchmarks/bench_decoding.py [--repeats 3]

Writes results/bench/decoding.{md,json}. The end-of-sentence id is one the model can never emit, so every
hypothesis runs the full 100 steps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import fmt, interleaved, machine, ratios, stats, write_results  # noqa: E402

CFG = dict(d_model=256, num_heads=4, d_ff=1024, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
           activation="relu", norm_first=False, attention={"name": "vanilla"}, cross_attention="auto",
           recurrence={"name": "stacked"}, encoder_layers=3, decoder_layers=3, positions="sinusoidal",
           share_embeddings=True, tie_output=True)


def main() -> None:
    from attnlab.decoding import beam_search
    from attnlab.models import EncoderDecoder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--length", type=int, default=100)
    a = ap.parse_args()
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
    ok = "MET" if r["median"] >= 5 else "MISSED"
    lines = ["# Beam search with incremental caches (issue 7, goal 6)", "", f"Machine: {machine()}", "",
             f"Encoder-decoder d=256, 3+3 layers, batch 4, beam 4, source length 30, output length {a.length}.", "",
             f"- re-running the prefix: {fmt(stats(t['no_cache']), ' s')}",
             f"- incremental caches: {fmt(stats(t['cache']), ' s')}",
             f"- **speed-up** = {fmt(r, 'x')} (target >= 5x, median: {ok})", ""]
    print("\n".join(lines), flush=True)
    write_results("decoding", "\n".join(lines) + "\n", {"times": t, "ratio": r})


if __name__ == "__main__":
    main()
