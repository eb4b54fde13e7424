"""ListOps (Nangia & Bowman 2018; the LRA variant of Tay et al. 2021), generated offline from a seed.

Expressions of MAX, MIN, MED (median) and SM (sum modulo 10) over digits 0-9, nested up to
``max_depth`` with at most ``max_args`` arguments per operator, kept when their token length lies in
[min_len, max_len]. The label is the value (10 classes). LRA uses max_depth 10, max_args 10 and lengths
500-2000; CPU scale shrinks the lengths.
"""

from __future__ import annotations

import random
import statistics
from typing import Any

from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.batching import ClassificationCollate, LabelledDataset
from attnlab.tasks.registry import register_task_family
from attnlab.tasks.vocab import Vocab

OPS = ("[MAX", "[MIN", "[MED", "[SM")
# LRA's generator makes a node an operator with probability 0.25 (VALUE_P), below the root.
LEAF_PROBABILITY = 0.75


def _evaluate(op: str, values: list[int]) -> int:
    if op == "[MAX":
        return max(values)
    if op == "[MIN":
        return min(values)
    if op == "[MED":
        return int(statistics.median_low(values))
    return sum(values) % 10


class _TooLong(Exception):
    """Raised while growing an expression that is already longer than allowed (rejected early)."""


def _tree(rng: random.Random, depth: int, max_depth: int, max_args: int, p_leaf: float, budget: list[int]):
    # ``budget`` is the number of tokens still allowed; a tree with up to max_args**max_depth leaves is
    # abandoned as soon as it overflows instead of being built and then rejected.
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooLong
    if depth >= max_depth or (depth > 0 and rng.random() < p_leaf):
        v = rng.randrange(10)
        return [str(v)], v
    op = rng.choice(OPS)
    tokens, values = [op], []
    for _ in range(rng.randint(2, max_args)):
        t, v = _tree(rng, depth + 1, max_depth, max_args, p_leaf, budget)
        tokens += t
        values.append(v)
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooLong
    tokens.append("]")
    return tokens, _evaluate(op, values)


def generate(size: int, *, min_len: int, max_len: int, max_depth: int, max_args: int, seed: int):
    rng = random.Random(seed)
    out, tries = [], 0
    while len(out) < size:
        tries += 1
        if tries > 200 * size + 10_000:
            raise DataError(
                f"ListOps: could not generate {size} expressions with lengths {min_len}..{max_len}; "
                f"widen the length range or raise max_depth/max_args"
            )
        try:
            tokens, value = _tree(rng, 0, max_depth, max_args, p_leaf=LEAF_PROBABILITY, budget=[max_len])
        except _TooLong:
            continue
        if min_len <= len(tokens) <= max_len:
            out.append((tokens, value))
    return out


@register_task_family("listops")
def load_listops(cfg: dict[str, Any], seed: int) -> TaskData:
    vocab = Vocab([*OPS, "]", *[str(d) for d in range(10)]])
    data_seed = cfg.get("data_seed")
    base_seed = seed if data_seed is None else data_seed
    datasets = {}
    for stream, split in enumerate(("train", "val", "test")):
        raw = generate(cfg[f"{split}_size"], min_len=cfg["min_len"], max_len=cfg["max_len"],
                       max_depth=cfg["max_depth"], max_args=cfg["max_args"], seed=base_seed * 1000 + stream)
        datasets[split] = LabelledDataset([(vocab.encode(t), v) for t, v in raw])
    return TaskData(
        kind="classification",
        datasets=datasets,
        collate=ClassificationCollate(vocab.pad_id),
        vocab_size=len(vocab),
        pad_id=vocab.pad_id,
        max_len=cfg["max_len"],
        num_classes=10,
        metric_flavours={"acc": "accuracy of the predicted value (10 classes)"},
        train_lengths=[len(ids) for ids, _ in datasets["train"].examples],
        description=f"ListOps, lengths {cfg['min_len']}..{cfg['max_len']}, depth <= {cfg['max_depth']}",
    )
