"""Loaders: local copies against the shared data README counts, hub-schema fixtures, offline failures, bad input."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest

from attnlab.tasks import DataError, build_task
from attnlab.tasks.translation import load_pairs
from tests.conftest import require_shared_data, task_cfg
from tests.tasks.fake_hub import serve_hub


# -- local copies: counts from ../shared/data/README.md ------------------------------------------------
@pytest.mark.parametrize("option,counts", [
    ("mt/multi30k_en_de", {"train": 29000, "val": 1014, "test": 1000}),
    ("mt/iwslt15_en_vi", {"val": 1553, "test": 1268}),
    ("mt/iwslt14_de_en", {"val": 7283, "test": 6750}),
    ("mt/ted_gl_en", {"train": 11233, "val": 742, "test": 1112}),
    ("mt/wmt14_en_de", {"test": 3003}),
    ("mt/wmt14_en_fr", {"test": 3003}),
])
def test_local_parallel_counts(option, counts):
    root = require_shared_data("multi30k", "wmt14", "iwslt15_en_vi", "iwslt14_de_en", "ted_gl_en")
    # newstest2014 is the WMT tasks' paper-scale test set (at scale=cpu they are Multi30k in domain)
    cfg = task_cfg(option, root, *(["scale=paper"] if option.startswith("mt/wmt14") else []))
    for split, n in counts.items():
        pairs = load_pairs(cfg, split)
        assert len(pairs) == n, (option, split)
        if cfg[split].get("unescape"):
            assert not any("&apos;" in s or "&quot;" in t for s, t in pairs)


def test_wmt14_sgm_segments_are_aligned_text():
    root = require_shared_data("wmt14")
    pairs = load_pairs(task_cfg("mt/wmt14_en_de", root, "scale=paper"), "test")
    assert pairs[0][1] == "Gutach: Noch mehr Sicherheit für Fußgänger"
    assert not any("<seg" in s or "</seg>" in t for s, t in pairs)


@pytest.mark.parametrize("option,counts", [
    ("glue/cola", {"train": 8551, "val": 1043}),
    ("glue/sst2", {"train": 67349, "val": 872}),
    ("glue/mrpc", {"train": 3668, "val": 408}),
    ("glue/stsb", {"train": 5749, "val": 1500}),
    ("glue/rte", {"train": 2490, "val": 277}),
    ("superglue/rte", {"train": 2490, "val": 277}),
    ("superglue/cb", {"train": 250, "val": 56}),
    ("superglue/copa", {"train": 400, "val": 100}),
    ("superglue/wsc", {"train": 554, "val": 104}),
    ("superglue/wic", {"train": 5428, "val": 638}),
])
def test_glue_local_counts(option, counts):
    from attnlab.tasks.glue import _rows

    root = require_shared_data("glue", "superglue")
    cfg = task_cfg(option, root)
    for split, n in counts.items():
        assert len(_rows(cfg, split)) == n, (option, split)


def test_boolq_val_is_cut_into_train_and_dev():
    root = require_shared_data("superglue/BoolQ/val.jsonl")
    task = build_task(task_cfg("superglue/boolq", root, "task.tokenizer.kind=word", "task.tokenizer.vocab_size=500"), 0)
    assert len(task.datasets["train"]) + len(task.datasets["val"]) == 3270
    assert len(task.datasets["val"]) == 654


def test_babi_counts_and_labels(tmp_path):
    from attnlab.tasks.babi import parse_babi, task_file
    from attnlab.tasks.sources import read_lines

    root = require_shared_data("babi")
    for task in range(1, 21):
        for split in ("train", "test"):
            assert len(parse_babi(read_lines(task_file(root, "en", task, split)))) == 1000
    assert len(parse_babi(read_lines(task_file(root, "en-10k", 1, "train")))) == 10000
    with pytest.raises(DataError, match="qa3 train is missing"):
        task_file(root, "en-10k", 3, "train")
    cfg = task_cfg("qa/babi", root, "task.tasks=[1,8]")
    data = build_task(cfg, 0)
    assert len(data.datasets["train"]) == 1800 and len(data.datasets["val"]) == 200
    assert len(data.datasets["test"]) == 2000
    assert {t for _, t in data.references["test"]} == {1, 8}
    batch = data.collate([data.datasets["test"][i] for i in range(3)])
    assert set(batch) == {"ids", "label", "ref_index"}


def test_lambada_and_personachat_and_samsum_counts():
    from attnlab.tasks.dialogue import parse_parlai
    from attnlab.tasks.sources import read_jsonl, read_lines

    root = require_shared_data("lambada", "personachat", "samsum")
    assert len(read_lines(root / "lambada/lambada_development_plain_text.txt.gz")) == 4869
    assert len(read_lines(root / "lambada/lambada_test_plain_text.txt.gz")) == 5153
    dialogues = parse_parlai(read_lines(root / "personachat/valid_self_original_no_cands.txt.gz"))
    assert len(dialogues) == 1000 and sum(len(d["turns"]) for d in dialogues) == 7801
    for name, n in (("train.jsonl.gz", 14732), ("validation.jsonl", 818), ("test.jsonl", 819)):
        assert len(read_jsonl(root / "samsum" / name)) == n


def test_subword_lm_word_counts_match_wikitext(tmp_path):
    root = require_shared_data("wikitext2")
    cfg = task_cfg("lm/lm1b", root, "task.at_scale.cpu.max_train_tokens=20000",
                   "task.at_scale.cpu.tokenizer.vocab_size=400")
    cfg["files"] = {"train": cfg["files"]["train"], "test": cfg["files"]["test"]}
    data = build_task(cfg, 0)
    # README: test has 241,211 whitespace tokens + 4358 line ends = 245,569 words
    assert int(data.datasets["test"].flags.sum()) == 245_569
    assert "STAND-IN" in data.metric_flavours["data"]


# -- the hub: fast offline failure, and loaders on fixtures in the hub's schema -------------------------
@pytest.mark.parametrize("option", ["mt/ted_sk_en", "mt/ted_ar_en", "mt/ted_en_he", "lm/wikitext103",
                                    "sum/cnn_dailymail", "glue/qqp", "glue/mnli", "glue/qnli", "glue/wnli"])
def test_hub_only_tasks_fail_fast_offline(option, tmp_path):
    cfg = task_cfg(option, tmp_path)
    start = time.perf_counter()
    with pytest.raises(DataError, match="unreachable \\(offline\\)") as err:
        build_task(cfg, 0)
    assert time.perf_counter() - start < 5
    message = str(err.value)
    assert "\n" not in message and ("local" in message or "task=" in message)


@pytest.mark.parametrize("option", ["mt/wmt14_en_de", "mt/iwslt15_en_vi", "mt/iwslt14_de_en"])
def test_paper_scale_mt_training_is_hub_and_fails_fast(option, tmp_path):
    cfg = task_cfg(option, tmp_path, "scale=paper")
    with pytest.raises(DataError, match="task=mt/multi30k_en_de"):
        build_task(cfg, 0)




def test_translation_hub_schemas(monkeypatch, tmp_path):
    rows = [{"translation": {"de": f"ein haus {i}", "en": f"a house {i}"}} for i in range(30)]
    serve_hub(monkeypatch, {"train": rows, "validation": rows[:4], "test": rows[:5]})
    cfg = task_cfg("mt/iwslt14_de_en", tmp_path, "scale=paper", "task.tokenizer.vocab_size=60")
    cfg["val"] = cfg["test"] = {"source": "hub", "hub_id": "x", "hub_split": "test", "hub_schema": "translation"}
    data = build_task(cfg, 0)
    assert len(data.datasets["train"]) == 30 and data.references["test"][0] == "a house 0"

    ted = [{"translations": {"language": ["en", "sk", "gl"], "translation": [f"a talk {i}", f"prednaska {i}", "x"]}}
           for i in range(20)] + [{"translations": {"language": ["en"], "translation": ["alone"]}},
                                  {"translations": {"language": ["en", "sk"], "translation": ["__NULL__", "y"]}}]
    serve_hub(monkeypatch, {"train": ted, "validation": ted[:3], "test": ted[:4]})
    data = build_task(task_cfg("mt/ted_sk_en", tmp_path, "task.tokenizer.vocab_size=60"), 0)
    assert len(data.datasets["train"]) == 20  # the one-sided and __NULL__ rows are dropped
    assert data.references["test"] == [f"a talk {i}" for i in range(4)]


def test_cnn_dailymail_loader_on_hub_schema_fixture(monkeypatch, tmp_path):
    rows = [{"id": str(i), "article": f"The council met on day {i} .\nIt voted on the budget {i} .",
             "highlights": f"Council met on day {i} .\nBudget vote {i} ."} for i in range(24)]
    serve_hub(monkeypatch, {"train": rows, "validation": rows[:4], "test": rows[:6]})
    data = build_task(task_cfg("sum/cnn_dailymail", tmp_path, "task.tokenizer.vocab_size=80"), 0)
    assert data.references["test"][0] == "Council met on day 0 .\nBudget vote 0 ."
    ids = data.datasets["test"][0][1]
    assert data.detokenize(ids) == "Council met on day 0 .\nBudget vote 0 ."  # newlines survive for rougeLsum
    scores = data.score_text(data.references["test"], data.references["test"])
    assert scores["rougeLsum"] == pytest.approx(100.0)


def test_glue_hub_labels_are_indices(monkeypatch, tmp_path):
    rows = [{"question1": f"q {i}", "question2": f"p {i}", "label": i % 2} for i in range(10)]
    serve_hub(monkeypatch, {"train": rows, "validation": rows[:4]})
    data = build_task(task_cfg("glue/qqp", tmp_path, "task.tokenizer.vocab_size=50",
                               "task.tokenizer.min_frequency=1"), 0)
    assert data.references["val"] == [0, 1, 0, 1]
    bad = [{"question1": "q", "question2": "p", "label": 5}]
    serve_hub(monkeypatch, {"train": bad, "validation": bad})
    with pytest.raises(DataError, match="label 5 outside"):
        build_task(task_cfg("glue/qqp", tmp_path), 0)


# -- bad input: one line naming the file and line ------------------------------------------------------
def _mt_cfg(root: Path, src: str, tgt: str) -> dict:
    cfg = task_cfg("mt/multi30k_en_de", root)
    spec = {"source": "local", "format": "lines", "src": src, "tgt": tgt}
    cfg.update(train=spec, val=spec, test=spec, extra_tests={})
    return cfg


def test_parallel_files_of_different_length_are_refused(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\n")
    (tmp_path / "a.de").write_text("eins\n")
    with pytest.raises(DataError, match="differ in length.*a.en has 2.*a.de has 1"):
        build_task(_mt_cfg(tmp_path, "a.en", "a.de"), 0)


def test_undecodable_bytes_name_file_and_line(tmp_path):
    (tmp_path / "a.en").write_bytes(b"good\nbad \xff byte\n")
    (tmp_path / "a.de").write_text("gut\nschlecht\n")
    with pytest.raises(DataError, match=r"a.en:2: not UTF-8"):
        build_task(_mt_cfg(tmp_path, "a.en", "a.de"), 0)


def test_missing_file_and_empty_split(tmp_path):
    with pytest.raises(DataError, match="not found under"):
        build_task(_mt_cfg(tmp_path, "nope.en", "nope.de"), 0)
    (tmp_path / "e.en").write_text("")
    (tmp_path / "e.de").write_text("")
    with pytest.raises(DataError, match="empty"):
        build_task(_mt_cfg(tmp_path, "e.en", "e.de"), 0)


def test_jsonl_line_that_is_not_json_and_unknown_label(tmp_path):
    folder = tmp_path / "superglue" / "CB"
    folder.mkdir(parents=True)
    good = json.dumps({"premise": "p", "hypothesis": "h", "label": "neutral"})
    (folder / "train.jsonl").write_text(good + "\n{not json\n")
    (folder / "val.jsonl").write_text(good + "\n")
    with pytest.raises(DataError, match=r"train.jsonl:2: not JSON"):
        build_task(task_cfg("superglue/cb", tmp_path), 0)
    (folder / "train.jsonl").write_text(good + "\n" + json.dumps({"premise": "p", "hypothesis": "h",
                                                                   "label": "maybe"}) + "\n")
    with pytest.raises(DataError, match=r"train.jsonl:2: label 'maybe' is not one of"):
        build_task(task_cfg("superglue/cb", tmp_path), 0)


def test_gzip_twin_and_truncated_gzip(tmp_path):
    (tmp_path / "a.en.gz").write_bytes(gzip.compress(b"one\ntwo\n")[:-8])
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    with pytest.raises(DataError, match="cannot read data file"):
        build_task(_mt_cfg(tmp_path, "a.en", "a.de"), 0)
