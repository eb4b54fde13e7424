"""A real two-process DDP run (``hardware=ddp_sim``, gloo on CPU) in the default tier: Lightning's child must
start in rank 0's run folder (issue 42: every multi-process run died at launch on the folder lock, and the
test sat in the slow tier that CI does not run). About 15 seconds."""

from __future__ import annotations

import pytest

from attnlab.results.record import read_record, validate_record
from tests.test_slow import SMALL, _train


def test_ddp_sim_two_cpu_processes(tmp_path):
    """hardware=ddp_sim really starts two gloo processes; rank 0 alone writes one run folder and record."""
    run_dir = tmp_path / "run"
    proc = _train([*SMALL, "hardware=ddp_sim", "hardware.max_batch_per_device=8", f"hydra.run.dir={run_dir}"],
                  tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_record(run_dir / "results.json")
    assert validate_record(record) == []
    assert record["hardware"]["devices"] == 2 and record["status"] == "completed"
    assert record["cost"]["steps"] == 6
    assert record["metrics"]["final"]["test/seq_acc"] is not None
    # one run folder only: the second process reuses the first one's folder (no duplicate outputs)
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == ["run"]
    # one writer per log file: rank 0's train.log holds the run's lines once, the child logs beside it
    assert sorted(p.name for p in run_dir.glob("*.log")) == ["train.log", "train.node0-local1.log"]
    assert (run_dir / "train.log").read_text().count("run folder: ") == 1


def _final_weights(run_dir):
    import torch

    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    return ckpt["state_dict"], ckpt["global_step"]


@pytest.mark.slow
def test_an_update_is_the_same_over_micro_batches_and_ranks(tmp_path):
    """Issue 36: the global batch and its loss must not depend on how hardware splits it. 16 sentences of
    different lengths per update, 20 updates: as one micro-batch, as 2 accumulated micro-batches of 8, and as
    2 gloo processes of 8 each end at the same weights (a mean of micro-batch means weighs a token by its
    micro-batch's size and drifts apart)."""
    import torch

    steps = ["trainer.max_steps=20", "trainer.val_check_interval=20", "trainer.limit_val_batches=1",
             "trainer.limit_test_batches=1", "batch.sentences_per_update=16", "logger=csv"]
    base = [a for a in SMALL if not a.startswith(("trainer.max_steps", "trainer.val_check_interval",
                                                   "batch.sentences_per_update"))]
    runs = {"one": ["hardware.max_batch_per_device=16"], "accumulated": ["hardware.max_batch_per_device=8"],
            "ddp": ["hardware=ddp_sim", "hardware.max_batch_per_device=8"]}
    weights, trained_tokens = {}, {}
    for name, extra in runs.items():
        run_dir = tmp_path / name
        proc = _train([*base, *steps, *extra, f"hydra.run.dir={run_dir}"], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        weights[name], step = _final_weights(run_dir)
        assert step == 20
        cost = read_record(run_dir / "results.json")["cost"]  # tokens/s x s/step x steps: the tokens counted
        trained_tokens[name] = round(cost["tokens_per_s"] * cost["step_s"] * cost["steps"])
    # The record's tokens/s is global: the ranks' tokens summed, not rank 0's doubled (their shards differ).
    assert trained_tokens["ddp"] == trained_tokens["one"] == trained_tokens["accumulated"]
    one = weights["one"]
    # The key projections' biases have a zero gradient in exact arithmetic (softmax ignores a constant added to
    # a row of scores), so Adam turns summation-order noise into full steps there: not compared.
    compared = [key for key in one if not key.endswith("k_proj.bias")]
    assert len(compared) > 20
    for name in ("accumulated", "ddp"):
        for key in compared:
            torch.testing.assert_close(weights[name][key], one[key], atol=1e-6, rtol=1e-5, msg=lambda m, k=key,
                                       n=name: f"{n}: {k}: {m}")


@pytest.mark.slow
def test_a_ddp_run_stopped_and_resumed_ends_where_the_uninterrupted_one_does(tmp_path):
    """Issue 36: resume under DDP. Two gloo ranks train 8 updates in one go, and 4 + 4 with a resume from the
    step-4 checkpoint in between (every rank restores its own data position and random state): both end at
    the same weights, bit for bit, and the resumed run's record counts 8 steps once."""
    import torch

    common = [*SMALL, "hardware=ddp_sim", "hardware.max_batch_per_device=8", "trainer.val_check_interval=4",
              "callbacks.checkpoint.every_n_steps=2", "model.dropout=0.1", "logger=csv"]
    common = [a for a in common if not a.startswith(("trainer.max_steps", "trainer.val_check_interval=3"))]
    whole, split = tmp_path / "whole", tmp_path / "split"
    proc = _train([*common, "trainer.max_steps=8", f"hydra.run.dir={whole}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _train([*common, "trainer.max_steps=4", f"hydra.run.dir={split}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _train([*common, "trainer.max_steps=8", f"hydra.run.dir={split}"], tmp_path)  # resume=auto
    assert proc.returncode == 0, proc.stderr[-3000:]
    (expected, step_a), (got, step_b) = _final_weights(whole), _final_weights(split)
    assert step_a == step_b == 8
    assert all(torch.equal(got[key], value) for key, value in expected.items())
    record = read_record(split / "results.json")
    assert record["status"] == "completed" and record["cost"]["steps"] == 8
