"""The tokenizer and encoded-data caches: damaged entries are rebuilt, never used; writes are atomic; a folder
that cannot be written costs only the rebuild (issue 38.1)."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from attnlab.tasks import disk_cache
from attnlab.tasks.disk_cache import read_entry, write_entry
from attnlab.tasks.tokenization import build_tokenizer, encode_all

TEXT = ["the cat sat on the mat", "a dog sat on a log", "the cat saw a dog"] * 4


def _tokenizer(cache):
    return build_tokenizer("bpe", TEXT, vocab_size=60, min_frequency=1, cache_dir=cache)


def _only_entry(folder, pattern):
    entries = sorted(folder.glob(pattern))
    assert len(entries) == 1, entries
    return entries[0]


@pytest.mark.parametrize("damage", ["truncated", "one byte flipped", "emptied", "foreign file"])
def test_a_damaged_tokenizer_entry_is_rebuilt_not_used(damage, tmp_path, caplog):
    fresh = _tokenizer(tmp_path).to_str()
    entry = _only_entry(tmp_path, "bpe-*.tokenizer")
    data = entry.read_bytes()
    if damage == "truncated":
        entry.write_bytes(data[: len(data) // 2])
    elif damage == "one byte flipped":  # still valid JSON: only the checksum can tell
        at = data.index(b'"cat"') + 1 if b'"cat"' in data else len(data) - 20
        entry.write_bytes(data[:at] + b"k" + data[at + 1:])
    elif damage == "emptied":
        entry.write_bytes(b"")
    else:
        entry.write_bytes(b'{"version": "1.0", "model": {"type": "BPE", "vocab": {}}}')
    with caplog.at_level(logging.WARNING, logger="attnlab"):
        again = _tokenizer(tmp_path)
    assert again.to_str() == fresh
    assert "is damaged" in caplog.text and str(entry) in caplog.text
    assert read_entry(entry) == fresh.encode()  # the rebuilt entry replaced the damaged one


def test_a_damaged_encoded_entry_is_encoded_again(tmp_path, caplog):
    tok = _tokenizer(tmp_path)
    ids = encode_all(tok, TEXT, cache_dir=tmp_path)
    entry = _only_entry(tmp_path / "encoded", "*.ids")
    entry.write_bytes(entry.read_bytes()[:-7])
    with caplog.at_level(logging.WARNING, logger="attnlab"):
        assert encode_all(tok, TEXT, cache_dir=tmp_path) == ids
    assert "is damaged" in caplog.text


def test_an_unwritable_cache_folder_is_said_once_and_costs_only_the_rebuild(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(disk_cache, "_UNWRITABLE", set())
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder should be")  # mkdir fails, as for a read-only folder
    with caplog.at_level(logging.WARNING, logger="attnlab"):
        first = _tokenizer(blocked)
        encode_all(first, TEXT, cache_dir=blocked)
        second = _tokenizer(blocked)
    assert first.to_str() == second.to_str()
    said = [r for r in caplog.records if "cannot write to" in r.getMessage()]
    assert len(said) == 2, caplog.text  # the tokenizer folder and the encoded/ folder, each once
    assert "ATTNLAB_TOKENIZER_CACHE" in said[0].getMessage()


def test_a_write_stopped_midway_leaves_the_old_entry_and_no_temporary_file(tmp_path, monkeypatch):
    entry = tmp_path / "e.ids"
    assert write_entry(entry, b"old")

    def interrupted(fd):
        raise KeyboardInterrupt  # Ctrl-C (or a signal turned into an exception) between write and rename

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_entry(entry, b"new" * 1000)
    assert read_entry(entry) == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["e.ids"]


def test_concurrent_writers_never_expose_a_partial_entry(tmp_path, caplog):
    entry = tmp_path / "shared.ids"
    payloads = [bytes([i]) * 300_000 for i in range(1, 5)]
    stop = threading.Event()
    seen: list[bytes | None] = []

    def writer(payload):
        while not stop.is_set():
            write_entry(entry, payload)

    writers = [threading.Thread(target=writer, args=(p,)) for p in payloads]
    for w in writers:
        w.start()
    try:
        with caplog.at_level(logging.WARNING, logger="attnlab"):
            while len(seen) < 200:
                if entry.exists():
                    seen.append(read_entry(entry))
    finally:
        stop.set()
        for w in writers:
            w.join()
    assert all(s in payloads for s in seen), "a reader saw a partial or mixed entry"
    assert "damaged" not in caplog.text
    assert not list(tmp_path.glob("*.tmp"))
