"""Mechanism probes: small generated tasks on which one mechanism of a paper decides the outcome.

Every example is a sequence of ``task.length`` tokens read by an encoder (masked-LM kind): some positions are
*scored*, each with a target symbol, and the model is trained and scored on those positions only. The ops:

- ``recall``, multi-query associative recall (Arora et al. 2023, "Zoology"): ``num_pairs`` key-value facts,
  each one token ``<k=v>``, lie at random places in the first ``context_fraction`` of the sequence; queries
  ``<k?>`` for ``num_queries`` of those keys lie at random places in the last ``context_fraction``; the answer
  at a query is the key's value. Between them, filler tokens. Which position holds the answer changes from
  example to example, so only content-based lookup (a query that finds its key by comparing tokens) solves it,
  and every query is at least ``length * (1 - 2 * context_fraction)`` positions away from every fact.
  ``end_fillers`` > 0 keeps that many positions at either end filler only, and shifts the facts and queries
  inward by as much (the gap between them shrinks by ``2 * end_fillers``): with ``end_fillers`` = one block,
  BigBird's global blocks (the first and the last) hold no fact and no query, so no query is answered in one
  hop through a global block and a route through the globals takes two.
- ``copy`` / ``reverse`` at one fixed length: ``length / 2`` symbols, then ``length / 2`` ``<mask>`` tokens whose
  targets are the symbols in the same / reversed order. Position ``n + i`` always reads position ``i``
  (``n - 1 - i``): a fixed alignment, no content needed to know where to look.
- ``hops``, variable-depth pointer chasing: ``num_keys`` nodes on one random cycle, each edge one token
  ``<a->b>`` at a random place; each query ``<a,h>`` asks for the node ``h`` edges after ``a`` (``h`` drawn
  from 1..``max_hops``). One attention lookup follows one edge, so a query of ``h`` hops needs about ``h``
  layers (or steps) of lookups: the depth each position needs varies and is known (``group`` = ``h``).

Examples are drawn on access from ``(data_seed, split, index)``: the data never changes with the training
seed, the train split can be large at no memory cost, and every row of a probe table reads the same examples.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.registry import register_task_family

OPS = ("recall", "copy", "reverse", "hops")
SPLIT_STREAMS = {"train": 0, "val": 1, "test": 2}
PAD, BOS, EOS, MASK, FILLER0 = 0, 1, 2, 3, 4  # specials; filler symbols follow


class ProbeLayout:
    """Token ids of one probe's vocabulary: specials, fillers, then the op's symbol groups."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.op = cfg["op"]
        keys, values, symbols = int(cfg["num_keys"]), int(cfg["num_values"]), int(cfg["num_symbols"])
        self.keys, self.values, self.symbols = keys, values, symbols
        self.max_hops = int(cfg["max_hops"])
        self.filler = FILLER0
        self.num_fillers = int(cfg["num_fillers"])
        nxt = FILLER0 + self.num_fillers
        if self.op in ("copy", "reverse"):
            self.symbol0 = nxt
            nxt += symbols
        elif self.op == "recall":
            self.value0 = nxt  # answers: value symbols
            self.fact0 = self.value0 + values  # <k=v> at fact0 + k * values + v
            self.query0 = self.fact0 + keys * values  # <k?> at query0 + k
            nxt = self.query0 + keys
        else:  # hops
            self.node0 = nxt  # answers: node symbols
            self.edge0 = self.node0 + keys  # <a->b> at edge0 + a * keys + b
            self.query0 = self.edge0 + keys * keys  # <a,h> at query0 + a * max_hops + (h - 1)
            nxt = self.query0 + keys * self.max_hops
        self.vocab_size = nxt


def _check(cfg: dict[str, Any]) -> None:
    op, length = cfg["op"], int(cfg["length"])
    if op not in OPS:
        raise DataError(f"task.op={op!r}; valid: {', '.join(OPS)}")
    if int(cfg["num_fillers"]) < 1:
        raise DataError(f"task.num_fillers={cfg['num_fillers']} must be >= 1 (the token between facts and queries)")
    if op in ("copy", "reverse"):
        if length < 2 or length % 2:
            raise DataError(f"task.length={length} must be even for {op}: half symbols, half answers")
        if int(cfg["num_symbols"]) < 2:
            raise DataError(f"task.num_symbols={cfg['num_symbols']} must be >= 2")
    elif op == "recall":
        fraction = float(cfg["context_fraction"])
        if not 0.0 < fraction <= 0.5:
            raise DataError(f"task.context_fraction={fraction} must lie in (0, 0.5]: facts in the first part, "
                            "queries in the last, never overlapping")
        room = int(length * fraction)
        ends = int(cfg["end_fillers"])
        if ends < 0 or 2 * (ends + room) > length:
            raise DataError(f"task.end_fillers={ends} must be >= 0 and leave the facts' and the queries' "
                            f"{room} places each (task.context_fraction={fraction:g} of task.length={length}) "
                            f"inside the sequence without overlap: 2 x ({ends} + {room}) <= {length}")
        if not 1 <= cfg["num_queries"] <= cfg["num_pairs"] <= min(room, cfg["num_keys"]):
            raise DataError(
                f"task.num_queries={cfg['num_queries']} <= task.num_pairs={cfg['num_pairs']} <= min(task.num_keys="
                f"{cfg['num_keys']}, {room} places in the first {fraction:g} of task.length={length}) must hold")
        if int(cfg["num_values"]) < 2:
            raise DataError(f"task.num_values={cfg['num_values']} must be >= 2")
    else:
        keys, hops, queries = int(cfg["num_keys"]), int(cfg["max_hops"]), int(cfg["num_queries"])
        if not 1 <= hops < keys:
            raise DataError(f"task.max_hops={hops} must lie in 1..task.num_keys-1={keys - 1} (the cycle's length)")
        if keys + queries > length or queries < 1:
            raise DataError(f"task.num_keys={keys} edges + task.num_queries={queries} queries must fit in "
                            f"task.length={length}, with at least one query")


def make_example(cfg: dict[str, Any], layout: ProbeLayout, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One example: ``ids`` (inputs), ``target`` (the answer at scored positions, the input elsewhere),
    ``scored`` (bool) and ``group`` (the hops a query needs; 0 at unscored positions and for ops without)."""
    length = int(cfg["length"])
    ids = layout.filler + rng.integers(0, layout.num_fillers, size=length)
    target, scored, group = ids.copy(), np.zeros(length, bool), np.zeros(length, np.int64)
    if layout.op in ("copy", "reverse"):
        n = length // 2
        symbols = layout.symbol0 + rng.integers(0, layout.symbols, size=n)
        ids[:n], ids[n:] = symbols, MASK
        target[:n] = symbols
        target[n:] = symbols if layout.op == "copy" else symbols[::-1]
        scored[n:] = True
    elif layout.op == "recall":
        room = int(length * float(cfg["context_fraction"]))
        ends = int(cfg["end_fillers"])  # filler-only positions at either end (the draws do not change with it)
        pairs, queries = int(cfg["num_pairs"]), int(cfg["num_queries"])
        keys = rng.choice(layout.keys, size=pairs, replace=False)
        values = rng.integers(0, layout.values, size=pairs)
        facts_at = ends + rng.choice(room, size=pairs, replace=False)
        asked = rng.choice(pairs, size=queries, replace=False)
        queries_at = length - ends - room + rng.choice(room, size=queries, replace=False)
        ids[facts_at] = layout.fact0 + keys * layout.values + values
        target[facts_at] = ids[facts_at]
        ids[queries_at] = layout.query0 + keys[asked]
        target[queries_at] = layout.value0 + values[asked]
        scored[queries_at] = True
    else:  # hops
        nodes, queries = layout.keys, int(cfg["num_queries"])
        cycle = rng.permutation(nodes)
        successor = np.empty(nodes, np.int64)
        successor[cycle] = np.roll(cycle, -1)
        places = rng.permutation(length)
        edges_at, queries_at = places[:nodes], places[nodes : nodes + queries]
        ids[edges_at] = layout.edge0 + np.arange(nodes) * nodes + successor
        target[edges_at] = ids[edges_at]
        start = rng.integers(0, nodes, size=queries)
        hops = rng.integers(1, layout.max_hops + 1, size=queries)
        answer = start.copy()
        for h in range(1, layout.max_hops + 1):
            answer = np.where(hops >= h, successor[answer], answer)
        ids[queries_at] = layout.query0 + start * layout.max_hops + hops - 1
        target[queries_at] = layout.node0 + answer
        scored[queries_at] = True
        group[queries_at] = hops
    return {"ids": ids, "target": target, "scored": scored, "group": group}


class ProbeDataset(Dataset):
    """``size`` examples, example ``i`` drawn from ``(seed, stream, i)`` on access."""

    def __init__(self, cfg: dict[str, Any], layout: ProbeLayout, *, size: int, seed: int, stream: int) -> None:
        self.cfg, self.layout, self.size, self.seed, self.stream = cfg, layout, size, seed, stream

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not -self.size <= i < self.size:
            raise IndexError(f"example {i} out of range for {self.size}")
        example = make_example(self.cfg, self.layout, np.random.default_rng([self.seed, self.stream, i % self.size]))
        out = {key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in example.items()}
        out["ids"], out["target"] = out["ids"].long(), out["target"].long()
        # One "character" per token: the masked-LM scorer's bits per character is then bits per answer.
        out["chars"] = torch.ones_like(out["ids"])
        return out


def _collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([b[key] for b in batch]) for key in batch[0]}


@register_task_family("probe")
def load_probe(cfg: dict[str, Any], seed: int) -> TaskData:
    _check(cfg)
    layout = ProbeLayout(cfg)
    data_seed = int(seed if cfg.get("data_seed") is None else cfg["data_seed"])
    datasets = {split: ProbeDataset(cfg, layout, size=int(cfg[f"{split}_size"]), seed=data_seed, stream=stream)
                for split, stream in SPLIT_STREAMS.items()}
    for split, data in datasets.items():
        if len(data) < 1:
            raise DataError(f"task.{split}_size must be >= 1")
    flavours = {
        "mlm_acc": "accuracy of the arg-max answer at the scored positions",
        "bits_per_token": "mean NLL of the answer in bits",
        "bpc": "the same as bits_per_token (one character per token)",
        "mlm_acc_shuffled": "mlm_acc with each sequence's positions in a random order (what order is worth)",
        "mlm_acc_from_order": "mlm_acc - mlm_acc_shuffled",
    }
    if layout.op == "hops":
        flavours["acc_h<h>"] = "mlm_acc over the queries that need h hops"
        flavours["steps_h<h>"] = ("mean layer applications at the queries that need h hops (ACT: the halting "
                                  "step; fixed depth: the depth)")
        flavours["steps_std"] = ("standard deviation of the layer applications over all answers (0: every answer "
                                 "got the same number of steps)")
        flavours["steps_gain"] = f"steps_h{layout.max_hops} - steps_h1: how much more computation the deepest " \
                                 "queries get than the shallowest"
    return TaskData(
        kind="mlm",
        datasets=datasets,
        collate=_collate,
        vocab_size=layout.vocab_size,
        pad_id=PAD,
        bos_id=BOS,
        eos_id=EOS,
        max_len=int(cfg["length"]),
        metric_flavours=flavours,
        train_lengths=[int(cfg["length"])] * 10,
        detokenize=lambda ids: " ".join(str(int(i)) for i in ids),
        description=f"probe {layout.op}, length {cfg['length']}, vocabulary {layout.vocab_size}, generated from "
                    f"seed {data_seed}",
    )
