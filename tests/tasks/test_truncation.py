"""Every loader that cuts sequences counts what it cut, logs it and puts the counts in metric_flavours (the run
record's copy of them): translation, summarization, dialogue, GLUE / SuperGLUE, language modelling, LAMBADA."""

from __future__ import annotations

import json
import logging

from attnlab.tasks import build_task
from tests.conftest import task_cfg

WORDS = "the cat sat on a mat and the dog ran to the park".split()


def sentence(i: int, n: int) -> str:
    return " ".join(WORDS[(i + j) % len(WORDS)] for j in range(n))


def test_translation_counts_cut_training_pairs_and_leaves_evaluation_alone(tmp_path, caplog):
    lengths = [3, 4, 30, 5, 40, 6] * 4  # 8 of 24 training sources are longer than 10 words
    for split in ("train", "val", "test"):
        n = len(lengths) if split == "train" else 6
        (tmp_path / f"{split}.en").write_text("\n".join(sentence(i, lengths[i]) for i in range(n)) + "\n")
        (tmp_path / f"{split}.de").write_text("\n".join(sentence(i + 1, 4) for i in range(n)) + "\n")
    cfg = task_cfg("mt/multi30k_en_de", tmp_path, "task.max_src_len=10", "task.tokenizer.kind=word",
                   "task.tokenizer.vocab_size=0", "task.tokenizer.min_frequency=1")
    for split in ("train", "val", "test"):
        cfg[split] = {"source": "local", "format": "lines", "src": f"{split}.en", "tgt": f"{split}.de"}
    cfg["extra_tests"] = {}
    with caplog.at_level(logging.INFO, logger="attnlab"):
        data = build_task(cfg, 0)
    text = data.metric_flavours["truncation"]
    assert "max_src_len=10" in text and "train 8 of 24 pairs cut" in text
    assert "val not cut" in text and "test not cut" in text
    assert "truncated 8 of 24 train pairs" in caplog.text
    assert max(len(s) for s, _ in data.datasets["train"].examples) == 10
    assert max(len(s) for s, _ in data.datasets["test"].examples) > 10  # evaluation sources are never cut


def test_summarization_counts_cut_sources_in_every_split(tmp_path, caplog):
    folder = tmp_path / "samsum"
    folder.mkdir()
    for name, n in (("train.jsonl", 20), ("validation.jsonl", 4), ("test.jsonl", 4)):
        rows = [{"id": str(i), "dialogue": sentence(i, 40 if i % 2 else 5), "summary": sentence(i, 4)}
                for i in range(n)]
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = task_cfg("sum/samsum", tmp_path, "task.max_src_len=12", "task.tokenizer.vocab_size=60")
    with caplog.at_level(logging.INFO, logger="attnlab"):
        data = build_task(cfg, 0)
    text = data.metric_flavours["truncation"]
    assert "train 10 of 20 pairs cut" in text and "val 2 of 4 sources cut" in text and "test 2 of 4 sources cut" in text
    assert "truncated 2 of 4 test pairs" in caplog.text


def test_dialogue_counts_cut_contexts(tmp_path, caplog):
    lines = []
    for d in range(20):
        lines.append(f"1 your persona: {sentence(d, 12)}.")
        for turn in range(3):
            lines.append(f"{turn + 2} {sentence(d + turn, 6)}\t{sentence(d + turn + 1, 5)}")
    (tmp_path / "personachat").mkdir()
    (tmp_path / "personachat" / "valid_self_original_no_cands.txt").write_text("\n".join(lines) + "\n")
    cfg = task_cfg("dialogue/personachat", tmp_path, "task.max_src_len=16", "task.tokenizer.vocab_size=60")
    with caplog.at_level(logging.INFO, logger="attnlab"):
        data = build_task(cfg, 0)
    text = data.metric_flavours["truncation"]
    assert "max_src_len=16" in text and "sources cut" in text
    assert "truncated" in caplog.text  # persona (12 words) + history: every context is longer than 16 tokens


def test_glue_counts_inputs_cut_at_max_seq_len(tmp_path, caplog):
    folder = tmp_path / "superglue" / "CB"
    folder.mkdir(parents=True)
    rows = [{"premise": sentence(i, 30 if i < 3 else 4), "hypothesis": "h", "label": "neutral"} for i in range(8)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    cfg = task_cfg("superglue/cb", tmp_path, "task.max_seq_len=10", "task.tokenizer.vocab_size=60",
                   "task.tokenizer.min_frequency=1")
    with caplog.at_level(logging.INFO, logger="attnlab"):
        data = build_task(cfg, 0)
    assert data.metric_flavours["truncation"] == "inputs cut at max_seq_len=10 tokens: train 3 of 8, val 3 of 4"
    assert "inputs longer than max_seq_len=10 tokens were cut: train 3 of 8, val 3 of 4" in caplog.text


def test_language_model_counts_the_targets_after_the_last_whole_block(tmp_path):
    folder = tmp_path / "wikitext2"
    folder.mkdir()
    # word level, one <eos> per line: 10 lines of 4 words = 50 tokens = 49 targets
    for split in ("train", "valid", "test"):
        (folder / f"wiki.{split}.tokens").write_text("\n".join(sentence(i, 4) for i in range(10)) + "\n")
    data = build_task(task_cfg("lm/wikitext2", tmp_path, "task.block_len=8", "task.at_scale.cpu.block_len=8"), 0)
    assert len(data.datasets["test"]) == 6  # 6 blocks of 8 targets: 48 of 49 targets, 1 unused
    assert "test: 1 of 49 targets after the last whole block unused" in data.metric_flavours["truncation"]
    capped = build_task(task_cfg("lm/wikitext2", tmp_path, "task.block_len=8", "task.at_scale.cpu.block_len=8",
                                 "task.max_test_tokens=20"), 0)
    assert "test: capped at max_test_tokens=20 (its first 21 tokens), 4 of 20 targets after the last whole " \
           "block unused" in capped.metric_flavours["truncation"]


def test_lambada_counts_passages_cut_to_the_block(tmp_path, caplog):
    folder = tmp_path / "wikitext2"
    folder.mkdir()
    for split in ("train", "valid", "test"):
        (folder / f"wiki.{split}.tokens").write_text("\n".join(sentence(i, 6) for i in range(60)) + "\n")
    (tmp_path / "lambada").mkdir()
    passages = [sentence(i, 30 if i % 2 else 5) for i in range(6)]
    for name in ("lambada_test_plain_text.txt", "lambada_development_plain_text.txt"):
        (tmp_path / "lambada" / name).write_text("\n".join(passages) + "\n")
    cfg = task_cfg("lm/lambada", tmp_path, "task.at_scale.cpu.block_len=16",
                   "task.at_scale.cpu.tokenizer.vocab_size=60")
    with caplog.at_level(logging.INFO, logger="attnlab"):
        data = build_task(cfg, 0)
    text = data.metric_flavours["truncation"]
    assert "test 3 of 6 passages" in text and "test_dev 3 of 6 passages" in text
    assert "3 of 6 passages cut to their last 16 tokens" in caplog.text
    assert all(len(item["ids"]) <= 17 for item in data.datasets["test"].items)
