"""Algorithmic tasks of the Universal Transformer paper (Sec. 3.3): copy, reverse, addition.

Generated offline from a seed, following tensor2tensor's ``algorithmic_{identity,reverse,addition}_decimal40``:
decimal symbols, training lengths 1..40 and evaluation lengths up to 400 (both configurable). For
addition the input is ``a + b`` with both numbers written least-significant digit first (T2T's
little-endian convention) and the target is the sum, also least-significant digit first.

Splits: ``train`` and ``val`` at training lengths; ``test`` at evaluation lengths (length
generalisation, the paper's setting: lengths drawn from ``test_min_len``, so with the default 1 about a tenth of
its items sit at training lengths), ``test_ood`` strictly beyond the training lengths (``train_max_len + 1`` to
``test_max_len``: the items that test length generalisation and nothing else; only where such lengths exist) and
``test_train_len`` at training lengths.
"""

from __future__ import annotations

import random
from typing import Any

from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.batching import PairDataset
from attnlab.tasks.registry import register_task_family
from attnlab.tasks.vocab import Vocab, symbol_seq2seq_task

PLUS = "+"


def _digits(rng: random.Random, n: int, base: int) -> list[str]:
    return [str(rng.randrange(base)) for _ in range(n)]


def make_example(name: str, rng: random.Random, length: int, base: int) -> tuple[list[str], list[str]]:
    """One (input, target) pair whose input has ``length`` symbols (addition: digits of both operands)."""
    if name == "copy":
        x = _digits(rng, length, base)
        return x, list(x)
    if name == "reverse":
        x = _digits(rng, length, base)
        return x, x[::-1]
    if name == "addition":
        length = max(length, 2)
        n1 = rng.randint(1, length - 1)
        a, b = _digits(rng, n1, base), _digits(rng, length - n1, base)
        total = _to_number(a, base) + _to_number(b, base)
        return [*a, PLUS, *b], _to_digits(total, base)
    raise DataError(f"unknown algorithmic task {name!r}; valid: copy, reverse, addition")


def _to_number(little_endian: list[str], base: int) -> int:
    return sum(int(d) * base**i for i, d in enumerate(little_endian))


def _to_digits(n: int, base: int) -> list[str]:
    if n == 0:
        return ["0"]
    out = []
    while n:
        out.append(str(n % base))
        n //= base
    return out


def generate(name: str, *, size: int, min_len: int, max_len: int, base: int, seed: int):
    rng = random.Random(seed)
    return [make_example(name, rng, rng.randint(min_len, max_len), base) for _ in range(size)]


@register_task_family("algorithmic")
def load_algorithmic(cfg: dict[str, Any], seed: int) -> TaskData:
    name, base = cfg["op"], int(cfg["base"])
    if not 2 <= base <= 10:
        raise DataError(f"task.base={base} must be between 2 and 10 (decimal symbols)")
    if cfg["train_max_len"] > cfg["test_max_len"]:
        raise DataError("task.train_max_len must not exceed task.test_max_len")
    vocab = Vocab([str(d) for d in range(base)] + [PLUS])
    # Each split gets its own stream so that changing one split's size leaves the others unchanged.
    split_specs = {
        "train": (cfg["train_size"], 1, cfg["train_max_len"], 0),
        "val": (cfg["val_size"], 1, cfg["train_max_len"], 1),
        "test": (cfg["test_size"], cfg["test_min_len"], cfg["test_max_len"], 2),
        "test_train_len": (cfg["test_size"], 1, cfg["train_max_len"], 3),
    }
    beyond = cfg["test_max_len"] > cfg["train_max_len"]
    if beyond:  # a stream of its own: the other splits stay as they were before this split existed
        split_specs["test_ood"] = (cfg["test_size"], cfg["train_max_len"] + 1, cfg["test_max_len"], 4)
    data_seed = cfg.get("data_seed")
    base_seed = seed if data_seed is None else data_seed
    datasets = {}
    for split, (size, lo, hi, stream) in split_specs.items():
        raw = generate(name, size=size, min_len=lo, max_len=hi, base=base, seed=base_seed * 1000 + stream)
        datasets[split] = PairDataset([(vocab.encode(x), vocab.encode(y)) for x, y in raw])
    return symbol_seq2seq_task(
        vocab,
        datasets,
        # Room for addition's "+", the source EOS, BOS/EOS framing and a sum one digit longer.
        max_len=cfg["test_max_len"] + 4,
        eval_splits={"test": "test", "test_train_len": "test_train_len",
                     **({"test_ood": "test_ood"} if beyond else {})},
        metric_flavours={
            "char_acc": "greedy decoding; fraction of target symbols right at their position",
            "seq_acc": "greedy decoding; fraction of outputs exactly equal to the target",
            # what each test split is, for the reader of a metric named test/... or test_train_len/...
            "splits": f"test: lengths {cfg['test_min_len']}-{cfg['test_max_len']} "
                      f"({cfg['test_max_len'] / cfg['train_max_len']:.3g}x the longest training length); "
                      f"test_train_len: lengths 1-{cfg['train_max_len']} (in distribution)",
        },
        train_lengths=[len(x) + 1 for x, _ in datasets["train"].pairs],
        detokenize=lambda ids: " ".join(vocab.decode(ids)),
        description=f"{name}, base {base}, train lengths 1..{cfg['train_max_len']}, "
        f"test lengths {cfg['test_min_len']}..{cfg['test_max_len']}, generated from seed {base_seed}",
    )
