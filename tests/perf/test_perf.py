"""Throughput accounting (attnlab.training.perf) and the benchmark helpers; the benchmarks themselves are
scripts (benchmarks/), not tests."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from attnlab.training import perf

REPO = Path(__file__).resolve().parents[2]


def test_peak_table_answers_unknown_rather_than_guessing(monkeypatch):
    assert perf.peak_flops("cpu", "fp32") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA Mystery GPU 9000")
    assert perf.peak_flops("cuda", "bf16") is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    assert perf.peak_flops("cuda", "bf16") == pytest.approx(989.5e12)
    assert perf.peak_flops("cuda", "fp8") is None  # a dtype the table does not list is unknown too
    assert perf.precision_dtype("bf16-mixed") == "bf16" and perf.precision_dtype("32-true") == "fp32"


def test_measured_matmul_peak_is_a_positive_rate():
    peak = perf.measure_matmul_peak(torch.float32, n=128, seconds=0.05)
    assert math.isfinite(peak) and peak > 1e6


def test_flop_count_and_analytic_estimate_agree_on_a_linear_stack():
    model = nn.Sequential(nn.Linear(32, 64, bias=False), nn.Linear(64, 32, bias=False))
    x = torch.randn(10, 32)

    def step():
        model(x).sum().backward()

    flops, _ = perf.count_flops(step)
    params = 32 * 64 * 2
    # forward 2N per token, backward 4N (except the first layer's input gradient, not needed here)
    assert flops / 10 == pytest.approx(perf.transformer_flops_per_token(params, layers=0, d_model=0, context=0),
                                       rel=0.26)
    assert perf.mfu(100.0, 2.0, None) is None and perf.mfu(100.0, 2.0, 400.0) == pytest.approx(0.5)


def test_mfu_callback_logs_during_a_lightning_fit(monkeypatch):
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(16, 16)
            self._tokens_seen = 0

        def training_step(self, batch, batch_idx):
            (x,) = batch
            self._tokens_seen += x.shape[0]
            return self.net(x).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    cb = perf.MFUCallback(log_every=2, count_step=1)
    trainer = L.Trainer(max_steps=6, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[cb])
    trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(64, 16)), batch_size=8))
    m = trainer.callback_metrics
    # forward 2 * 16 * 16 per token, backward only the weight gradient (the input needs none): 2 * 16 * 16
    assert cb.flops_per_token == pytest.approx(2 * 2 * 16 * 16, rel=0.01)
    assert cb.peak_source == "measured" and cb.peak > 0
    assert float(m["perf/tokens_per_s"]) > 0
    # against a peak measured on this (possibly loaded) CPU the ratio is not shown: it went above 1 under load
    assert "perf/mfu" not in m and float(m["perf/peak_source"]) == 0.0
    # the run record's summary: the same FLOPs and peak, tokens/s over every timed step (5 of the 6)
    summary = cb.summary()
    assert summary["flops_per_token"] == cb.flops_per_token and summary["peak_source"] == "measured"
    assert cb._run_tokens == 5 * 8
    assert summary["mfu"] == pytest.approx(cb.flops_per_token * cb._run_tokens / cb._run_time / cb.peak)
    # a device with a datasheet peak: the MFU is shown, against that peak
    monkeypatch.setattr(perf, "peak_flops", lambda device, dtype: 1e15)
    listed = perf.MFUCallback(log_every=2, count_step=1)
    trainer = L.Trainer(max_steps=6, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[listed])
    trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(64, 16)), batch_size=8))
    assert 0 < float(trainer.callback_metrics["perf/mfu"]) < 1e-3 and listed.peak_source == "datasheet"


def test_run_record_carries_mfu_when_the_callback_is_on(tmp_path):
    from attnlab.training.run import run
    from tests.conftest import TINY, TINY_ALGO, compose

    cfg = compose([*TINY, *TINY_ALGO, "logger=none", "callbacks.mfu=true"], run_dir=tmp_path)
    record = run(cfg, run_dir=tmp_path, command="pytest")
    cost = record["cost"]
    assert cost["peak_source"] == "measured" and cost["peak_flops"] > 0 and cost["flops_per_token"] > 0
    assert 0 < cost["mfu"] < 1.5


def test_benchmark_helpers_ratios_and_subprocess_memory():
    sys.path.insert(0, str(REPO))
    from benchmarks._common import memory_in_subprocess, ratios, stats

    assert stats([3.0, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0}
    r = ratios({"a": [2.0, 4.0, 9.0], "b": [1.0, 1.0, 3.0]}, "a", "b")
    assert r == {"min": 2.0, "median": 3.0, "max": 4.0}
    peak = memory_in_subprocess(REPO / "benchmarks" / "bench_bigbird.py",
                                ["--memory-case", "blocked", "--length", "512"], timeout=120)
    assert peak is not None and peak >= 0


def test_quick_bench_runs_write_beside_the_committed_results():
    """``--quick`` (the CI smoke) must never replace the committed measurements in results/bench/."""
    import subprocess

    code = "import benchmarks._common as c; print(c.RESULTS)"
    quick = subprocess.run([sys.executable, "-c", code, "--quick"], cwd=REPO, capture_output=True, text=True)
    full = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert Path(quick.stdout.strip()) == REPO / "results" / "bench" / "quick"
    assert Path(full.stdout.strip()) == REPO / "results" / "bench"


def test_batching_benchmark_modes_differ_only_in_how_batches_are_formed():
    """Goal 16.2's tokens/s ratio is about batching: the two composed configs must train the same model with
    the same optimizer, task and hardware; an override that also moved the scale, the vocabulary or the
    model would make the ratio measure that instead."""
    sys.path.insert(0, str(REPO))
    from benchmarks.bench_batching import MODES, PRESET
    from omegaconf import OmegaConf

    from attnlab.training.compose import compose_checked

    token, sentence = (OmegaConf.to_container(compose_checked("train", [*PRESET, *extra]), resolve=False)
                       for extra in MODES.values())
    assert token["batch"]["tokens_per_update"] == 2000  # the laptop preset's token batches
    assert not sentence["batch"].get("tokens_per_update") and sentence["batch"]["sentences_per_update"] == 64
    assert {k: v for k, v in token.items() if k != "batch"} == {k: v for k, v in sentence.items() if k != "batch"}
    rest = ("tokens_per_update", "sentences_per_update")
    assert ({k: v for k, v in token["batch"].items() if k not in rest}
            == {k: v for k, v in sentence["batch"].items() if k not in rest})


@pytest.mark.slow
def test_make_bench_quick_smoke_runs_every_script(tmp_path):
    """What CI runs (``make bench BENCH_ARGS=--quick``): every script ends well, with or without the
    ``bench`` extra (the Hugging Face baseline is then skipped with one line saying how to add it)."""
    import importlib.util
    import subprocess

    out = subprocess.run([sys.executable, "benchmarks/run_all.py", "--quick"], cwd=REPO, capture_output=True,
                         text=True, timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    if importlib.util.find_spec("transformers") is None:
        assert "skipping the Hugging Face BigBird baseline" in out.stdout


def test_goal_verdicts_judge_the_median_in_the_stated_direction():
    sys.path.insert(0, str(REPO))
    from benchmarks._common import goal

    spread = {"min": 1.0, "median": 2.0, "max": 9.0}  # a max above the target must not make it met
    assert goal("t", "higher is better", spread, 2.5)["status"] == "MISSED by 20%"
    assert goal("t", "higher is better", spread, 2.0)["met"] is True
    lower = goal("t", "lower is better", spread, 2.5, "<=")
    assert lower["met"] is True and lower["target"] == "<= 2.5x"
    pct = goal("t", "overhead", 0.054, 0.05, "<=", unit="%", digits=1, scale=100)
    assert (pct["shown"], pct["target"], pct["met"]) == ("5.4%", "<= 5%", False)
    assert goal("t", "reported", 3.0)["status"] == "report"
    with pytest.raises(ValueError, match="op must be"):
        goal("t", "bad", 1.0, 1.0, ">")


def test_benchmark_block_is_written_from_the_recorded_goals(tmp_path, monkeypatch):
    """A benchmark's json with goals gives one table row per goal and its machine line; a json from before
    goals were recorded, or none at all, is named with the command that measures it - never left out."""
    import json

    sys.path.insert(0, str(REPO))
    import benchmarks._common as common
    from benchmarks import summary

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(common, "machine", lambda: "test machine, load average at start 0.5")
    g = common.goal("16.3", "beam 4 / greedy", {"min": 3.0, "median": 3.1, "max": 3.2}, 2.5, "<=")
    common.write_results("decoding", "# x\n", {}, [g])
    (tmp_path / "training.json").write_text(json.dumps({"machine": "old", "mfu": {}}))
    block = summary.render(tmp_path)
    assert "| `decoding` | 16.3 | beam 4 / greedy | 3.00/3.10/3.20x | <= 2.5x | MISSED by 24% |" in block
    assert "1 goals: 0 met, 1 missed" in block
    assert "- `decoding`: " in block and "test machine, load average at start 0.5" in block
    assert "`results/bench/training.json` was written before" in block and "bench_training.py" in block
    assert "`sweep`: not measured yet: run `python benchmarks/bench_sweep.py`" in block
    readme = "intro\n" + summary.START + "\nstale\n" + summary.END + "\noutro\n"
    assert summary.replace_block(readme, block) == "intro\n" + block + "\noutro\n"
    with pytest.raises(SystemExit, match="no <!-- attnlab-bench -->"):
        summary.replace_block("no markers", block)
    monkeypatch.setattr(summary, "PAGES", (tmp_path / "no_markers.md",))
    (tmp_path / "no_markers.md").write_text("intro\n")
    with pytest.raises(SystemExit, match="no page of .*no_markers.md has the <!-- attnlab-bench -->"):
        summary.pages()


def test_committed_benchmark_block_matches_results_bench():
    sys.path.insert(0, str(REPO))
    from benchmarks import summary

    pages = summary.pages()
    assert REPO / "docs" / "performance.md" in pages  # the table lives with the benchmarks' documentation
    for path, text in pages.items():
        assert summary.replace_block(text, summary.render()) == text, f"{path}: run `python benchmarks/summary.py`"


def _bigbird_mlm(impl: str, layers: int = 2):
    from attnlab.training.modules import MaskedLMModule

    attention = {"name": "bigbird", "block_size": 4, "window_blocks": 3, "num_global_blocks": 1,
                 "num_random_blocks": 1, "dense_fallback_len": 0, "impl": impl}
    model = dict(d_model=16, num_heads=2, d_ff=32, encoder_layers=layers, decoder_layers=0, dropout=0.1,
                 attention_dropout=0.0, activation_dropout=0.0, activation="relu", norm_first=True,
                 positions="sinusoidal", share_embeddings=True, tie_output=True, max_len=32,
                 cross_attention="auto", attention=attention, recurrence={"name": "stacked"})
    torch.manual_seed(0)
    return MaskedLMModule(model, dict(label_smoothing=0.0), dict(kind="mlm", vocab_size=40, pad_id=0,
                                                                 eval_splits={"test": "test"}), {})


def _mlm_batch(rows: int = 3, length: int = 32):
    g = torch.Generator().manual_seed(1)
    target = torch.randint(4, 40, (rows, length), generator=g)
    scored = torch.rand(rows, length, generator=g) < 0.2
    return {"ids": target.masked_fill(scored, 39), "target": target, "scored": scored,
            "chars": torch.full((rows, length), 3)}


def test_training_flops_count_the_executed_bigbird_blocks_whichever_kernel_serves_the_run(monkeypatch):
    """Issue 42: the blocked kernel computes in worker threads the FLOP counter does not see (its attention
    counted as 0) and eager FlexAttention makes the counter raise; counting runs the reference kernel, so the
    count is the same for every kernel and its attention share is the plan's executed blocks."""
    import attnlab.attention.bigbird as bigbird

    batch = _mlm_batch()
    counts = {impl: perf.count_training_flops(_bigbird_mlm(impl), batch) for impl in ("reference", "blocked", "flex")}
    assert len(set(counts.values())) == 1, counts
    flops, tokens = counts["reference"]
    assert tokens == 3 * 32
    # The attention core alone, from the plan tables (an independent count): per layer and head, the sparse
    # rows multiply R x K gathered key blocks of bs x bs (QK^T and PV), the global rows every key; forward
    # 2 matmuls of 2 * bs * keys * dh FLOPs per query block, backward twice the forward.
    module = _bigbird_mlm("reference")
    plans = [m.plan_for_length(32) for m in module.modules() if isinstance(m, bigbird.BigBirdAttention)]
    bs, dh, heads, rows = 4, 8, 2, 3
    expected = 0
    for plan in plans:
        r, k = plan.key_blocks.shape[1:]
        per_head = 2 * 2 * dh * bs * (r * k * bs + plan.dense_rows.numel() * 32)
        expected += 3 * rows * heads * per_head
    monkeypatch.setattr(bigbird, "blocksparse_attention", lambda q, k, v, plan, **kw: q + k + v)  # no matmul
    without_core, _ = perf.count_training_flops(_bigbird_mlm("reference"), batch)
    assert flops - without_core == expected


