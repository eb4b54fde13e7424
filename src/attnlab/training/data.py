"""A LightningDataModule over a task's plain datasets, batched by sentences or by a token budget.

Token-budget batching (``batch.tokens_per_update``, fairseq's ``--max-tokens`` per micro-batch): the
training examples are sorted by length (ties broken at random per epoch) and packed greedily into
micro-batches whose padded size ``len(batch) * longest`` stays within ``micro_tokens`` (and at most
``max_sentences`` examples); the micro-batches are then shuffled. Everything is a function of
(seed, epoch), so every rank builds the same list and takes its own shard (``batches[rank::world]``, padded
by repeating the first batches so that every rank runs the same number of steps). An example longer than
the budget gets a micro-batch of its own (counted in ``oversize``).

The sampler yields lists of indices and is a ``DistributedSampler``, so Lightning never swaps it under
DDP; the DataLoader runs with ``batch_size=None`` over a view whose items are whole collated batches.

Evaluation splits are batched by ``EvalBatchSampler``: the same batches for any number of ranks, dealt
round-robin, each example scored once (repeats that pad a rank are marked and skipped). Test splits of
sequence-to-sequence tasks are decoded in batches of sources of similar length: padding and the per-batch
decode length limit (``max_len_a * longest + b``) shrink, and a batch stops as soon as its similar hypotheses
finish. Outputs stay in reference order because scoring and the outputs files key every output by its example
index (``ref_index``), never by batch order.
Validation keeps split order: callbacks draw their fixed sample from the first validation batch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import lightning as L
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from attnlab.tasks import TaskData


def example_length(item: Any) -> int:
    """Tokens one example occupies in a padded batch: the longer side of a (source, target[, index]) pair
    plus one (source EOS / target BOS-EOS), the ids of an (ids, label[, index]) example, or an LM block."""
    if isinstance(item, dict):
        return len(item["ids"])
    if isinstance(item, tuple):
        if len(item) >= 2 and isinstance(item[1], (list, tuple)):
            return max(len(item[0]), len(item[1])) + 1
        return len(item[0])
    return len(item)


def pack_by_tokens(lengths: Sequence[int], order: Sequence[int], *, max_tokens: int,
                   max_sentences: int | None = None) -> tuple[list[list[int]], int]:
    """Greedy packing of ``order`` (indices sorted by length) into batches with
    ``len(batch) * max(length) <= max_tokens``; returns (batches, number of single oversize examples)."""
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    oversize = 0
    for i in order:
        n = lengths[i]
        wider = max(longest, n)
        full = max_sentences is not None and len(current) >= max_sentences
        if current and (wider * (len(current) + 1) > max_tokens or full):
            batches.append(current)
            current, wider = [], n
        current.append(i)
        longest = wider
        if len(current) == 1 and n > max_tokens:
            oversize += 1
    if current:
        batches.append(current)
    return batches, oversize


class TokenBudgetSampler(DistributedSampler):
    """Length-bucketed micro-batches of at most ``max_tokens`` padded tokens, this rank's shard.

    Yields lists of dataset indices. ``skip`` (in batches) leaves out the first batches of the next epoch on
    this rank (resuming part-way into an epoch); ``set_epoch`` reshuffles, as for ``DistributedSampler``.
    """

    def __init__(self, dataset: Dataset, lengths: Sequence[int], *, max_tokens: int, max_sentences: int | None = None,
                 num_replicas: int = 1, rank: int = 0, seed: int = 0, shuffle: bool = True) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=False)
        if max_tokens <= 0:
            raise ValueError(f"max_tokens={max_tokens} must be positive")
        if len(lengths) != len(dataset):
            raise ValueError(f"{len(lengths)} lengths for {len(dataset)} examples")
        self.lengths, self.max_tokens, self.max_sentences = list(lengths), int(max_tokens), max_sentences
        self.skip = 0
        # Batch sizes do not depend on the epoch (ties are only reordered), so the length is fixed.
        batches, self.oversize = pack_by_tokens(self.lengths, sorted(range(len(self.lengths)),
                                                                     key=self.lengths.__getitem__),
                                                max_tokens=self.max_tokens, max_sentences=max_sentences)
        self.total_batches = len(batches)
        self.num_samples = math.ceil(self.total_batches / self.num_replicas)  # batches per rank

    def batches(self, epoch: int) -> list[list[int]]:
        """Every rank's batches of ``epoch`` in order (the same list on every rank)."""
        rng = random.Random(self.seed * 1_000_003 + epoch)
        noise = [rng.random() for _ in self.lengths] if self.shuffle else list(range(len(self.lengths)))
        order = sorted(range(len(self.lengths)), key=lambda i: (self.lengths[i], noise[i]))
        batches, _ = pack_by_tokens(self.lengths, order, max_tokens=self.max_tokens,
                                    max_sentences=self.max_sentences)
        if self.shuffle:
            rng.shuffle(batches)
        pad = self.num_samples * self.num_replicas - len(batches)
        return batches + batches[:pad]

    def __iter__(self) -> Iterator[list[int]]:
        mine = self.batches(self.epoch)[self.rank:: self.num_replicas]
        skip, self.skip = self.skip, 0
        return iter(mine[skip:])

    def __len__(self) -> int:
        return self.num_samples


