"""Datasets of token-id sequences and their collate functions (right padding, BOS/EOS framing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from attnlab.tasks.base import TaskData


class PairDataset(Dataset):
    """(source ids, target ids) pairs for sequence-to-sequence tasks; items are (source, target, index) so
    decoded outputs can be put back in split order (``IndexedSeq2SeqCollate``)."""

    def __init__(self, pairs: Sequence[tuple[list[int], list[int]]]) -> None:
        self.pairs = list(pairs)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int):
        return (*self.pairs[i], i)


class LabelledDataset(Dataset):
    """(ids, label) examples for classification."""

    def __init__(self, examples: Sequence[tuple[list[int], int]]) -> None:
        self.examples = list(examples)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int):
        return self.examples[i]


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


class Seq2SeqCollate:
    """src padded; tgt_in = <s> + target; tgt_out = target + </s> (teacher forcing)."""

    def __init__(self, pad_id: int, bos_id: int, eos_id: int, *, src_eos: bool = True) -> None:
        self.pad_id, self.bos_id, self.eos_id, self.src_eos = pad_id, bos_id, eos_id, src_eos

    def __call__(self, batch):
        src = [list(s) + ([self.eos_id] if self.src_eos else []) for s, _ in batch]
        tgt = [list(t) for _, t in batch]
        return {
            "src": pad_batch(src, self.pad_id),
            "tgt_in": pad_batch([[self.bos_id, *t] for t in tgt], self.pad_id),
            "tgt_out": pad_batch([[*t, self.eos_id] for t in tgt], self.pad_id),
        }


class ClassificationCollate:
    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, batch):
        return {
            "ids": pad_batch([ids for ids, _ in batch], self.pad_id),
            "label": torch.tensor([label for _, label in batch]),
        }


class LMCollate:
    """Blocks of a token stream: input = block[:-1], target = block[1:]."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, batch):
        if batch and isinstance(batch[0], dict):  # scored positions only (LAMBADA's last word)
            ids = pad_batch([b["ids"] for b in batch], self.pad_id)
            mask = pad_batch([b["mask"] for b in batch], 0).bool()
            return {"ids": ids[:, :-1], "target": ids[:, 1:], "target_mask": mask[:, 1:]}
        if batch and isinstance(batch[0], tuple):  # (ids, word-start flags): subword LM
            ids = pad_batch([b[0] for b in batch], self.pad_id)
            starts = pad_batch([b[1] for b in batch], 0).bool()
            return {"ids": ids[:, :-1], "target": ids[:, 1:], "word_starts": starts[:, 1:]}
        ids = pad_batch(batch, self.pad_id)
        return {"ids": ids[:, :-1], "target": ids[:, 1:]}


class IndexedDataset(Dataset):
    """Examples with their position in the split appended, so scores can look up raw references."""

    def __init__(self, examples: Sequence[tuple]) -> None:
        self.examples = list(examples)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int):
        return (*self.examples[i], i)


class IndexedSeq2SeqCollate(Seq2SeqCollate):
    """``Seq2SeqCollate`` over (src, tgt, index) triples; adds ``ref_index``."""

    def __call__(self, batch):
        out = super().__call__([(s, t) for s, t, _ in batch])
        out["ref_index"] = torch.tensor([i for _, _, i in batch], dtype=torch.long)
        return out


class IndexedClassificationCollate:
    """(ids, label, index) triples -> ids, label (long, or float for regression) and ``ref_index``."""

    def __init__(self, pad_id: int, *, regression: bool = False) -> None:
        self.pad_id, self.regression = pad_id, regression

    def __call__(self, batch):
        return {
            "ids": pad_batch([ids for ids, _, _ in batch], self.pad_id),
            "label": torch.tensor([label for _, label, _ in batch],
                                  dtype=torch.float32 if self.regression else torch.long),
            "ref_index": torch.tensor([i for _, _, i in batch], dtype=torch.long),
        }


def indexed_classification_task(
    labelled: dict[str, list[tuple[list[int], Any]]],
    *,
    vocab_size: int,
    num_classes: int,
    regression: bool = False,
    **fields: Any,
) -> TaskData:
    """``TaskData`` of a classifier (or a regressor) over ids padded with 0, whose scores look raw references up
    by example index: ``labelled`` holds each split's (ids, label) examples; max_len is one above the longest
    input of any split, train_lengths the training inputs' lengths."""
    return TaskData(
        kind="regression" if regression else "classification",
        datasets={split: IndexedDataset(examples) for split, examples in labelled.items()},
        collate=IndexedClassificationCollate(0, regression=regression),
        vocab_size=vocab_size,
        pad_id=0,
        max_len=max(len(ids) for examples in labelled.values() for ids, _ in examples) + 1,
        num_classes=num_classes,
        train_lengths=[len(ids) for ids, _ in labelled["train"]],
        **fields,
    )
