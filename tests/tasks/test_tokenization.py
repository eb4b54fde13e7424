"""Tokenizers: shared special ids, exact detokenization, the on-disk cache, the <unk> escape."""

from __future__ import annotations

import pytest

from attnlab.tasks import DataError
from attnlab.tasks.tokenization import UNK_ESCAPE, Detokenizer, build_tokenizer, encode_all

TEXT = ["Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.", "A man in an orange hat staring at something."]


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "word", "char"])
def test_specials_come_first(kind, tmp_path):
    tok = build_tokenizer(kind, TEXT * 5, vocab_size=120, min_frequency=1, cache_dir=tmp_path)
    assert [tok.token_to_id(s) for s in ("<pad>", "<s>", "</s>", "<unk>")] == [0, 1, 2, 3]


def test_bpe_round_trip_cache_and_unk_escape(tmp_path):
    tok = build_tokenizer("bpe", TEXT * 5, vocab_size=120, min_frequency=1, cache_dir=tmp_path)
    detok = Detokenizer(tok)
    ids = encode_all(tok, TEXT)
    assert [detok(i) for i in ids] == TEXT  # Metaspace decoding restores the text exactly
    assert len(list(tmp_path.glob("bpe-*.tokenizer"))) == 1
    again = build_tokenizer("bpe", TEXT * 5, vocab_size=120, min_frequency=1, cache_dir=tmp_path)
    assert again.to_str() == tok.to_str()
    build_tokenizer("bpe", TEXT * 5, vocab_size=100, min_frequency=1, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("bpe-*.tokenizer"))) == 2  # another setting, another entry
    unk = encode_all(tok, ["Ein Zebra"])[0]
    assert 3 in unk and UNK_ESCAPE in detok(unk)
    assert detok([*ids[0], 2, 5, 6]) == TEXT[0]  # stops at </s>


def test_char_tokenizer_keeps_spaces(tmp_path):
    tok = build_tokenizer("char", ["ab c"], vocab_size=0, cache_dir=tmp_path)
    assert Detokenizer(tok, joiner="")(encode_all(tok, ["ab c"])[0]) == "ab c"


def test_refusals(tmp_path):
    with pytest.raises(DataError, match="valid: bpe, wordpiece, word, char"):
        build_tokenizer("sentencepiece", TEXT, vocab_size=10, cache_dir=tmp_path)
    with pytest.raises(DataError, match="empty"):
        build_tokenizer("bpe", [], vocab_size=10, cache_dir=tmp_path)
