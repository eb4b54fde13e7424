"""Logs for cluster users (train.log says what runs and how it goes; no progress-bar flood in a file), and
quiet command lines (attnlab-eval prints each line once and no adverts; ``debug=limit`` and ``make help``)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import warnings

import pytest

from tests.conftest import REPO, TINY_ALGO, train_cli

SMALL = ["model=transformer_tiny", "batch.sentences_per_update=8", "batch.eval_batch_size=8", "optim.warmup_steps=2"]


@pytest.fixture(scope="module")
def limit_run(tmp_path_factory):
    """A ``debug=limit`` run (20 steps, its own log interval) through the real CLI, warnings recorded."""
    root = tmp_path_factory.mktemp("logs")
    run_dir = root / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_cli(root, [*SMALL, *TINY_ALGO, "debug=limit", "seed=4", f"hydra.run.dir={run_dir}"])
    return run_dir, [str(w.message) for w in caught]


def test_train_log_starts_with_what_runs(limit_run):
    run_dir, _ = limit_run
    log = (run_dir / "train.log").read_text()
    assert f"run folder: {run_dir.resolve()}" in log
    assert "config: task algo/copy, model transformer_tiny, attention vanilla, recurrence stacked, seed 4, " \
           "scale cpu, debug limit" in log
    assert "model: d_model 64, 4 heads" in log
    assert "training: 20 steps, 8 sentences per update, adam lr 0.001 (inverse_sqrt, warmup 2)" in log
    assert "data: train 64, val 8, test 8" in log  # the scaled sizes (TINY_ALGO), not the paper's
    assert re.search(r"tokenizer: vocabulary \d+", log)
    assert re.search(r"parameters: [\d,]+ total, [\d,]+ trainable", log)
    assert "batching: micro-batch 8 x 1 accumulation x 1 device(s)" in log


def test_train_log_has_a_metrics_line_every_log_interval_and_after_validation(limit_run):
    run_dir, _ = limit_run
    log = (run_dir / "train.log").read_text()
    # the line reads the training loss, the latest validation metrics and the learning rate first (issue 52.6)
    steps = [int(s) for s in re.findall(r"step (\d+)/20  train/loss [\d.]+  (?:val/\S+ \S+  )*lr \S+", log)]
    assert steps == [5, 10, 15, 20]  # debug=limit logs every 5 steps
    assert re.search(r"step 15/20  train/loss [\d.]+  val/char_acc \S+  val/loss [\d.]+", log)  # validated at 10
    assert len(re.findall(r"validation at step (?:10|20)  .*val/loss", log)) == 2


def test_debug_limit_does_not_warn_about_its_own_logging_interval(limit_run):
    _, caught = limit_run
    assert not [m for m in caught if "logging interval" in m], caught


def test_no_progress_bar_when_the_output_is_not_a_terminal(tmp_path, monkeypatch):
    from attnlab.training.callbacks import build_callbacks
    from attnlab.training.run import build_trainer
    from tests.conftest import compose

    cfg = compose([*SMALL, *TINY_ALGO, "trainer.enable_progress_bar=true"], run_dir=tmp_path)

    def trainer():
        return build_trainer(cfg, tmp_path, callbacks=build_callbacks(cfg, tmp_path), loggers=[])

    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    assert trainer().progress_bar_callback is None  # a log file gets the metrics lines instead
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    assert trainer().progress_bar_callback is not None


def test_tokenizer_training_and_cache_hits_are_logged(tmp_path, caplog):
    from attnlab.tasks.tokenization import build_tokenizer

    texts = [f"the cat number {i} sat on the mat" for i in range(50)]
    with caplog.at_level(logging.INFO, logger="attnlab"):
        build_tokenizer("bpe", texts, vocab_size=60, cache_dir=tmp_path)
        build_tokenizer("bpe", texts, vocab_size=60, cache_dir=tmp_path)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("training a bpe tokenizer (vocabulary 60) on 50 lines") for m in messages), messages
    assert any(m.startswith("tokenizer trained in") for m in messages)
    assert any("loaded from the cache" in m for m in messages)


def test_attnlab_eval_prints_each_line_once_and_no_advert(limit_run):
    run_dir, _ = limit_run
    out = subprocess.run([sys.executable, "-m", "attnlab.evaluate", str(run_dir)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    assert len(lines) == len(set(lines)), lines
    text = "\n".join(lines)
    assert "Tip" not in text and "litlogger" not in text and "GPU available" not in text, text
    printed = out.stdout.splitlines()  # progress, then the result (stderr is kept for a refusal's one line)
    assert any(ln.startswith("loading data: ") for ln in printed), out.stdout
    assert any(ln.startswith("evaluated ") for ln in printed) and any(ln.startswith("written: ") for ln in printed)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_help_shows_every_target_whole_in_one_column():
    out = subprocess.run(["make", "--no-print-directory", "help"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    targets = [m.group(1) for f in [REPO / "Makefile", *sorted((REPO / "make").glob("*.mk"))]
               for m in re.finditer(r"^([a-zA-Z0-9_%-]+):.*## ", f.read_text(), flags=re.M)]
    lines = out.stdout.splitlines()
    assert len(lines) == len(targets) and "\033" not in out.stdout  # no colour codes in a pipe
    columns = set()
    for target, line in zip(targets, lines, strict=True):
        assert line.startswith(f"  {target}  "), line
        columns.add(len(line) - len(line[2 + len(target):].lstrip()))
    assert len(columns) == 1, "descriptions start in one column"
