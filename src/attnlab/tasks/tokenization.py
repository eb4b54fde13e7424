"""Subword / word / character tokenizers (HF ``tokenizers``) trained on a task's training text, cached on disk.

Every tokenizer puts the shared specials first (``<pad>=0, <s>=1, </s>=2, <unk>=3``, tasks/vocab.py). BPE and
WordPiece use a Metaspace pre-tokenizer and decoder (SentencePiece style), so decoding gives back the
original spacing: hypotheses are scored by sacreBLEU / ROUGE as detokenized text. The cache key is a hash
of the training text and every setting, so a changed corpus or vocabulary size retrains and an unchanged one
loads in milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from attnlab.tasks.base import DataError
from attnlab.tasks.vocab import SPECIALS

log = logging.getLogger("attnlab")

KINDS = ("bpe", "wordpiece", "word", "char")
# fairseq's choice (tasks/translation.py): an <unk> in a hypothesis becomes a string no reference contains,
# so it can never earn an n-gram match (SEMANTICS 28).
UNK_ESCAPE = "UNKNOWNTOKENINHYP"


def default_cache_dir() -> Path:
    return Path(os.environ.get("ATTNLAB_TOKENIZER_CACHE", Path.home() / ".cache" / "attnlab" / "tokenizers"))


def _normalizer(lowercase: bool):
    steps = [normalizers.NFC()]
    if lowercase:
        steps.append(normalizers.Lowercase())
    return normalizers.Sequence(steps)


def _train(kind: str, texts: Sequence[str], vocab_size: int, lowercase: bool, min_frequency: int) -> Tokenizer:
    specials = list(SPECIALS)
    if kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=SPECIALS[3]))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, min_frequency=min_frequency,
                                      show_progress=False)
        tok.decoder = decoders.Metaspace()
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=SPECIALS[3]))
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials,
                                            min_frequency=min_frequency, show_progress=False,
                                            continuing_subword_prefix="##")
        tok.decoder = decoders.WordPiece(prefix="##")
    elif kind in ("word", "char"):
        units = (list(t) if kind == "char" else t.split() for t in texts)
        counts = Counter(u for seq in units for u in seq)
        vocab = {s: i for i, s in enumerate(specials)}
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        for unit, count in ranked:
            if count >= min_frequency and (vocab_size <= 0 or len(vocab) < vocab_size):
                vocab.setdefault(unit, len(vocab))
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIALS[3]))
        tok.pre_tokenizer = (pre_tokenizers.Split(Regex("."), "isolated") if kind == "char"
                             else pre_tokenizers.WhitespaceSplit())
        tok.normalizer = _normalizer(lowercase)
        return tok
    else:
        raise DataError(f"tokenizer.kind={kind!r}; valid: {', '.join(KINDS)}")
    tok.normalizer = _normalizer(lowercase)
    # Metaspace for BPE keeps spaces recoverable; WordPiece splits punctuation too (BERT style).
    tok.pre_tokenizer = (pre_tokenizers.Metaspace() if kind == "bpe"
                         else pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]))
    log.info("training a %s tokenizer (vocabulary %d) on %d texts, %.1f M characters", kind, vocab_size, len(texts),
             sum(map(len, texts)) / 1e6)
    tok.train_from_iterator(texts, trainer=trainer)
    log.info("tokenizer trained: %d entries", tok.get_vocab_size())
    return tok


def cache_key(kind: str, texts: Iterable[str], settings: dict[str, Any]) -> str:
    h = hashlib.sha256(json.dumps({"kind": kind, **settings}, sort_keys=True).encode())
    for line in texts:
        h.update(line.encode("utf-8", "surrogatepass"))
        h.update(b"\n")
    return h.hexdigest()[:24]


def build_tokenizer(kind: str, texts: Sequence[str], *, vocab_size: int, lowercase: bool = False,
                    min_frequency: int = 1, cache_dir: str | os.PathLike | None = None) -> Tokenizer:
    """A tokenizer trained on ``texts`` (loaded from the cache when the same text and settings were seen)."""
    if kind not in KINDS:
        raise DataError(f"tokenizer.kind={kind!r}; valid: {', '.join(KINDS)}")
    if not texts:
        raise DataError("cannot train a tokenizer on an empty training split")
    settings = {"vocab_size": vocab_size, "lowercase": lowercase, "min_frequency": min_frequency, "v": 1}
    folder = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    path = folder / f"{kind}-{cache_key(kind, texts, settings)}.json"
    if path.is_file():
        try:
            return Tokenizer.from_file(str(path))
        except Exception:  # noqa: BLE001 - a corrupt cache entry is retrained, never trusted
            pass
    tok = _train(kind, texts, vocab_size, lowercase, min_frequency)
    for i, special in enumerate(SPECIALS):
        if tok.token_to_id(special) != i:
            raise DataError(f"tokenizer put {special} at id {tok.token_to_id(special)}, expected {i}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tok.save(str(tmp))
        os.replace(tmp, path)  # atomic: concurrent runs never read half a file
    except OSError:
        pass  # a read-only cache only costs retraining next time
    return tok


class Detokenizer:
    """ids -> text: stops at ``</s>``, drops pad/bos, and writes ``<unk>`` as ``UNKNOWNTOKENINHYP``."""

    def __init__(self, tok: Tokenizer, *, joiner: str | None = None) -> None:
        self.tok = tok
        self.joiner = joiner  # word / char vocabularies: join tokens with this string
        self.itos = {i: s for s, i in tok.get_vocab().items()}

    def __call__(self, ids: Sequence[int]) -> str:
        pieces = []
        for i in ids:
            if i == 2:
                break
            if i in (0, 1):
                continue
            pieces.append(UNK_ESCAPE if i == 3 else self.itos.get(i, UNK_ESCAPE))
        if self.joiner is not None:
            return self.joiner.join(pieces)
        # Metaspace / WordPiece decoders treat the escape as an ordinary token.
        return self.tok.decoder.decode(pieces).strip() if pieces else ""

    def __getstate__(self):  # picklable for DataLoader workers
        return {"json": self.tok.to_str(), "joiner": self.joiner}

    def __setstate__(self, state):
        self.__init__(Tokenizer.from_str(state["json"]), joiner=state["joiner"])


def encode_all(tok: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    return [enc.ids for enc in tok.encode_batch(list(texts), add_special_tokens=False)]
