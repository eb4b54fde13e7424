"""Generated tasks are right, reproducible from their seed, and local data loads (or skips with a reason)."""

from __future__ import annotations

import random

import pytest

from attnlab.tasks import DataError, build_task
from attnlab.tasks.algorithmic import make_example
from attnlab.tasks.listops import _evaluate, generate
from tests.conftest import require_shared_data

ALGO = dict(name="algo/x", family="algo", loader="algorithmic", base=10, train_size=50, val_size=10, test_size=10,
            train_max_len=8, test_min_len=9, test_max_len=30, data_seed=None)


@pytest.mark.parametrize("op", ["copy", "reverse", "addition"])
def test_algorithmic_targets_are_correct(op):
    rng = random.Random(0)
    for _ in range(200):
        x, y = make_example(op, rng, rng.randint(1, 30), 10)
        if op == "copy":
            assert y == x
        elif op == "reverse":
            assert y == x[::-1]
        else:
            plus = x.index("+")
            a, b = x[:plus], x[plus + 1 :]
            as_int = lambda digits: int("".join(reversed(digits)))  # little-endian digits
            assert as_int(y) == as_int(a) + as_int(b)


def test_algorithmic_splits_lengths_and_seed():
    task = build_task({**ALGO, "op": "copy"}, seed=3)
    assert task.kind == "seq2seq"
    assert all(len(x) <= 8 for x, _ in task.datasets["train"].pairs)
    assert all(9 <= len(x) <= 30 for x, _ in task.datasets["test"].pairs)
    again = build_task({**ALGO, "op": "copy"}, seed=3)
    assert again.datasets["train"].pairs == task.datasets["train"].pairs
    other = build_task({**ALGO, "op": "copy"}, seed=4)
    assert other.datasets["train"].pairs != task.datasets["train"].pairs
    fixed = build_task({**ALGO, "op": "copy", "data_seed": 0}, seed=99)
    assert fixed.datasets["train"].pairs == build_task({**ALGO, "op": "copy", "data_seed": 0}, seed=1).datasets[
        "train"].pairs


def test_the_beyond_training_split_holds_only_lengths_past_training():
    # issue 53: the paper's test lengths start at 1, so its "10x" set mixes in training lengths; test_ood does not
    task = build_task({**ALGO, "op": "reverse", "test_min_len": 1, "test_size": 200}, seed=0)
    assert task.eval_splits == {"test": "test", "test_train_len": "test_train_len", "test_ood": "test_ood"}
    lengths = [len(x) for x, _ in task.datasets["test_ood"].pairs]
    assert len(lengths) == 200 and min(lengths) == 9 and max(lengths) == 30  # 9..30 over 200 draws
    assert min(len(x) for x, _ in task.datasets["test"].pairs) <= 8  # the paper-comparable split still mixes them
    same_lengths = build_task({**ALGO, "op": "reverse", "test_max_len": 8, "test_min_len": 1}, seed=0)
    assert "test_ood" not in same_lengths.eval_splits  # nothing lies beyond the training lengths


def test_algorithmic_collate_frames_targets():
    task = build_task({**ALGO, "op": "reverse"}, seed=0)
    batch = task.collate([task.datasets["train"][i] for i in range(4)])
    assert (batch["tgt_in"][:, 0] == task.bos_id).all()
    for row_in, row_out in zip(batch["tgt_in"].tolist(), batch["tgt_out"].tolist()):
        real_out = [t for t in row_out if t != task.pad_id]
        assert real_out[-1] == task.eos_id
        assert row_in[1 : len(real_out)] == real_out[:-1]


def test_bad_algorithmic_config_is_refused():
    with pytest.raises(DataError, match="valid: copy, reverse, addition"):
        build_task({**ALGO, "op": "sort"}, seed=0)
    with pytest.raises(DataError, match="train_max_len"):
        build_task({**ALGO, "op": "copy", "train_max_len": 50}, seed=0)


def test_listops_values_and_lengths():
    assert _evaluate("[MAX", [1, 7, 3]) == 7
    assert _evaluate("[MED", [1, 7, 3]) == 3
    assert _evaluate("[SM", [9, 7, 3]) == 9
    data = generate(30, min_len=10, max_len=60, max_depth=5, max_args=4, seed=1)
    assert len(data) == 30 and all(10 <= len(t) <= 60 and 0 <= v <= 9 for t, v in data)


def test_text_lm_missing_file_names_the_fix(tmp_path):
    cfg = dict(name="lm/wikitext2", family="lm", loader="text_lm", source="local", data_root=str(tmp_path),
               files={"train": "wikitext2/wiki.train.tokens", "val": "x", "test": "y"}, block_len=16)
    with pytest.raises(DataError, match="paths.data_root"):
        build_task(cfg, seed=0)


def test_hub_request_offline_fails_fast_and_names_local(monkeypatch):
    import time

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    cfg = dict(name="lm/wikitext2", family="lm", loader="text_lm", source="hub", data_root="data",
               files={"train": "wikitext2/wiki.train.tokens"}, hub_id="Salesforce/wikitext",
               hub_config="wikitext-2-v1", block_len=16)
    start = time.monotonic()
    with pytest.raises(DataError, match="task.source=local"):
        build_task(cfg, seed=0)
    assert time.monotonic() - start < 5


def test_wikitext2_local_copy_loads_with_standard_counts():
    root = require_shared_data("wikitext2/wiki.valid.tokens")
    cfg = dict(name="lm/wikitext2", family="lm", loader="text_lm", source="local", data_root=str(root),
               files={"train": "wikitext2/wiki.valid.tokens", "val": "wikitext2/wiki.valid.tokens",
                      "test": "wikitext2/wiki.test.tokens"}, block_len=128)
    task = build_task(cfg, seed=0)
    # WikiText-2 valid: 217,646 tokens including one <eos> per line (README of the shared data).
    assert len(task.datasets["val"]) == (217_646 - 1) // 128