def source_length(item: Any) -> int:
    """Length of what a decoder conditions on: the source of a (source, target[, index]) pair."""
    return len(item[0]) if isinstance(item, tuple) else example_length(item)


class EvalSlot(list):
    """One evaluation batch: its example indices, its ``number`` in the split's batch order (the same for any
    number of ranks) and whether it is a ``repeat`` that only pads this rank (the modules skip it)."""

    def __init__(self, indices: Sequence[int], number: int, repeat: bool) -> None:
        super().__init__(indices)
        self.number, self.repeat = number, repeat


# Keys the evaluation loader adds to a collated batch (a dict); TaskModule pops them before the step reads it.
EVAL_NUMBER_KEY, EVAL_REPEAT_KEY = "eval_batch_number", "eval_repeat"


def pop_eval_slot(batch, batch_idx: int) -> tuple[int, bool]:
    """(the batch's number in its split, whether it only pads this rank), taken out of the batch; a batch
    from elsewhere (a test, a tool) is batch ``batch_idx`` and no repeat."""
    if isinstance(batch, dict) and EVAL_NUMBER_KEY in batch:
        return int(batch.pop(EVAL_NUMBER_KEY)), bool(batch.pop(EVAL_REPEAT_KEY))
    return batch_idx, False


def first_validation_rows(datamodule: L.LightningDataModule, size: int) -> dict[str, Any]:
    """The first ``size`` rows of the first validation batch: the fixed sample that ponder statistics and
    attention-weight histograms are drawn from (the same on any number of ranks: batch 0 is rank 0's)."""
    batch = next(iter(datamodule.val_dataloader()))
    pop_eval_slot(batch, 0)
    return {k: v[:size] for k, v in batch.items()}


class EvalBatchSampler(DistributedSampler):
    """Evaluation batches of ``batch_size`` examples, in split order or in order of ``lengths`` (ties by
    index), dealt round-robin over ranks: rank r gets batches r, r + world, ...

    The batches are the same for any number of ranks and every example is scored exactly once: a rank left
    with fewer batches than the others gets repeats marked ``EvalSlot.repeat``, which keep the step counts
    equal (Lightning expects it) and which the modules skip, so every metric equals the one-process value."""

    def __init__(self, dataset: Dataset, *, batch_size: int, lengths: Sequence[int] | None = None,
                 num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} must be positive")
        if lengths is not None and len(lengths) != len(dataset):
            raise ValueError(f"{len(lengths)} lengths for {len(dataset)} examples")
        order = (list(range(len(dataset))) if lengths is None
                 else sorted(range(len(lengths)), key=lambda i: (lengths[i], i)))
        self.all_batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
        self.num_samples = math.ceil(len(self.all_batches) / self.num_replicas)  # batches per rank

    def __iter__(self) -> Iterator[EvalSlot]:
        total = len(self.all_batches)
        for step in range(self.num_samples):
            number = self.rank + step * self.num_replicas
            yield EvalSlot(self.all_batches[number % total], number, repeat=number >= total)

    def __len__(self) -> int:
        return self.num_samples


class CollatedBatches(Dataset):
    """A dataset whose item for a list of indices is the collated batch of those examples."""

    def __init__(self, dataset: Dataset, collate: Callable[[list[Any]], Any]) -> None:
        self.dataset, self.collate = dataset, collate

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: list[int]):
        batch = self.collate([self.dataset[i] for i in indices])
        if isinstance(indices, EvalSlot):
            if not isinstance(batch, dict):
                raise TypeError(f"the task's collate returns {type(batch).__name__}; evaluation needs a dict "
                                f"(it carries the batch's place in the split)")
            batch[EVAL_NUMBER_KEY], batch[EVAL_REPEAT_KEY] = indices.number, indices.repeat
        return batch


def _as_is(batch):
    return batch