def test_counting_flops_leaves_out_the_recomputation_of_checkpointed_layers():
    """MFU counts a step's forward and backward once: with hardware.activation_checkpointing the counted pass
    ran each layer's forward again in the backward (about a third more FLOPs, MFU inflated by as much)."""
    from attnlab.models.recompute import recompute_layer_activations

    batch = _mlm_batch()
    wrapped = _bigbird_mlm("reference")
    assert recompute_layer_activations(wrapped.model) == 2
    recompute = [m.checkpoint_fn for m in wrapped.modules() if hasattr(m, "checkpoint_fn")]
    assert perf.count_training_flops(wrapped, batch) == perf.count_training_flops(_bigbird_mlm("reference"), batch)
    # and the layers recompute again afterwards
    assert [m.checkpoint_fn for m in wrapped.modules() if hasattr(m, "checkpoint_fn")] == recompute


def test_counting_flops_leaves_the_run_unchanged():
    """The counting pass is an extra forward and backward: it must not draw from the run's random state
    (dropout would then differ from a run without the MFU callback) nor leave gradients behind."""
    module = _bigbird_mlm("blocked").train()
    batch = _mlm_batch()
    for p in module.parameters():
        p.grad = torch.full_like(p, 0.5)
    torch.manual_seed(5)
    perf.count_training_flops(module, batch)
    after = torch.rand(4)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(4))
    assert all(torch.equal(p.grad, torch.full_like(p, 0.5)) for p in module.parameters())


