"""The WordPiece vocabulary learner against a corpus worked by hand, and every tokenizer kind equal across
processes (HF's WordPieceTrainer numbers its pieces in hash-map order, drawn per process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attnlab.tasks.tokenization import build_tokenizer
from attnlab.tasks.vocab import SPECIALS
from attnlab.tasks.wordpiece import learn_wordpiece_vocabulary

# hug x10, pug x5, pun x12, bun x4, hugs x5. By hand: characters by count u36 g20 p17 n16 h15 s5 b4, then
# ##u36 ##g20 ##n16 ##s5; merges (##u,##g)=20, (##u,##n)=16, (h,##ug)=15, (p,##un)=12, then a tie at 5
# between (hug,##s) and (p,##ug) that the smaller strings win, (p,##ug)=5, (b,##un)=4.
WORDS = {"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}
ALPHABET = ["u", "g", "p", "n", "h", "s", "b", "##u", "##g", "##n", "##s"]
MERGED = ["##ug", "##un", "hug", "pun", "hugs", "pug", "bun"]


def test_vocabulary_is_the_hand_worked_one():
    assert learn_wordpiece_vocabulary(WORDS, vocab_size=100, specials=SPECIALS) == [*SPECIALS, *ALPHABET, *MERGED]


def test_size_and_frequency_stop_learning():
    by_size = learn_wordpiece_vocabulary(WORDS, vocab_size=len(SPECIALS) + len(ALPHABET) + 3, specials=SPECIALS)
    assert by_size[-3:] == MERGED[:3] and len(by_size) == len(SPECIALS) + len(ALPHABET) + 3
    by_count = learn_wordpiece_vocabulary(WORDS, vocab_size=100, specials=SPECIALS, min_frequency=5)
    assert by_count[-1] == "pug"  # bun's pair is seen 4 times


def test_ties_go_to_the_smaller_strings_whatever_the_order_seen():
    # (z,##a) and (b,##a) both seen 3 times; z-words come first in the mapping, b must still merge first.
    words = {"za": 3, "ba": 3}
    assert learn_wordpiece_vocabulary(words, vocab_size=100)[-2:] == ["ba", "za"]


def test_a_repeated_piece_merges_left_to_right():
    # "aaa" -> a ##a ##a: (##a,##a) merges once, leaving a ##aa; then (a,##aa).
    assert learn_wordpiece_vocabulary({"aaa": 3}, vocab_size=100) == ["a", "##a", "##aa", "aaa"]


def test_tokenizer_encodes_by_longest_match(tmp_path):
    texts = [" ".join([w] * n) for w, n in WORDS.items()]
    tok = build_tokenizer("wordpiece", texts, vocab_size=100, cache_dir=tmp_path)
    assert tok.encode("pugs bug hug!").tokens == ["pug", "##s", "b", "##ug", "hug", "<unk>"]
    assert tok.decode(tok.encode("hugs pun").ids) == "hugs pun"


_PROCESS = """
import json, random, sys
from attnlab.tasks.tokenization import build_tokenizer
rng = random.Random(0)
stems = ["the", "cat", "sat", "on", "mat", "dog", "ran", "fast", "slow", "blue", "house", "tree", "zeta", "xylo"]
texts = [" ".join(rng.choice(stems) + rng.choice(["", "s", "ed", "ing"]) for _ in range(12)) for _ in range(400)]
print(json.dumps({kind: build_tokenizer(kind, texts, vocab_size=120, cache_dir=sys.argv[1]).get_vocab()
                  for kind in ("bpe", "wordpiece", "word", "char")}))
"""


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "word", "char"])
def test_two_processes_train_the_same_ids(kind, tmp_path, vocabularies_of_two_processes):
    first, second = vocabularies_of_two_processes
    assert first[kind] == second[kind]


@pytest.fixture(scope="module")
def vocabularies_of_two_processes(tmp_path_factory):
    runs = []
    for i in range(2):
        cache = tmp_path_factory.mktemp(f"process{i}")  # no shared cache: each process trains
        out = subprocess.run([sys.executable, "-c", _PROCESS, str(cache)], capture_output=True, text=True,
                             check=True, timeout=120)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs
