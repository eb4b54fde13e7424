"""The probe tasks (tasks/probes.py) against independent readings of their definitions: each answer is
recomputed from the tokens of the example alone (parsing facts, edges and symbols back out of the ids)."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.tasks import DataError, build_task
from attnlab.tasks.probes import MASK, ProbeLayout
from attnlab.tasks.schemas import with_defaults

BASE = {"name": "probe/test", "family": "probe", "loader": "probe", "data_seed": 0, "train_size": 50,
        "val_size": 8, "test_size": 20}


def _task(**cfg):
    return build_task({**BASE, **cfg}, seed=7)


def _examples(task, split="test"):
    data = task.datasets[split]
    return [{k: v.numpy() for k, v in data[i].items()} for i in range(len(data))]


def test_recall_answers_are_the_values_of_the_queried_keys_far_from_every_fact():
    cfg = {**BASE, "op": "recall", "length": 128, "num_keys": 12, "num_values": 5, "num_pairs": 6,
           "num_queries": 4, "context_fraction": 0.25, "num_fillers": 3}
    task = build_task(cfg, seed=7)
    layout = ProbeLayout(with_defaults(cfg))
    for ex in _examples(task):
        facts = {}
        for pos, tok in enumerate(ex["ids"]):
            if layout.fact0 <= tok < layout.query0:
                key, value = divmod(int(tok) - layout.fact0, cfg["num_values"])
                assert key not in facts, "a key appears in two facts: its query would be ambiguous"
                facts[key] = (pos, value)
        assert len(facts) == cfg["num_pairs"]
        queries = np.flatnonzero(ex["scored"])
        assert len(queries) == cfg["num_queries"]
        for q in queries:
            key = int(ex["ids"][q]) - layout.query0
            fact_pos, value = facts[key]
            assert ex["target"][q] == layout.value0 + value
            assert q - fact_pos >= 128 * (1 - 2 * 0.25), "a query closer to its fact than the probe promises"
        assert all(ex["ids"][p] < layout.value0 for p in range(128) if p not in queries and
                   not layout.fact0 <= ex["ids"][p] < layout.query0), "only fillers between facts and queries"


@pytest.mark.parametrize("op", ["copy", "reverse"])
def test_copy_and_reverse_read_one_fixed_position_each(op):
    task = _task(op=op, length=16, num_symbols=4, num_fillers=1)
    for ex in _examples(task):
        n = 8
        assert (ex["ids"][n:] == MASK).all() and not ex["scored"][:n].any() and ex["scored"][n:].all()
        source = ex["ids"][:n]
        assert list(ex["target"][n:]) == (list(source) if op == "copy" else list(source[::-1]))


def test_hops_answers_follow_the_edges_in_the_sequence_and_the_group_is_the_hop_count():
    cfg = {**BASE, "op": "hops", "length": 40, "num_keys": 9, "num_queries": 20, "max_hops": 5, "num_fillers": 2}
    task = build_task(cfg, seed=7)
    layout = ProbeLayout(with_defaults(cfg))
    seen_hops = set()
    for ex in _examples(task):
        successor = {}
        for tok in ex["ids"]:
            if layout.edge0 <= tok < layout.query0:
                a, b = divmod(int(tok) - layout.edge0, 9)
                successor[a] = b
        assert sorted(successor) == list(range(9))
        node, cycle = 0, []
        for _ in range(9):  # one cycle through every node: no shortcut answers
            cycle.append(node)
            node = successor[node]
        assert node == 0 and sorted(cycle) == list(range(9))
        for q in np.flatnonzero(ex["scored"]):
            start, h = divmod(int(ex["ids"][q]) - layout.query0, 5)
            h += 1
            node = start
            for _ in range(h):
                node = successor[node]
            assert ex["target"][q] == layout.node0 + node and ex["group"][q] == h
            seen_hops.add(h)
        assert (ex["group"][~ex["scored"]] == 0).all()
    assert seen_hops == {1, 2, 3, 4, 5}


def test_examples_depend_on_the_data_seed_split_and_index_only():
    a = _task(op="recall", length=64, num_pairs=4, num_queries=4)
    b = build_task({**BASE, "op": "recall", "length": 64, "num_pairs": 4, "num_queries": 4}, seed=99)
    for key in ("ids", "target", "scored"):
        assert (a.datasets["test"][3][key] == b.datasets["test"][3][key]).all(), "training seed changed the data"
    assert not (a.datasets["test"][3]["ids"] == a.datasets["train"][3]["ids"]).all(), "test repeats train"
    assert not (a.datasets["test"][3]["ids"] == a.datasets["test"][4]["ids"]).all()
    other = build_task({**BASE, "data_seed": 1, "op": "recall", "length": 64, "num_pairs": 4, "num_queries": 4}, 7)
    assert not (a.datasets["test"][3]["ids"] == other.datasets["test"][3]["ids"]).all()


@pytest.mark.parametrize(("cfg", "says"), [
    ({"op": "recall", "length": 32, "num_pairs": 9, "num_queries": 4}, "num_pairs"),
    ({"op": "recall", "length": 64, "context_fraction": 0.6}, "context_fraction"),
    ({"op": "reverse", "length": 15}, "even"),
    ({"op": "hops", "length": 20, "num_keys": 16, "num_queries": 8}, "fit"),
    ({"op": "hops", "length": 64, "num_keys": 4, "max_hops": 4}, "max_hops"),
    ({"op": "sort", "length": 8}, "valid: recall, copy, reverse, hops"),
])
def test_impossible_probe_settings_are_refused_in_one_line(cfg, says):
    with pytest.raises(DataError) as info:
        _task(**cfg)
    assert says in str(info.value) and "\n" not in str(info.value)
