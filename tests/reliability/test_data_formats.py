"""Local text as editors write it: a UTF-8 byte-order mark and CRLF line ends are removed and said once."""

from __future__ import annotations

import gzip
import logging

import pytest

from attnlab.tasks import sources


@pytest.mark.parametrize("gz", [False, True])
def test_a_byte_order_mark_and_crlf_are_removed_and_said_once(gz, tmp_path, caplog, monkeypatch):
    """Issue 38: a BOM at the start of a training file became a token of the learned BPE vocabulary."""
    monkeypatch.setattr(sources, "_CLEANED", set())
    data = "\ufeffthe cat sat\r\non the mat\r\n".encode()
    path = tmp_path / ("train.txt.gz" if gz else "train.txt")
    path.write_bytes(gzip.compress(data) if gz else data)
    with caplog.at_level(logging.INFO, logger="attnlab"):
        assert sources.read_lines(path) == ["the cat sat", "on the mat"]
        assert sources.read_lines(path) == ["the cat sat", "on the mat"]
    said = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert len(said) == 2 and any("byte-order mark" in m for m in said) and any("CRLF" in m for m in said)


def test_a_byte_order_mark_never_reaches_the_vocabulary(tmp_path):
    from attnlab.tasks.tokenization import _train

    path = tmp_path / "train.txt"
    path.write_bytes(("\ufeff" + "the cat sat on the mat .\n" * 50).encode())
    lines = sources.read_lines(path)
    tokenizer = _train("bpe", lines, 60, False, 1)
    assert not any("\ufeff" in token for token in tokenizer.get_vocab())
