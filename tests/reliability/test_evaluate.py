"""``attnlab-eval``: test a run folder or a checkpoint, weights-only, eval.json written atomically."""

from __future__ import annotations

import json

import pytest

from attnlab.cli.evaluate import main as eval_main
from attnlab.results.record import read_record
from attnlab.training.evaluation import evaluate
from tests.reliability.helpers import one_clear_line, run_cli


def test_eval_of_a_run_folder_reproduces_the_record_and_writes_eval_json(trained_run, capsys):
    eval_main([str(trained_run)])
    out = capsys.readouterr().out
    written = trained_run / "checkpoints" / "eval.json"
    assert f"written: {written}" in out
    result = json.loads(written.read_text())
    record = read_record(trained_run / "results.json")
    assert result["step"] == record["cost"]["steps"]
    test_metrics = {k: v for k, v in record["metrics"]["final"].items() if k.startswith("test")}
    assert result["metrics"] == test_metrics  # the final weights, tested again, give the same numbers
    assert not list(written.parent.glob("*.tmp*"))


def test_eval_of_the_best_checkpoint_with_an_override(trained_run):
    result = evaluate(trained_run, which="best", overrides=["batch.eval_batch_size=4"])
    best = result["checkpoint"]
    assert "/checkpoints/step" in best and result["written"].endswith(".eval.json")
    assert set(result["metrics"]) >= {"test/seq_acc", "test/char_acc"}


@pytest.mark.parametrize("argv", [["which=worst"], ["trainer.max_stepz=3"]], ids=["bad-which", "misspelled-key"])
def test_eval_refuses_bad_arguments(argv, trained_run, capsys):
    code, err = run_cli(eval_main, [str(trained_run), *argv], capsys)
    assert code == 2 and one_clear_line(err)
