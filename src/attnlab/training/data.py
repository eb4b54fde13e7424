"""A LightningDataModule over a task's plain datasets."""

from __future__ import annotations

import lightning as L
from torch.utils.data import DataLoader

from attnlab.tasks import TaskData


class TaskDataModule(L.LightningDataModule):
    def __init__(self, task: TaskData, *, micro_batch: int, eval_batch: int, num_workers: int = 0,
                 shuffle_seed: int = 0) -> None:
        super().__init__()
        self.task, self.micro_batch, self.eval_batch = task, micro_batch, eval_batch
        self.num_workers, self.shuffle_seed = num_workers, shuffle_seed

    def _loader(self, split: str, *, train: bool) -> DataLoader:
        return DataLoader(
            self.task.datasets[split],
            batch_size=self.micro_batch if train else self.eval_batch,
            shuffle=train,
            drop_last=False,
            collate_fn=self.task.collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self):
        return self._loader("train", train=True)

    def val_dataloader(self):
        return self._loader("val", train=False)

    def test_dataloader(self):
        return [self._loader(split, train=False) for split in self.task.eval_splits.values()]
