"""Subword / word / character tokenizers (HF ``tokenizers``) trained on a task's training text, cached on disk.

Every tokenizer puts the shared specials first (``<pad>=0, <s>=1, </s>=2, <unk>=3``, tasks/vocab.py). BPE uses
a Metaspace pre-tokenizer and decoder (SentencePiece style), so decoding gives back the original spacing:
hypotheses are scored by sacreBLEU / ROUGE as detokenized text. WordPiece (the classification tasks) splits
words and punctuation BERT style, over a vocabulary learned in tasks/wordpiece.py so that every process
(every DDP rank, every machine) gets the same ids from the same text. The cache key is a hash
of the training text and every setting, so a changed corpus or vocabulary size retrains and an unchanged one
loads in milliseconds. Encoded splits are cached beside the tokenizers (``encode_all``), keyed by the
tokenizer and the text, so a second run of a task does not tokenize its data again.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from attnlab.tasks.base import DataError
from attnlab.tasks.disk_cache import read_entry, write_entry
from attnlab.tasks.vocab import SPECIALS
from attnlab.tasks.wordpiece import PREFIX as WORDPIECE_PREFIX
from attnlab.tasks.wordpiece import learn_wordpiece_vocabulary

log = logging.getLogger(__name__)
KINDS = ("bpe", "wordpiece", "word", "char")
# fairseq's choice (tasks/translation.py): an <unk> in a hypothesis becomes a string no reference contains,
# so it can never earn an n-gram match (design decision 28, docs/design_decisions.md#decoding-and-metrics).
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
        return _train_wordpiece(texts, vocab_size, lowercase, min_frequency)
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
    # Metaspace keeps spaces recoverable, so a decoded hypothesis has the original spacing.
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _train_wordpiece(texts: Sequence[str], vocab_size: int, lowercase: bool, min_frequency: int) -> Tokenizer:
    """BERT-style pieces (words and punctuation split, ``##`` continuations) over a vocabulary learned by
    tasks/wordpiece.py rather than HF's WordPieceTrainer, whose ids differ from process to process."""
    tok = Tokenizer(models.WordPiece(unk_token=SPECIALS[3]))
    tok.normalizer = _normalizer(lowercase)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    words: Counter[str] = Counter()
    for text in texts:
        words.update(word for word, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text)))
    vocab = learn_wordpiece_vocabulary(words, vocab_size=vocab_size, specials=SPECIALS, min_frequency=min_frequency)
    tok.model = models.WordPiece(vocab={token: i for i, token in enumerate(vocab)}, unk_token=SPECIALS[3],
                                 continuing_subword_prefix=WORDPIECE_PREFIX)
    tok.decoder = decoders.WordPiece(prefix=WORDPIECE_PREFIX)
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
    # v2 for WordPiece: tokenizers cached by HF's trainer (v1, ids drawn per process) are not reused.
    settings = {"vocab_size": vocab_size, "lowercase": lowercase, "min_frequency": min_frequency,
                "v": 2 if kind == "wordpiece" else 1}
    folder = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    path = folder / f"{kind}-{cache_key(kind, texts, settings)}.tokenizer"
    tok = load_cached_tokenizer(path)
    if tok is not None:
        log.info("tokenizer: %s loaded from the cache %s", kind, path)
        return _with_tokens(tok, kind, vocab_size, min_frequency)
    log.info("training a %s tokenizer (vocabulary %d) on %d lines ...", kind, vocab_size, len(texts))
    started = time.monotonic()
    tok = _train(kind, texts, vocab_size, lowercase, min_frequency)
    trained_s = time.monotonic() - started
    for i, special in enumerate(SPECIALS):
        if tok.token_to_id(special) != i:
            raise DataError(f"tokenizer put {special} at id {tok.token_to_id(special)}, expected {i}")
    _with_tokens(tok, kind, vocab_size, min_frequency)
    cached = write_entry(path, tok.to_str().encode("utf-8"))
    log.info("tokenizer trained in %.1f s: %d tokens%s", trained_s, tok.get_vocab_size(),
             f", cached as {path}" if cached else " (not cached)")
    return tok


