"""Data order that continues exactly where a killed run stopped (the CSV logs that do: ``resumable_csv.py``).

The training order is a function of (seed, epoch) only, and the data module's state in a checkpoint
says how many batches of the current epoch were consumed; a resumed run skips exactly those. Loaders
carry their own generators so that creating one never advances the global RNG (which drives dropout).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

from attnlab.training.data import TaskDataModule, TokenBudgetSampler, loader_options, token_batch_loader


class ResumableSampler(DistributedSampler):
    """A shuffled order seeded by (seed, epoch), sharded over ranks, that can start part-way into an epoch.

    Being a ``DistributedSampler`` keeps Lightning from replacing it under DDP.
    """

    def __init__(self, dataset, *, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=False)
        self.skip = 0  # indices of this rank to leave out at the start of the next iteration

    def __iter__(self):
        indices = list(super().__iter__())
        skip, self.skip = self.skip, 0
        return iter(indices[skip:])


class ResumableDataModule(TaskDataModule):
    """``TaskDataModule`` whose train order and position are part of the checkpoint."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sampler: ResumableSampler | TokenBudgetSampler | None = None
        self._to_load: dict[str, int] | None = None

    def _loader(self, split: str, *, train: bool) -> DataLoader:
        generator = torch.Generator().manual_seed(self.shuffle_seed)
        sampler = None
        if train:
            world = self.trainer.world_size if self.trainer is not None else 1
            rank = self.trainer.global_rank if self.trainer is not None else 0
            if self.micro_tokens:
                sampler = self.sampler = self.token_sampler(split, world=world, rank=rank)
            else:
                sampler = self.sampler = ResumableSampler(self.task.datasets[split], num_replicas=world, rank=rank,
                                                          seed=self.shuffle_seed)
            if self._to_load is not None:
                self._apply(self._to_load)
                self._to_load = None
            if self.micro_tokens:
                return token_batch_loader(self.task.datasets[split], self.task.collate, sampler,
                                          num_workers=self.num_workers, pin_memory=self.pin_memory,
                                          generator=generator)
        return DataLoader(
            self.task.datasets[split],
            batch_size=self.micro_batch if train else self.eval_batch,
            shuffle=False,
            sampler=sampler,
            drop_last=False,
            collate_fn=self.task.collate,
            generator=generator,
            **loader_options(self.num_workers, self.pin_memory),
        )

    def state_dict(self) -> dict[str, Any]:
        if self.sampler is None or self.trainer is None:
            return {}
        # Batches whose training step has run in this epoch (saves happen after the step, see LastCheckpoint).
        done = self.trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return {"epoch": int(self.sampler.epoch), "batches_done": int(done), "micro_batch": int(self.micro_batch)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if self.sampler is None:
            self._to_load = dict(state_dict)  # applied when the train loader is built
        else:
            self._apply(state_dict)

    def _apply(self, state: dict[str, int]) -> None:
        sampler = self.sampler
        # A token-budget sampler counts in batches, a sentence sampler in examples.
        per_batch = 1 if self.micro_tokens else state.get("micro_batch", self.micro_batch)
        skip = state["batches_done"] * per_batch
        if skip >= sampler.num_samples:  # saved at the end of an epoch: the next one starts fresh
            sampler.set_epoch(state["epoch"] + 1)
            sampler.skip = 0
        else:
            sampler.set_epoch(state["epoch"])
            sampler.skip = skip
