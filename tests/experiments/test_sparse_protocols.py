"""The laptop protocols where sparse attention is the variable under study (experiments/lra/README.md,
experiments/bigbird/README.md): ListOps lengths where BigBird is really sparse, BigBird's attended fraction
computed from its plan, and equal training tokens across the rows of BigBird Table 10.

Composes the presets as the CLI does (the cached compositions of test_rules.py); no training.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from attnlab.attention.bigbird import BigBirdAttention, BigBirdOptions
from attnlab.tasks.listops import generate
from attnlab.training.sparsity import attended_fraction, coverage_summary
from tests.experiments.paper_presets import presets
from tests.experiments.test_rules import _config


def _bigbird(cfg, max_len: int) -> BigBirdAttention:
    options = {k: v for k, v in OmegaConf.to_container(cfg.model.attention, resolve=True).items() if k != "name"}
    return BigBirdAttention(int(cfg.model.d_model), int(cfg.model.num_heads), options=BigBirdOptions(**options),
                            max_len=max_len)


def test_attended_fraction_matches_a_hand_count():
    # 64 positions in 8 blocks of 8, window 3, no global or random blocks: block rows 0 and 7 see 2 blocks,
    # the 6 others 3, so 8 * 8 * (2 * 2 + 6 * 3) = 1408 of the 64^2 = 4096 pairs.
    m = BigBirdAttention(16, 2, options=BigBirdOptions(block_size=8, window_blocks=3, num_global_blocks=0,
                                                       num_random_blocks=0, dense_fallback_len=0), max_len=64)
    assert attended_fraction(m, 64) == pytest.approx(1408 / 4096)
    # ITC, 2 global blocks (first and last): they attend everything and are attended by everything
    itc = BigBirdAttention(16, 2, options=BigBirdOptions(block_size=8, window_blocks=3, num_global_blocks=2,
                                                         num_random_blocks=0, dense_fallback_len=0), max_len=64)
    # rows 0 and 7: 8 blocks; rows 1 and 6: window (3) + the far global (1) = 4; rows 2-5: 3 + 2 = 5
    assert attended_fraction(itc, 64) == pytest.approx(64 * (2 * 8 + 2 * 4 + 4 * 5) / 4096)
    dense = BigBirdAttention(16, 2, options=BigBirdOptions(block_size=8), max_len=64)
    assert attended_fraction(dense, 16) == 1.0  # 2 blocks <= g + w + r: the dense fallback


def test_listops_cpu_protocol_lengths_and_test_size():
    cfg = _config("lra/table1/bigbird_listops", "cpu")
    task = cfg.task
    assert (task.min_len, task.max_len) == (256, 512)
    assert task.test_size >= 2000  # a binomial standard error of at most ~1.1 points
    # The generator's length distribution over that range: spread across it, not piled at the lower end.
    lengths = [len(t) for t, _ in generate(400, min_len=task.min_len, max_len=task.max_len,
                                           max_depth=task.max_depth, max_args=task.max_args, seed=5)]
    assert min(lengths) >= 256 and max(lengths) <= 512
    quartiles = statistics.quantiles(lengths, n=4)
    assert 280 < quartiles[0] < quartiles[1] < quartiles[2] < 490, quartiles


def test_listops_claims_require_accuracy_clearly_above_the_label_prior():
    """The LRA spec's claims need the Transformer above the share of the most frequent test label (a model
    that learned nothing but the prior would make every 'within 2 points' claim hold vacuously). The
    threshold must sit several binomial standard errors above that share, computed from the generated test
    split as the loader makes it."""
    import collections

    from attnlab.results.spec import load_spec
    from attnlab.tasks.listops import load_listops

    cfg = _config("lra/table1/transformer_listops", "cpu")
    task = {**OmegaConf.to_container(cfg.task, resolve=True), "train_size": 1, "val_size": 1}  # test split only
    test = load_listops(task, seed=1).datasets["test"].examples
    prior = max(collections.Counter(label for _, label in test).values()) / len(test)
    se = (prior * (1 - prior) / len(test)) ** 0.5
    spec = load_spec("lra/table1_listops", Path(__file__).resolve().parents[2] / "experiments")
    for claim in spec.claims:
        floors = [r.at_least for r in claim.requires if r.field == "metrics.final.test/acc"]
        assert floors, f"{claim.claim}: no accuracy floor"
        assert all(f >= prior + 4 * se for f in floors), (claim.claim, prior, floors)
        assert all(f <= 0.3 for f in floors)  # far below the paper's ~36%: a floor, not the result


def test_bigbird_attends_at_most_half_the_keys_at_every_listops_cpu_length():
    cfg = _config("lra/table1/bigbird_listops", "cpu")
    module = _bigbird(cfg, int(cfg.task.max_len))
    fractions = {n: attended_fraction(module, n) for n in range(cfg.task.min_len, cfg.task.max_len + 1)}
    worst = max(fractions, key=fractions.get)
    assert fractions[worst] <= 0.5, f"BigBird attends {fractions[worst]:.1%} of the keys at length {worst}"
    summary = coverage_summary(module, fractions)  # what the run record states (extra.attention_coverage)
    assert summary["attended_fraction_max"] == pytest.approx(fractions[worst])
    assert summary["dense_fallback_share"] == 0.0


def test_listops_rows_share_one_cpu_schedule_that_finishes():
    configs = {e: _config(e, "cpu") for e in presets("lra/table1")}
    schedules = {(c.trainer.max_steps, c.optim.warmup_steps, c.optim.schedule, c.optim.lr) for c in configs.values()}
    assert len(schedules) == 1, schedules
    steps, warmup, _, _ = schedules.pop()
    assert warmup == steps // 10


@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_bigbird_table10_rows_train_on_the_same_tokens_per_update(scale):
    configs = {e: _config(e, scale) for e in presets("bigbird/table10")}
    tokens = {e: c.task.block_len * c.batch.sentences_per_update for e, c in configs.items()}
    assert len(set(tokens.values())) == 1, tokens
    assert {c.trainer.max_steps for c in configs.values()} == {next(iter(configs.values())).trainer.max_steps}


@pytest.mark.parametrize("experiment", presets("bigbird/table1") + presets("bigbird/table10"))
def test_bigbird_rows_never_fall_back_to_dense_attention(experiment):
    cfg = _config(experiment, "cpu")
    if cfg.model.attention.name != "bigbird":
        return
    assert cfg.model.attention.dense_fallback_len == 0
    module = _bigbird(cfg, int(cfg.task.block_len))
    assert not module.uses_dense(int(cfg.task.block_len))
    assert attended_fraction(module, int(cfg.task.block_len)) < 1.0


def test_a_bigbird_run_records_its_attended_fraction_and_step_time(tmp_path):
    from attnlab.training.run import run
    from tests.conftest import TINY, compose

    overrides = [*TINY, "experiment=lra/table1/bigbird_listops", "model.d_model=16", "model.num_heads=2",
                 "model.d_ff=32", "task.at_scale.cpu.train_size=16", "task.at_scale.cpu.val_size=4",
                 "task.at_scale.cpu.test_size=4", "task.at_scale.cpu.min_len=80", "task.at_scale.cpu.max_len=96",
                 "logger=none", "callbacks=none"]
    cfg = compose(overrides, run_dir=tmp_path / "run")
    record = run(cfg, run_dir=tmp_path / "run", command="pytest", cli_overrides=overrides)
    coverage = record["extra"]["attention_coverage"]
    assert coverage["block_size"] == 8 and 80 <= coverage["lengths"]["min"] <= coverage["lengths"]["max"] <= 96
    assert 0.0 < coverage["attended_fraction_min"] <= coverage["attended_fraction_mean"] \
        <= coverage["attended_fraction_max"] < 1.0
    assert record["cost"]["step_s"] > 0


def test_bigbird_table1_within_claim_requires_accuracy_above_the_token_prior():
    """BigBird Table 1's 'R + W within 2 points of full attention' needs full attention above the share of the
    most frequent masked target in the test split (two rows that learned only the prior would agree
    vacuously). The share is computed from the split the loader builds, with the evaluation mask."""
    import collections

    from attnlab.results.spec import load_spec
    from attnlab.tasks.masked_lm import load_masked_lm
    from tests.conftest import require_shared_data

    root = require_shared_data("wikitext2/wiki.test.tokens")
    cfg = _config("bigbird/table1/full", "cpu")
    task = {**OmegaConf.to_container(cfg.task, resolve=True), "data_root": str(root)}
    counts, scored = collections.Counter(), 0
    for block in load_masked_lm(task, seed=1).datasets["test"]:
        targets = block["target"][block["scored"]].tolist()
        counts.update(targets)
        scored += len(targets)
    prior = max(counts.values()) / scored
    spec = load_spec("bigbird/table1_building_blocks", Path(__file__).resolve().parents[2] / "experiments")
    within = [c for c in spec.claims if c.test == "within"]
    assert within
    for claim in within:
        floors = [r.at_least for r in claim.requires if r.field == "metrics.final.test/mlm_acc"]
        assert floors and all(f >= prior + 0.02 for f in floors), (claim.claim, prior, floors)
