"""One fast_dev_run per new kind of head: MT with BLEU, classification with MCC, regression, subword LM
(word-level perplexity) and LAMBADA (last-word accuracy); each must land its metrics in the run record."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlab.training.run import run
from tests.conftest import TINY, compose, require_shared_data


def _run(tmp_path: Path, overrides: list[str], data_root: Path) -> dict:
    cfg = compose([*TINY, "debug=fdr", f"paths.data_root={data_root}", *overrides], run_dir=tmp_path / "run")
    if "tokenizer_cache" in cfg.task:
        cfg.task.tokenizer_cache = str(tmp_path / "tok")
    record = run(cfg, run_dir=tmp_path / "run", command="pytest")
    assert record["status"] == "completed"
    return record


def test_mt_multi30k_reports_sacrebleu_with_signature(tmp_path):
    root = require_shared_data("multi30k")
    record = _run(tmp_path, ["task=mt/multi30k_en_de", "task.max_train_pairs=64", "task.max_eval_pairs=8",
                             "task.at_scale.cpu.tokenizer.vocab_size=300", "task.decoding.max_len_b=2",
                             "task.decoding.max_len_a=0.5"], root)
    final = record["metrics"]["final"]
    assert "test/bleu" in final and "test/chrf" in final and "test/seq_acc" in final
    assert "tok:13a" in record["metric_flavours"]["bleu"] and "UNKNOWNTOKENINHYP" in record["metric_flavours"]["bleu"]


def test_glue_cola_reports_mcc(tmp_path):
    root = require_shared_data("glue/CoLA")
    record = _run(tmp_path, ["task=glue/cola", "task.max_train_examples=64", "task.tokenizer.vocab_size=200"], root)
    final = record["metrics"]["final"]
    assert "test/mcc" in final and "test/acc" in final
    assert "dev" in record["metric_flavours"]["split"]


def test_glue_stsb_regression_reports_correlations(tmp_path):
    root = require_shared_data("glue/STS-B")
    record = _run(tmp_path, ["task=glue/stsb", "task.max_train_examples=64", "task.tokenizer.vocab_size=200"], root)
    final = record["metrics"]["final"]
    assert {"test/pearson", "test/spearman", "test/mse"} <= set(final)


def test_subword_lm_reports_subword_and_word_perplexity(tmp_path, tiny_wikitext):
    record = _run(tmp_path, ["task=lm/lm1b", "task.at_scale.cpu.block_len=16",
                             "task.at_scale.cpu.tokenizer.vocab_size=60"], tiny_wikitext)
    final = record["metrics"]["final"]
    assert final["test/ppl"] > 1 and final["test/word_ppl"] > final["test/ppl"]  # fewer words than subwords
    assert "word_ppl" in record["metric_flavours"] and "STAND-IN" in record["metric_flavours"]["data"]


def test_lambada_reports_last_word_accuracy(tmp_path, tiny_wikitext):
    root = tiny_wikitext
    (root / "lambada").mkdir()
    for name in ("lambada_test_plain_text.txt", "lambada_development_plain_text.txt"):
        (root / "lambada" / name).write_text("the cat sat on a mat and the dog ran to the park\n" * 8)
    record = _run(tmp_path, ["task=lm/lambada", "task.at_scale.cpu.block_len=16",
                             "task.at_scale.cpu.tokenizer.vocab_size=60"], root)
    final = record["metrics"]["final"]
    assert 0.0 <= final["test/last_word_acc"] <= 100.0 and final["test/last_word_ppl"] > 1
    assert "test_dev/last_word_acc" in final


@pytest.mark.parametrize("option", ["qa/babi"])
def test_babi_reports_failed_tasks(option, tmp_path):
    root = require_shared_data("babi")
    record = _run(tmp_path, [f"task={option}", "task.tasks=[1,2]", "task.max_questions_per_task=60",
                             "task.at_scale.cpu.max_story_sentences=10"], root)
    final = record["metrics"]["final"]
    assert {"test/failed_tasks", "test/mean_error", "test/acc"} <= set(final)


def test_run_record_names_the_length_penalty_used(tmp_path):
    from tests.conftest import TINY_ALGO

    cfg = compose([*TINY, *TINY_ALGO, "debug=fdr", "task=algo/copy", "task.decoding.strategy=beam",
                   "task.decoding.beam_size=2", "task.decoding.length_penalty_alpha=1.0",
                   "task.decoding.length_penalty=fairseq"], run_dir=tmp_path / "run")
    record = run(cfg, run_dir=tmp_path / "run", command="pytest")
    assert record["status"] == "completed" and "test/seq_acc" in record["metrics"]["final"]
    assert "fairseq length penalty L^1.0" in record["metric_flavours"]["decoding"]