def loader_options(num_workers: int = 0, pin_memory: bool = False) -> dict[str, Any]:
    """The DataLoader settings every attnlab loader shares: worker processes kept across epochs, and
    page-locked batches on a GPU (so the copy to the device runs beside the step instead of before it)."""
    return {"num_workers": num_workers, "persistent_workers": num_workers > 0, "pin_memory": pin_memory}


def token_batch_loader(dataset: Dataset, collate: Callable, sampler: TokenBudgetSampler, *, num_workers: int = 0,
                       pin_memory: bool = False, generator=None) -> DataLoader:
    return DataLoader(CollatedBatches(dataset, collate), sampler=sampler, batch_size=None, collate_fn=_as_is,
                      generator=generator, **loader_options(num_workers, pin_memory))


def derive_token_batching(tokens_per_update: int, *, world: int, max_tokens_per_micro: int) -> tuple[int, int]:
    """(token budget per micro-batch, gradient accumulation) so that one update sees about
    ``tokens_per_update`` padded tokens over ``world`` devices, no micro-batch above ``max_tokens_per_micro``.

    The budget is a cap, as fairseq's ``--max-tokens``: an update sees at most ``tokens_per_update`` tokens
    (fewer when batches pack loosely), never exactly."""
    if tokens_per_update <= 0 or world <= 0 or max_tokens_per_micro <= 0:
        raise ValueError("tokens_per_update, world and max_tokens_per_micro must be positive")
    accumulate = math.ceil(tokens_per_update / (world * max_tokens_per_micro))
    return tokens_per_update // (world * accumulate), accumulate


class TaskDataModule(L.LightningDataModule):
    """Train batches of ``micro_batch`` sentences, or of at most ``micro_tokens`` padded tokens when set."""

    def __init__(self, task: TaskData, *, micro_batch: int, eval_batch: int, num_workers: int = 0,
                 shuffle_seed: int = 0, micro_tokens: int | None = None, pin_memory: bool = False) -> None:
        super().__init__()
        self.task, self.micro_batch, self.eval_batch = task, micro_batch, eval_batch
        self.num_workers, self.shuffle_seed, self.pin_memory = num_workers, shuffle_seed, pin_memory
        self.micro_tokens = micro_tokens

    def token_sampler(self, split: str, *, world: int = 1, rank: int = 0) -> TokenBudgetSampler:
        dataset = self.task.datasets[split]
        lengths = [example_length(dataset[i]) for i in range(len(dataset))]
        return TokenBudgetSampler(dataset, lengths, max_tokens=int(self.micro_tokens), max_sentences=self.micro_batch,
                                  num_replicas=world, rank=rank, seed=self.shuffle_seed)

    def _world_rank(self) -> tuple[int, int]:
        if self.trainer is None:
            return 1, 0
        return self.trainer.world_size, self.trainer.global_rank

    def eval_loader(self, split: str, *, by_length: bool = False) -> DataLoader:
        """Batches of ``eval_batch`` examples over every rank (``EvalBatchSampler``); ``by_length`` groups
        sequence-to-sequence sources of similar length (module doc)."""
        dataset = self.task.datasets[split]
        world, rank = self._world_rank()
        lengths = [source_length(dataset[i]) for i in range(len(dataset))] if by_length else None
        sampler = EvalBatchSampler(dataset, batch_size=self.eval_batch, lengths=lengths, num_replicas=world,
                                   rank=rank)
        return token_batch_loader(dataset, self.task.collate, sampler, num_workers=self.num_workers,
                                  pin_memory=self.pin_memory)

    def test_loader(self, split: str) -> DataLoader:
        return self.eval_loader(split, by_length=self.task.kind == "seq2seq")

    def _loader(self, split: str, *, train: bool) -> DataLoader:
        if train and self.micro_tokens:
            world = self.trainer.world_size if self.trainer is not None else 1
            rank = self.trainer.global_rank if self.trainer is not None else 0
            return token_batch_loader(self.task.datasets[split], self.task.collate,
                                      self.token_sampler(split, world=world, rank=rank), num_workers=self.num_workers,
                                      pin_memory=self.pin_memory)
        return DataLoader(
            self.task.datasets[split],
            batch_size=self.micro_batch if train else self.eval_batch,
            shuffle=train,
            drop_last=False,
            collate_fn=self.task.collate,
            **loader_options(self.num_workers, self.pin_memory),
        )

    def train_dataloader(self):
        return self._loader("train", train=True)

    def val_dataloader(self):
        return self.eval_loader("val")  # split order: callbacks draw their fixed sample from the first batch

    def test_dataloader(self):
        return [self.test_loader(split) for split in self.task.eval_splits.values()]
