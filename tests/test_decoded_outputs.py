"""Decoded test outputs beside the record (issue 15.5): one line per example in reference order, with sources
and references, so the sacreBLEU command line reproduces the recorded metric and errors can be read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.training.run import run
from tests.conftest import TINY, TINY_ALGO, compose, require_shared_data


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_mt_outputs_rescored_by_the_sacrebleu_cli_equal_the_recorded_metrics(tmp_path):
    import gzip

    root = require_shared_data("multi30k")
    cfg = compose([*TINY, "trainer.max_steps=40", "trainer.val_check_interval=40", "optim.lr=3e-3",
                   "callbacks=none", f"paths.data_root={root}", "task=mt/multi30k_en_de",
                   "task.max_train_pairs=64", "task.max_eval_pairs=8", "task.at_scale.cpu.tokenizer.vocab_size=300",
                   "task.decoding.strategy=greedy", "task.decoding.max_len_b=12"], run_dir=tmp_path / "run")
    cfg.task.tokenizer_cache = str(tmp_path / "tok")
    record = run(cfg, run_dir=tmp_path / "run", command="pytest")
    out = tmp_path / "run" / "outputs"
    refs, srcs = (gzip.decompress((root / "multi30k" / f"test_2016_flickr.{lang}.gz").read_bytes())
                  .decode("utf-8").splitlines()[:8] for lang in ("de", "en"))
    assert _lines(out / "test.ref") == [r.strip() for r in refs]  # reference order, raw text
    assert _lines(out / "test.src") == [s.strip() for s in srcs]
    hyps = _lines(out / "test.hyp")
    assert len(hyps) == 8
    rows = [json.loads(x) for x in _lines(out / "test.jsonl")]
    assert [r["hypothesis"] for r in rows] == hyps and [r["index"] for r in rows] == list(range(8))
    scores = subprocess.run([sys.executable, "-m", "sacrebleu", str(out / "test.ref"), "-i", str(out / "test.hyp"),
                             "-m", "bleu", "chrf", "-b", "-w", "6"], capture_output=True, text=True, check=True)
    bleu, chrf = json.loads(scores.stdout)
    final = record["metrics"]["final"]
    assert chrf > 0  # a real comparison, not 0 == 0
    assert abs(bleu - final["test/bleu"]) < 1e-4 and abs(chrf - final["test/chrf"]) < 1e-4


@pytest.mark.slow
def test_algorithmic_outputs_give_back_the_recorded_sequence_accuracy_and_eval_writes_them_too(tmp_path, monkeypatch):
    from attnlab.cli.train import main as train_main
    from attnlab.training.evaluation import evaluate

    monkeypatch.chdir(tmp_path)
    train_main([*TINY, *TINY_ALGO, "task=algo/copy", "trainer.max_steps=120", "trainer.val_check_interval=120",
                "optim.lr=3e-3", "logger=csv",
                f"hydra.run.dir={tmp_path / 'run'}"])
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    out = tmp_path / "run" / "outputs"
    for prefix in ("test", "test_train_len", "test_ood"):  # test_ood: lengths 7-12, beyond training's 6
        hyps, refs, srcs = (_lines(out / f"{prefix}.{s}") for s in ("hyp", "ref", "src"))
        assert len(hyps) == len(refs) == len(srcs) == 8
        assert refs == srcs  # copy: the reference is the source, digit by digit
        exact = sum(h == r for h, r in zip(hyps, refs)) / len(refs)
        assert any(hyps)  # the model writes something: the comparison below is not 0 == 0
        assert abs(exact - record["metrics"]["final"][f"{prefix}/seq_acc"]) < 1e-6
    result = evaluate(tmp_path / "run")
    assert Path(result["outputs"]) == (tmp_path / "run" / "checkpoints" / "eval_outputs").resolve()
    assert _lines(Path(result["outputs"]) / "test.hyp") == _lines(out / "test.hyp")  # same weights, same outputs


def test_outputs_of_a_t5_shaped_task_show_label_words_and_fold_line_breaks(tmp_path):
    """T5 references are (group, gold label) pairs: the files show the target label words and the inputs;
    a line break inside a text never shifts the line-aligned files."""
    from attnlab.tasks import TaskData
    from attnlab.tasks.batching import IndexedDataset
    from attnlab.training.outputs import write_decoded_outputs

    words = {5: "cola", 6: "sentence:", 7: "acceptable", 8: "unacceptable"}
    task = TaskData(kind="seq2seq", datasets={"test": IndexedDataset([([5, 6], [7]), ([5, 6], [8])])},
                    collate=None, vocab_size=9, pad_id=0, max_len=8,
                    detokenize=lambda ids: " ".join(words[i] for i in ids), eval_splits={"test": "test"},
                    references={"test": [("cola", 1), ("cola", 0)]})
    write_decoded_outputs(tmp_path, {"test": {1: "acceptable\nextra", 0: "acceptable"}}, task)
    assert _lines(tmp_path / "test.hyp") == ["acceptable", "acceptable extra"]
    assert _lines(tmp_path / "test.ref") == ["acceptable", "unacceptable"]
    assert _lines(tmp_path / "test.src") == ["cola sentence:", "cola sentence:"]
    assert json.loads(_lines(tmp_path / "test.jsonl")[1])["hypothesis"] == "acceptable\nextra"
