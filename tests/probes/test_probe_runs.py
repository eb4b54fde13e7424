"""Probe runs end to end (tiny): the depth probe's per-hop scores and steps, the attended fraction of dense
and sparse encoders, and the per-group score against counts done by hand."""

from __future__ import annotations

import pytest
import torch

from attnlab.metrics import GroupedAnswerScore
from attnlab.training.run import run
from tests.conftest import TINY, compose

TINY_HOPS = ["task.length=24", "task.num_keys=6", "task.num_queries=8", "task.max_hops=3", "task.train_size=64",
             "task.val_size=8", "task.test_size=16", "trainer.max_steps=3", "trainer.val_check_interval=3",
             "model.d_model=16", "model.d_ff=32", "model.num_heads=2", "batch.eval_batch_size=8"]


def test_grouped_score_counts_answers_and_steps_per_group():
    score = GroupedAnswerScore(max_groups=5)
    score.update(torch.tensor([1, 1, 2, 3]), torch.tensor([True, False, True, True]),
                 torch.tensor([2.0, 4.0, 5.0, 7.0]))
    score.update(torch.tensor([3]), torch.tensor([False]), torch.tensor([9.0]))
    out = {k: float(v) for k, v in score.compute().items()}
    assert out == pytest.approx({"acc_h1": 0.5, "steps_h1": 3.0, "acc_h2": 1.0, "steps_h2": 5.0, "acc_h3": 0.5,
                                 "steps_h3": 8.0, "acc_grouped": 0.6, "steps_mean": 5.4, "steps_gain": 5.0,
                                 # steps 2, 4, 5, 7, 9 about 5.4: squared deviations sum to 29.2, / 5 answers
                                 "steps_std": (29.2 / 5) ** 0.5})
    with pytest.raises(ValueError, match="beyond"):
        score.update(torch.tensor([5]), torch.tensor([True]), torch.tensor([1.0]))


@pytest.mark.parametrize(("experiment", "steps"), [("probes/ut/ut", 4.0), ("probes/ut/transformer", 4.0),
                                                   ("probes/ut/ut_act", None)])
def test_the_depth_probe_records_accuracy_and_steps_per_hop_count(experiment, steps, tmp_path):
    overrides = [f"experiment={experiment}", *TINY, *TINY_HOPS, "model.encoder_layers=4"]
    # run() applies the scale again: it must know what the command line set (the presets' at_scale blocks)
    record = run(compose(overrides, run_dir=tmp_path), run_dir=tmp_path, command="pytest", cli_overrides=overrides)
    final = record["metrics"]["final"]
    for h in (1, 2, 3):
        assert 0.0 <= final[f"test/acc_h{h}"] <= 1.0
    if steps is not None:  # fixed depth: every answer gets the model's depth
        assert [final[f"test/steps_h{h}"] for h in (1, 2, 3)] == [steps] * 3 and final["test/steps_gain"] == 0.0
        assert final["test/steps_std"] == 0.0
    else:  # ACT: halting steps between 1 and act_max_steps (2 x 4 layers), read from the model, not the depth
        assert all(1.0 <= final[f"test/steps_h{h}"] <= 8.0 for h in (1, 2, 3))
        assert final["test/steps_gain"] == pytest.approx(final["test/steps_h3"] - final["test/steps_h1"])


@pytest.mark.parametrize(("attention", "fraction"), [("vanilla", 1.0), ("bigbird", None)])
def test_encoder_records_its_attended_fraction_dense_ones_all_keys(attention, fraction, tmp_path):
    extra = [] if attention == "vanilla" else ["model.attention.block_size=8", "model.attention.window_blocks=1",
                                               "model.attention.num_random_blocks=0",
                                               "model.attention.num_global_blocks=0"]
    overrides = ["experiment=probes/bigbird/full", *TINY, f"model/attention={attention}", *extra,
                 "task.length=64", "task.num_pairs=4", "task.num_queries=4", "task.test_size=8", "task.val_size=8",
                 "model.d_model=16", "model.d_ff=32", "model.num_heads=2"]
    record = run(compose(overrides, run_dir=tmp_path), run_dir=tmp_path, command="pytest", cli_overrides=overrides)
    coverage = record["extra"]["attention_coverage"]["attended_fraction_mean"]
    if fraction is not None:
        assert coverage == fraction
    else:  # a window of one 8-token block over 8 blocks: each query attends its own block only
        assert coverage == pytest.approx(1 / 8)
