"""A WordPiece vocabulary learned the same way in every process: BPE merges over ``##``-prefixed word pieces.

HF ``tokenizers``' ``WordPieceTrainer`` is this algorithm (a ``BpeTrainer`` with ``continuing_subword_prefix``,
then a WordPiece model over the BPE vocabulary), but it numbers the alphabet and the ``##`` pieces in the
iteration order of Rust hash maps, which is drawn afresh in every process, and breaks ties between equally
frequent merges by those numbers. Trained on the same text, two processes then disagree on the ids and even
on the set of tokens (on GLUE CoLA at a vocabulary of 8000: 6723 tokens in one process, 6725 in another), so
the ranks of a DDP run, a resumed run whose cache was cleared, or a checkpoint evaluated on another machine
would read different ids than training wrote. Here every order is defined by the strings and their counts:

- the alphabet: each word's characters, by falling count then the character; then the ``##`` continuation
  pieces, by falling count then the piece;
- the merges: the most frequent adjacent pair, ties to the smaller pair of strings (lexicographically); the
  merged piece is ``a + b`` without ``b``'s prefix; learning stops at ``vocab_size`` tokens or when no pair
  is seen ``min_frequency`` times (the HF trainer's rules).

Encoding is left to HF's WordPiece model (greedy longest match first), which is deterministic given the
vocabulary. Pure Python: a vocabulary of 8000 over GLUE's largest local split trains in seconds, and the
result is cached with the tokenizer.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

PREFIX = "##"

Pair = tuple[str, str]


def _pieces(word: str) -> list[str]:
    return [word[0], *(PREFIX + ch for ch in word[1:])]


def _pairs(pieces: Sequence[str]) -> Counter[Pair]:
    return Counter(zip(pieces, pieces[1:]))


def _merge(pieces: list[str], pair: Pair, merged: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(pieces):
        if i + 1 < len(pieces) and pieces[i] == pair[0] and pieces[i + 1] == pair[1]:
            out.append(merged)
            i += 2
        else:
            out.append(pieces[i])
            i += 1
    return out


def _ranked(counts: Counter[str]) -> list[str]:
    return [unit for unit, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def learn_wordpiece_vocabulary(word_counts: Mapping[str, int], *, vocab_size: int, specials: Iterable[str] = (),
                               min_frequency: int = 1) -> list[str]:
    """The vocabulary in id order: ``specials``, the alphabet, the ``##`` pieces, then one token per merge."""
    vocab: list[str] = []
    seen: set[str] = set()

    def add(token: str) -> None:
        if token not in seen:
            seen.add(token)
            vocab.append(token)

    for special in specials:
        add(special)
    words = sorted((w, c) for w, c in word_counts.items() if w and c > 0)
    characters: Counter[str] = Counter()
    continuations: Counter[str] = Counter()
    for word, count in words:
        for ch in word:
            characters[ch] += count
        for ch in word[1:]:
            continuations[PREFIX + ch] += count
    for token in _ranked(characters) + _ranked(continuations):
        add(token)

    pieces = [_pieces(w) for w, _ in words]
    counts = [c for _, c in words]
    pair_count: Counter[Pair] = Counter()
    where: dict[Pair, set[int]] = {}
    for i, word_pieces in enumerate(pieces):
        for pair, n in _pairs(word_pieces).items():
            pair_count[pair] += n * counts[i]
            where.setdefault(pair, set()).add(i)
    # Lazy max-heap: an entry is current while its count equals pair_count's; stale ones are skipped.
    heap = [(-n, pair) for pair, n in pair_count.items()]
    heapq.heapify(heap)
    while len(vocab) < vocab_size and heap:
        negative, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negative:
            continue
        if -negative < max(min_frequency, 1):
            break
        merged = pair[0] + pair[1][len(PREFIX):]
        add(merged)
        changed: Counter[Pair] = Counter()
        for i in sorted(where.pop(pair, ())):
            before = _pairs(pieces[i])
            pieces[i] = _merge(pieces[i], pair, merged)
            after = _pairs(pieces[i])
            for old, n in before.items():
                changed[old] -= n * counts[i]
            for new, n in after.items():
                changed[new] += n * counts[i]
                where.setdefault(new, set()).add(i)
        for touched, delta in changed.items():
            if delta:
                pair_count[touched] += delta
                if pair_count[touched] > 0:
                    heapq.heappush(heap, (-pair_count[touched], touched))
                else:
                    del pair_count[touched]
        pair_count.pop(pair, None)
    return vocab
