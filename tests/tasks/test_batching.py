"""Token-budget batching: budgets hold, every example is seen once per epoch, seeded, sharded over ranks."""

from __future__ import annotations

import random

import pytest
from torch.utils.data import DistributedSampler

from attnlab.tasks import build_task
from attnlab.training.data import (
    TaskDataModule,
    TokenBudgetSampler,
    derive_token_batching,
    example_length,
    pack_by_tokens,
)

LENGTHS = [random.Random(0).randint(1, 60) for _ in range(500)] + [300]  # one example above the budget


def _sampler(**kw) -> TokenBudgetSampler:
    return TokenBudgetSampler(list(range(len(LENGTHS))), LENGTHS, max_tokens=256, **kw)


def test_batches_stay_within_the_budget_and_cover_every_example_once():
    s = _sampler(seed=3)
    batches = list(s)
    assert len(batches) == len(s) == s.total_batches
    assert sorted(i for b in batches for i in b) == list(range(len(LENGTHS)))
    for b in batches:
        padded = len(b) * max(LENGTHS[i] for i in b)
        assert padded <= 256 or len(b) == 1
    assert s.oversize == 1
    # length bucketing: batches are far tighter than random ones would be
    waste = sum(len(b) * max(LENGTHS[i] for i in b) - sum(LENGTHS[i] for i in b) for b in batches)
    assert waste < 0.1 * sum(LENGTHS)


def test_order_is_a_function_of_seed_and_epoch():
    a, b = _sampler(seed=1), _sampler(seed=1)
    assert list(a) == list(b)
    b.set_epoch(1)
    assert list(b) != list(a)
    assert sorted(map(len, b.batches(1))) == sorted(map(len, a.batches(0)))  # same sizes, new order
    assert list(_sampler(seed=2)) != list(a)


def test_ranks_get_disjoint_equal_shards():
    shards = [list(_sampler(seed=5, num_replicas=3, rank=r)) for r in range(3)]
    assert len({len(s) for s in shards}) == 1  # every rank runs the same number of steps
    seen = [i for s in shards for b in s for i in b]
    assert set(seen) == set(range(len(LENGTHS)))
    total = _sampler(seed=5).total_batches
    assert len(shards[0]) * 3 - total < 3  # only the padding batches repeat
    assert isinstance(_sampler(num_replicas=2, rank=1), DistributedSampler)


def test_skip_resumes_part_way_into_an_epoch():
    s = _sampler(seed=4)
    full = list(s)
    s.skip = 5
    assert list(s) == full[5:]
    assert list(s) == full  # skip applies once


def test_max_sentences_caps_batches():
    batches, _ = pack_by_tokens([1] * 100, list(range(100)), max_tokens=1000, max_sentences=8)
    assert max(map(len, batches)) == 8 and sum(map(len, batches)) == 100


def test_example_length_of_each_dataset_kind():
    assert example_length(([5, 6, 7], [1, 2])) == 4           # seq2seq: longer side + EOS/BOS
    assert example_length(([5, 6, 7], [1, 2], 9)) == 4        # indexed seq2seq
    assert example_length(([5, 6, 7], 1)) == 3                # classification
    assert example_length(([5, 6], 1, 4)) == 2                 # indexed classification
    assert example_length([1, 2, 3, 4]) == 4                   # LM block
    assert example_length({"ids": [1, 2], "mask": [0, 1]}) == 2


def test_derive_token_batching():
    assert derive_token_batching(4096, world=2, max_tokens_per_micro=4096) == (2048, 1)
    assert derive_token_batching(25000, world=1, max_tokens_per_micro=4096) == (3571, 7)
    with pytest.raises(ValueError):
        derive_token_batching(0, world=1, max_tokens_per_micro=10)


def test_datamodule_token_loader_yields_collated_batches_within_budget():
    task = build_task(dict(name="algo/x", family="algo", loader="algorithmic", op="copy", base=10, train_size=200,
                           val_size=8, test_size=8, train_max_len=30, test_min_len=1, test_max_len=30), seed=0)
    dm = TaskDataModule(task, micro_batch=64, eval_batch=8, micro_tokens=120, shuffle_seed=0)
    loader = dm.train_dataloader()
    assert isinstance(loader.sampler, DistributedSampler)  # Lightning leaves it in place under DDP
    batches = list(loader)
    assert sum(b["src"].shape[0] for b in batches) == 200 and len(batches) == len(loader)
    for b in batches:
        width = max(b["src"].shape[1], b["tgt_out"].shape[1])
        assert b["src"].shape[0] * width <= 120 or b["src"].shape[0] == 1
    plain = TaskDataModule(task, micro_batch=16, eval_batch=8).train_dataloader()
    assert next(iter(plain))["src"].shape[0] == 16


def test_tokens_per_update_is_a_validated_batch_key(tmp_path):
    from attnlab.errors import ConfigError
    from attnlab.training.config import validate
    from tests.conftest import compose

    assert compose([], run_dir=tmp_path).batch.tokens_per_update is None
    validate(compose(["batch.tokens_per_update=4096"], run_dir=tmp_path))
    with pytest.raises(ConfigError, match="batch.tokens_per_update=0 must be positive"):
        validate(compose(["batch.tokens_per_update=0"], run_dir=tmp_path))


@pytest.mark.parametrize("token_budget", [False, True], ids=["sentences", "tokens"])
def test_ranks_resumed_part_way_see_the_rest_of_their_own_shard(token_budget):
    """Issue 36: each rank reads distinct data, their union is the one-process epoch, and a rank resumed
    after k batches (the checkpoint's ``batches_done``) goes on with exactly its own remaining batches, in
    sentence mode (``ResumableSampler``) as in token-budget mode."""
    from attnlab.training.resumable_data import ResumableSampler

    def sampler(rank: int, world: int = 2):
        if token_budget:
            return _sampler(seed=7, num_replicas=world, rank=rank)
        return ResumableSampler(list(range(len(LENGTHS))), num_replicas=world, rank=rank, seed=7)

    def examples(items):
        return [i for item in items for i in (item if token_budget else [item])]

    shards = [list(sampler(rank)) for rank in (0, 1)]
    one_process = examples(list(sampler(0, world=1)))
    seen = [examples(shard) for shard in shards]
    assert len(shards[0]) == len(shards[1])
    # disjoint but for the one repeat that evens out the two ranks (as DistributedSampler pads)
    units = _sampler(seed=7).total_batches if token_budget else len(LENGTHS)
    assert len(shards[0]) + len(shards[1]) - units <= 1
    assert len(set(seen[0]) & set(seen[1])) <= (max(map(len, shards[1])) if token_budget else 1)
    assert set(seen[0]) | set(seen[1]) == set(one_process) == set(range(len(LENGTHS)))
    for rank in (0, 1):
        resumed = sampler(rank)
        resumed.skip = 5
        assert list(resumed) == shards[rank][5:]
