"""The one-GPU estimates (attnlab.results.gpu_estimate) and ``make reproduce-list SCALE=gpu``.

The analytic FLOP count is held against torch's own counter (FlopCounterMode over a forward and backward of the
model the run builds), for an encoder-decoder, a UT that applies one layer many times, a decoder-only LM and an
encoder classifier: a missing cross-attention, output projection, layer application or a 2-for-6 slip fails it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from attnlab.results.gpu_estimate import estimate_row, flops_per_example
from tests.conftest import compose, require_shared_data

SMALL = ["model.d_model=32", "model.num_heads=2", "model.d_ff=64", "model.dropout=0.0",
         "model.attention_dropout=0.0", "model.activation_dropout=0.0"]


def _counted_and_estimated(overrides: list[str], kind: str, tmp_path: Path) -> tuple[float, float]:
    from attnlab.training.build import build_module, build_task_data
    from attnlab.training.perf import count_training_flops

    cfg = compose(overrides, run_dir=tmp_path / "run")
    task = build_task_data(cfg)
    module = build_module(cfg, task)
    train = task.datasets["train"]
    batch = task.collate([train[i] for i in range(8)])
    counted, _ = count_training_flops(module, batch)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    source = float(batch["src"].shape[1] if "src" in batch else batch["ids"].shape[1])  # padded lengths: what runs
    target = float(batch["tgt_in"].shape[1]) if "tgt_in" in batch else 0.0
    if kind == "lm":
        source, target = 0.0, float(batch["ids"].shape[1])
    predicted = float(batch["scored"].sum()) / 8 if "scored" in batch else None
    estimated, _ = flops_per_example(model, kind, task.vocab_size, source, target, predicted)
    return float(counted), estimated * 8


ALGO = ["task.at_scale.cpu.train_size=64", "task.at_scale.cpu.val_size=8", "task.at_scale.cpu.test_size=8",
        "task.at_scale.cpu.train_max_len=12", "task.at_scale.cpu.test_max_len=12", "scale=cpu"]


@pytest.mark.parametrize(("experiment", "extra"), [
    ("ut/table4/transformer_copy", ["model.encoder_layers=2", "model.decoder_layers=2"]),
    ("ut/table4/ut_copy", ["model.recurrence.num_steps=5"]),  # one layer applied 5 times per stack
])
def test_encoder_decoder_flops_match_torchs_counter(experiment, extra, tmp_path):
    counted, estimated = _counted_and_estimated([f"experiment={experiment}", *ALGO, *SMALL, *extra], "seq2seq",
                                                tmp_path)
    assert estimated == pytest.approx(counted, rel=0.15), (counted, estimated)


def test_decoder_only_lm_flops_match_torchs_counter(tmp_path):
    root = require_shared_data("wikitext2/wiki.train.tokens")
    overrides = ["experiment=probes/qknorm/baseline_lr_1e-2", f"paths.data_root={root}", "task.block_len=32",
                 "task.max_train_tokens=20000", "task.tokenizer.vocab_size=500", *SMALL]
    counted, estimated = _counted_and_estimated(overrides, "lm", tmp_path)
    assert estimated == pytest.approx(counted, rel=0.15), (counted, estimated)


def test_encoder_classifier_flops_match_torchs_counter(tmp_path):
    overrides = ["experiment=probes/ut/transformer", "task.train_size=64", "task.val_size=8", "task.test_size=8",
                 *SMALL]
    counted, estimated = _counted_and_estimated(overrides, "mlm", tmp_path)
    assert estimated == pytest.approx(counted, rel=0.15), (counted, estimated)


def _cfg(sentences=128, tokens=None, steps=1000):
    model = {"d_model": 512, "d_ff": 2048, "encoder_layers": 6, "decoder_layers": 6, "recurrence": {"name": "stacked"}}
    return {"model": model, "batch": {"sentences_per_update": sentences, "tokens_per_update": tokens},
            "trainer": {"max_steps": steps}}


def test_a_token_budget_bounds_the_examples_and_small_updates_hit_the_step_floor():
    sampled = ("seq2seq", 8000, 20.0, 22.0, 21.0, 0.0)
    by_sentences = estimate_row("x", _cfg(sentences=128), sampled)
    by_tokens = estimate_row("x", _cfg(sentences=1024, tokens=2100), sampled)
    assert by_sentences.examples_per_update == 128
    assert by_tokens.examples_per_update == pytest.approx(100)  # 2100 padded source tokens / 21 per example
    # the measured floors (44 ms mean step, 109 ms wall per update on the H200) plus 54% for evaluation
    assert by_sentences.bound == "step floor"
    assert by_sentences.run_s == pytest.approx((1000 * 0.044 * 1.54, 1000 * 0.109 * 1.54), abs=0.05)  # 0.1 s
    big = estimate_row("x", _cfg(sentences=128), ("seq2seq", 8000, 2000.0, 2000.0, 2000.0, 0.0))
    assert big.bound == "flops"
    compute = big.flops_per_update / 989.5e12
    assert big.run_s == pytest.approx((1000 * compute / 0.3 * 1.54, 1000 * compute / 0.15 * 1.54), rel=1e-3)


def test_recurrent_rows_scale_the_floor_and_sparse_rows_cost_the_measured_path():
    sampled = ("seq2seq", 8000, 20.0, 22.0, 21.0, 0.0)
    ut = _cfg(sentences=128)
    ut["model"]["recurrence"] = {"name": "ut", "num_steps": 8}  # 8 applications per stack where 6 layers were
    row = estimate_row("x", ut, sampled)
    assert row.floor_scale == pytest.approx(16 / 12, abs=1e-3)
    assert row.run_s == pytest.approx((1000 * 0.044 * 16 / 12 * 1.54, 1000 * 0.109 * 16 / 12 * 1.54), rel=1e-3)
    big = ("mlm", 8000, 4096.0, 0.0, 4096.0, 600.0)
    dense, sparse = _cfg(sentences=64), _cfg(sentences=64)
    sparse["model"]["attention"] = {"name": "bigbird"}
    ratio = estimate_row("x", sparse, big).run_s[1] / estimate_row("x", dense, big).run_s[1]
    assert ratio == pytest.approx(462 / 41.6, rel=1e-3)  # full 462k vs blocked sparse 41.6k tokens/s, H200


def test_reproduce_list_gpu_sums_the_estimates_over_rows_and_seeds(tmp_path, capsys):
    from attnlab.results.listing import main
    from tests.experiments.paper_presets import presets

    rows = {e: {"run_s": 1800.0, "bound": "flops"} for e in presets("ut/table4")}
    estimates = tmp_path / "estimates.json"
    estimates.write_text(json.dumps({"rows": rows}))
    assert main(["--seeds", "1,2", "--scale", "gpu", "--gpu-estimates", str(estimates)]) == 0
    from tests.experiments.test_presets import listing_blocks

    lines = listing_blocks(capsys.readouterr().out)
    # 6 presets x 2 seeds x 0.5 h = 6 GPU-h over the table's three specs
    assert "~6.0 GPU-h" in lines["reproduce-ut-table4"], lines["reproduce-ut-table4"]
    assert "not estimated" in lines["reproduce-ut-table7"]  # no estimate for its presets in this file
    assert "no one-GPU protocol" in lines["reproduce-synthesizer-table4"]
    assert "laptop protocol" in lines["reproduce-probes-ut"]


def test_reproduce_list_gpu_without_estimates_says_how_to_make_them(tmp_path, capsys):
    from attnlab.results.listing import main

    assert main(["--scale", "gpu", "--gpu-estimates", str(tmp_path / "none.json")]) == 2
    assert "make gpu-estimates" in capsys.readouterr().err


def test_committed_estimates_cover_every_gpu_preset_and_state_their_assumptions():
    from tests.experiments.paper_presets import gpu_presets

    path = Path(__file__).resolve().parents[2] / "results" / "gpu" / "estimates.json"
    data = json.loads(path.read_text())
    assert "NOT measured" in data["what"]
    assert {"peak_flops", "mfu", "step_floor_s", "eval_share", "sparse_slowdown"} <= set(data["assumptions"])
    assert all(low < high for low, high in (row["run_s"] for row in data["rows"].values()))  # ranges, not points
    assert sorted(set(gpu_presets()) - set(data["rows"])) == [], "run `make gpu-estimates` and commit the file"