def test_gpu_check_refuses_without_cuda_and_judges_a_report(capsys):
    """``make gpu-check``: on a machine without CUDA one line and exit 2 (``--dry-run`` checks the script
    there); the goals are judged from the measured rows, and what was not measured is said, not dropped."""
    sys.path.insert(0, str(REPO))
    from benchmarks import gpu_check

    if not torch.cuda.is_available():
        assert gpu_check.main([]) == 2
        assert capsys.readouterr().err.count("\n") == 1
    assert gpu_check.main(["--dry-run", "--only", "kernels,nope"]) == 2
    row = {"length": 4096, "causal": False, "batch": 4, "kernel": "flex", "dense_ms": 1.8, "sparse_ms": 1.2,
           "speedup": 1.5, "ideal": 2.5, "of_ideal": 0.6, "memory_vs_dense": 1.7}
    report = {"dry_run": False, "kernels": {"rows": [row, {"length": 65536, "causal": True, "error": "OOM"}]},
              "training": {"full attention, 4096": {"tokens_per_s": 100.0},
                           "BigBird-ITC, 4096": {"tokens_per_s": 140.0}},
              "tests": {"counts": {"passed": 9, "failed": 1}, "summary": "1 failed, 9 passed"}, "laptop": {}}
    goals = {g["key"]: g for g in gpu_check.goals_of(report)}
    assert goals["35.kernel.4096.0"]["met"] is True and goals["35.memory.4096.0"]["met"] is False
    assert goals["35.kernel.65536.1"]["status"] == "not measured: OOM"
    assert goals["35.table10.4096"]["met"] is True and goals["35.table10.16384"]["met"] is None
    assert goals["35.tests"]["met"] is False and goals["36.laptop"]["met"] is None
