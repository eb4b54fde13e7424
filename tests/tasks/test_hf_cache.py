"""Hugging Face offline semantics and the tokenized-data cache (issue 15.4).

With ``HF_DATASETS_OFFLINE=1`` a hub dataset downloaded earlier loads from the local cache (the cluster
workflow: download on a login node, train offline); one that is not cached fails in one line naming the key
that switches this task family to local files; a second build of the same task does not tokenize again.
"""

from __future__ import annotations

import socket

import pytest

from attnlab.tasks import DataError, build_task, tokenization
from tests.conftest import compose, task_cfg
from tests.tasks.fake_hub import cache_hub_dataset

PAIRS = [("a dog runs .", "ein hund rennt ."), ("a cat sleeps .", "eine katze schläft ."),
         ("two men talk .", "zwei männer reden ."), ("a girl reads .", "ein mädchen liest .")]


def _rows(n: int, shift: int = 0) -> list[dict]:
    return [{"en": f"{PAIRS[(i + shift) % 4][0]} {i}", "de": f"{PAIRS[(i + shift) % 4][1]} {i}"} for i in range(n)]


def _hub_multi30k(tmp_path, hub_id: str = "someone/multi30k") -> dict:
    cfg = task_cfg("mt/multi30k_en_de", tmp_path / "no-local-data",
                   "task.tokenizer={kind: word, vocab_size: 0, min_frequency: 1}")
    cfg["extra_tests"] = {}
    for split, hub_split in (("train", "train"), ("val", "validation"), ("test", "test")):
        cfg[split] = {"source": "hub", "hub_id": hub_id, "hub_schema": "flat", "hub_split": hub_split}
    return cfg


def _no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("attnlab opened a network connection in offline mode")

    monkeypatch.setattr(socket, "create_connection", refuse)


def test_offline_hub_dataset_loads_from_the_local_hf_cache(tmp_path, monkeypatch):
    cache_hub_dataset(monkeypatch, tmp_path / "hf", "someone/multi30k",
                      {"train": _rows(40), "validation": _rows(6, 1), "test": _rows(8, 2)})
    _no_network(monkeypatch)
    task = build_task(_hub_multi30k(tmp_path), seed=0)
    assert {k: len(v) for k, v in task.datasets.items()} == {"train": 40, "val": 6, "test": 8}
    assert task.references["test"][0] == _rows(8, 2)[0]["de"]


def test_offline_uncached_hub_dataset_fails_in_one_line_naming_the_mt_split_key(tmp_path, monkeypatch):
    cache_hub_dataset(monkeypatch, tmp_path / "hf", "someone/other", {"train": _rows(4)})
    _no_network(monkeypatch)
    with pytest.raises(DataError, match=r"someone/multi30k is unreachable \(offline\)") as err:
        build_task(_hub_multi30k(tmp_path), seed=0)
    message = str(err.value)
    assert "\n" not in message and "HF_DATASETS_OFFLINE=1" in message and "task.train.source=local" in message


@pytest.mark.parametrize(("option", "break_file", "hub_key"), [
    ("mt/multi30k_en_de", "task.train.src=missing.en", "task.train.source=hub"),
    ("lm/wikitext2", "task.files.train=missing.txt", "task.source=hub"),
    ("sum/samsum", "task.files.train=missing.jsonl", "task.source=hub"),
    ("lm/lambada", "task.lm_files.train=missing.txt", None),
    ("dialogue/personachat", "task.files.all=missing.txt", None),
])
def test_missing_local_file_names_the_hub_key_this_family_accepts(tmp_path, option, break_file, hub_key):
    """The hint's override must exist for the task family: ``task.source`` is unknown to MT tasks."""
    from attnlab.training.config import validate

    with pytest.raises(DataError, match="not found under") as err:
        build_task(task_cfg(option, tmp_path, break_file), seed=0)
    message = str(err.value)
    if hub_key is None:
        assert "source=hub" not in message
        return
    assert f" {hub_key}" in message and message.count("source=hub") == 1
    validate(compose([f"task={option}", hub_key]))  # the key the message names is one the schema accepts


def test_second_build_of_a_task_does_not_tokenize_again(tmp_path, monkeypatch):
    cache_hub_dataset(monkeypatch, tmp_path / "hf", "someone/multi30k",
                      {"train": _rows(40), "validation": _rows(6, 1), "test": _rows(8, 2)})
    calls: list[int] = []
    encode = tokenization._encode
    monkeypatch.setattr(tokenization, "_encode", lambda tok, texts: calls.append(len(texts)) or encode(tok, texts))
    first = build_task(_hub_multi30k(tmp_path), seed=0)
    assert len(calls) == 6  # source and target of train, val, test
    calls.clear()
    second = build_task(_hub_multi30k(tmp_path), seed=0)
    assert calls == []
    assert all(first.datasets[s].examples == second.datasets[s].examples for s in first.datasets)
    # another tokenizer setting (lowercase) is another key: encoded again, never a stale cache entry
    cfg = _hub_multi30k(tmp_path)
    cfg["tokenizer"]["lowercase"] = True
    build_task(cfg, seed=0)
    assert len(calls) == 6


def test_encoded_cache_is_keyed_by_text_and_survives_a_corrupt_entry(tmp_path):
    tok = tokenization.build_tokenizer("word", ["a b c", "b c d"], vocab_size=0, cache_dir=tmp_path)
    texts = ["a b", "c d a", ""]
    ids = tokenization.encode_all(tok, texts, cache_dir=tmp_path)
    assert tokenization.encode_all(tok, texts, cache_dir=tmp_path) == ids == tokenization._encode(tok, texts)
    changed = tokenization.encode_all(tok, ["a b", "c d b", ""], cache_dir=tmp_path)
    assert changed[1] != ids[1]
    for entry in (tmp_path / "encoded").iterdir():
        entry.write_bytes(b"not a numpy file")
    assert tokenization.encode_all(tok, texts, cache_dir=tmp_path) == ids
