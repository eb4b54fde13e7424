"""Hyper-parameter search the Hydra way (issue 52.5): the task function returns the monitored metric
(``optimized_metric``) and ``hparams_search=copy_lr`` runs an Optuna search from the command line."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import yaml

from attnlab.training.sweeps import optimized_value
from tests.conftest import REPO, TINY_ALGO, compose

HAS_OPTUNA = importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is not None
needs_optuna = pytest.mark.skipif(not HAS_OPTUNA, reason="hydra-optuna-sweeper not installed (pip install "
                                                         "'attnlab[optuna]'; the dev extra has it)")
RECORD = {"metrics": {"final": {"val/loss": 2.5, "test/seq_acc": 0.75}, "best": {"val/bleu": 31.0}}}


def test_the_task_function_returns_the_optimized_metric():
    assert optimized_value(RECORD, "val/loss") == 2.5
    assert optimized_value(RECORD, "val/bleu") == 31.0  # tracked only as best
    assert optimized_value(RECORD, None) is None  # a plain run returns nothing to a sweeper
    with pytest.raises(SystemExit, match="optimized_metric=val/acc is not a metric of the run; it has "
                                         "test/seq_acc, val/bleu, val/loss"):
        optimized_value(RECORD, "val/acc")


def test_the_optimized_metric_leaves_the_config_hash_alone():
    from attnlab.training.config_hash import asked_config_hash

    assert asked_config_hash(compose(["optimized_metric=val/loss"])) == asked_config_hash(compose([]))


@pytest.mark.parametrize("interval, refused", [(500, True), (60, False)])
def test_a_trial_that_would_never_validate_is_refused_before_it_trains(interval, refused):
    """`hparams_search=copy_lr trainer.max_steps=60` (as once documented) trained a whole trial, then failed: the
    default validation interval (500) never came, so the trial had no val/loss to return."""
    from attnlab.errors import ConfigError
    from attnlab.training.config import validate

    cfg = compose(["optimized_metric=val/loss", "trainer.max_steps=60", f"trainer.val_check_interval={interval}"])
    if refused:
        with pytest.raises(ConfigError, match=r"optimized_metric=val/loss needs a validation, but "
                                              r"trainer.val_check_interval=500 > trainer.max_steps=60"):
            validate(cfg)
    else:
        validate(cfg)


@needs_optuna
def test_hparams_search_composes_an_optuna_sweep():
    cfg = compose(["hparams_search=copy_lr"], scale=False)
    assert cfg.optimized_metric == "val/loss"
    from attnlab.training.compose import compose as compose_raw

    hydra = compose_raw("train", ["hparams_search=copy_lr"], with_hydra=True).hydra
    assert hydra.sweeper._target_.endswith("OptunaSweeper") and hydra.sweeper.direction == "minimize"
    assert set(hydra.sweeper.params) == {"optim.lr", "optim.warmup_steps"}


@pytest.mark.slow
@needs_optuna
def test_a_three_trial_search_on_a_tiny_task(tmp_path):
    sweep = tmp_path / "sweep"
    argv = ["hparams_search=copy_lr", "hydra.sweeper.n_trials=3", "model=transformer_tiny", "trainer.max_steps=20",
            "trainer.val_check_interval=10", "batch.sentences_per_update=16", *TINY_ALGO, f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "attnlab.train", *argv], cwd=tmp_path, capture_output=True, text=True,
                         env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    records = sorted(sweep.glob("*/results.json"))
    assert len(records) == 3
    import json

    losses = [json.loads(p.read_text())["metrics"]["final"]["val/loss"] for p in records]
    assert results["best_value"] == pytest.approx(min(losses))
    assert set(results["best_params"]) == {"optim.lr", "optim.warmup_steps"}