def _with_tokens(tok: Tokenizer, kind: str, vocab_size: int, min_frequency: int) -> Tokenizer:
    """``tok`` when it has a token beyond the specials; a vocabulary of specials alone would map every word to
    <unk>, and the run would end "completed" with a score of 0."""
    if tok.get_vocab_size() <= len(SPECIALS):
        raise DataError(f"the {kind} tokenizer learned no token beyond the {len(SPECIALS)} special ones "
                        f"(tokenizer.vocab_size={vocab_size}, min_frequency={min_frequency}); raise vocab_size or "
                        "lower min_frequency")
    return tok


def load_cached_tokenizer(path: Path) -> Tokenizer | None:
    """The tokenizer cached at ``path``, or None when there is none or it is damaged (then it is rebuilt)."""
    payload = read_entry(path)
    if payload is None:
        return None
    try:
        return Tokenizer.from_str(payload.decode("utf-8"))
    except Exception:  # noqa: BLE001 - an entry whose checksum holds but that tokenizers rejects: rebuild it
        log.warning("cache: %s is not a tokenizer this version of tokenizers reads; rebuilding it", path)
        return None


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


ENCODED_VERSION = 1


def encoded_key(tok: Tokenizer, texts: Sequence[str]) -> str:
    """A hash of the tokenizer (vocabulary, merges, normalizer: its whole JSON) and of every text."""
    h = hashlib.sha256(f"encoded-v{ENCODED_VERSION}\n".encode())
    h.update(hashlib.sha256(tok.to_str().encode()).digest())
    for line in texts:
        h.update(line.encode("utf-8", "surrogatepass"))
        h.update(b"\n")
    return h.hexdigest()[:24]


def _encode(tok: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    return [enc.ids for enc in tok.encode_batch(list(texts), add_special_tokens=False)]


def _fits(ids: np.ndarray, offsets: np.ndarray, texts: int, vocab_size: int) -> bool:
    """Whether a cached entry can be the ids of ``texts`` texts under a vocabulary of ``vocab_size``: its
    checksum proves only that the file is whole, not that its writer used this vocabulary (an id past it would
    be an IndexError deep inside the embedding)."""
    if ids.ndim != 1 or offsets.ndim != 1 or len(offsets) != texts + 1:
        return False
    if offsets[0] != 0 or offsets[-1] != len(ids) or bool(np.any(np.diff(offsets) < 0)):
        return False
    return not len(ids) or (int(ids.min()) >= 0 and int(ids.max()) < vocab_size)


def encode_all(tok: Tokenizer, texts: Sequence[str], *, cache_dir: str | os.PathLike | None = None,
               cache: bool = True) -> list[list[int]]:
    """The ids of every text (no specials), cached on disk under ``<tokenizer cache>/encoded/`` by a key of
    the tokenizer and the texts: a second run of the same task loads its data instead of re-tokenizing, and
    a changed text, vocabulary or normalization misses the cache."""
    texts = list(texts)
    if not cache or not texts:
        return _encode(tok, texts)
    folder = (Path(cache_dir).expanduser() if cache_dir else default_cache_dir()) / "encoded"
    path = folder / f"{encoded_key(tok, texts)}.ids"
    payload = read_entry(path)
    if payload is not None:
        try:
            with np.load(io.BytesIO(payload)) as stored:
                ids_array, offsets_array = stored["ids"], stored["offsets"]
            if _fits(ids_array, offsets_array, len(texts), tok.get_vocab_size()):
                flat, offsets = ids_array.tolist(), offsets_array.tolist()
                return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
        except Exception:  # noqa: BLE001 - an entry whose checksum holds but numpy cannot read: re-encode
            pass
        log.warning("cache: %s does not hold the ids of these %d texts; encoding them again", path, len(texts))
    ids = _encode(tok, texts)
    offsets = np.cumsum([0] + [len(x) for x in ids], dtype=np.int64)
    flat = np.fromiter((i for x in ids for i in x), dtype=np.int32, count=int(offsets[-1]))
    buffer = io.BytesIO()
    np.savez(buffer, ids=flat, offsets=offsets)
    write_entry(path, buffer.getvalue())
    return ids
