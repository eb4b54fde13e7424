"""A small fixed vocabulary for generated tasks (characters / symbols), with the special ids every task shares."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch.utils.data import Dataset

from attnlab.tasks.base import TaskData
from attnlab.tasks.batching import IndexedSeq2SeqCollate

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)


class Vocab:
    """Symbol <-> id map with ``<pad>=0, <s>=1, </s>=2, <unk>=3``."""

    def __init__(self, symbols: Iterable[str]) -> None:
        self.itos: list[str] = list(SPECIALS)
        for s in symbols:
            if s not in self.itos:
                self.itos.append(s)
        self.stoi = {s: i for i, s in enumerate(self.itos)}

    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, symbols: Sequence[str]) -> list[int]:
        return [self.stoi.get(s, self.unk_id) for s in symbols]

    def decode(self, ids: Sequence[int], *, strip: bool = True) -> list[str]:
        out = []
        for i in ids:
            if strip and i == self.eos_id:
                break
            if strip and i in (self.pad_id, self.bos_id):
                continue
            out.append(self.itos[i] if 0 <= i < len(self.itos) else UNK)
        return out


def symbol_seq2seq_task(vocab: Vocab, datasets: dict[str, Dataset], **fields: Any):
    """``TaskData`` of a sequence-to-sequence task whose source and target share one symbol vocabulary
    (generated character/digit tasks): the collate, vocabulary sizes and special ids all come from it."""
    return TaskData(
        kind="seq2seq",
        datasets=datasets,
        collate=IndexedSeq2SeqCollate(vocab.pad_id, vocab.bos_id, vocab.eos_id),
        vocab_size=len(vocab),
        src_vocab_size=len(vocab),
        pad_id=vocab.pad_id,
        bos_id=vocab.bos_id,
        eos_id=vocab.eos_id,
        **fields,
    )
