"""Word-level language modelling on a local text corpus (WikiText-2, PTB) or its hub copy.

The corpus files are already tokenized with rare words as ``<unk>``; the tokenizer is a word-level HF
``tokenizers`` model trained on the training split, and one ``<eos>`` closes every line (the standard
WikiText/PTB counting). The stream is cut into non-overlapping blocks of ``block_len`` targets; evaluation
uses the same blocks (no sliding-window context), so perplexity is per word-level token, natural log,
without extra context at block starts.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from torch.utils.data import Dataset

from attnlab.tasks.base import DataError, TaskData, register_task_family
from attnlab.tasks.batching import LMCollate
from attnlab.tasks.sources import find_file, load_hub_dataset, read_lines, resolve_data_root
from attnlab.tasks.vocab import SPECIALS

EOS_WORD = "<eos>"


class BlockDataset(Dataset):
    """Contiguous blocks of ``block_len + 1`` ids (input and shifted target), stride ``block_len``."""

    def __init__(self, stream: torch.Tensor, block_len: int) -> None:
        self.stream, self.block_len = stream, block_len
        self.count = max(0, (len(stream) - 1) // block_len)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        start = i * self.block_len
        return self.stream[start : start + self.block_len + 1].tolist()


def _split_lines(cfg: dict[str, Any]) -> dict[str, list[str]]:
    if cfg["source"] == "hub":
        ds = load_hub_dataset(cfg["hub_id"], cfg.get("hub_config"),
                              local_hint=f"use task.source=local with paths.data_root holding {cfg['files']['train']}")
        names = {"train": "train", "val": "validation", "test": "test"}
        field = cfg.get("hub_text_field", "text")
        return {split: [row[field].rstrip("\n") for row in ds[hub_split]] for split, hub_split in names.items()}
    if cfg["source"] != "local":
        raise DataError(f"task.source={cfg['source']!r}; valid: local, hub")
    root = resolve_data_root(cfg["data_root"])
    return {split: read_lines(find_file(root, rel)) for split, rel in cfg["files"].items()}


def train_word_tokenizer(lines: list[str]) -> Tokenizer:
    """Word-level tokenizer over every training word, specials first, then by frequency.

    The vocabulary is counted here rather than by ``WordLevelTrainer``: the trainer gives a corpus word
    equal to a special token (WikiText's own ``<unk>``) a second id, so the special id would never occur.
    """
    counts = Counter(word for line in lines for word in line.split())
    vocab = {token: i for i, token in enumerate((*SPECIALS, EOS_WORD))}
    for word, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


@register_task_family("text_lm")
def load_text_lm(cfg: dict[str, Any], seed: int) -> TaskData:
    lines = _split_lines(cfg)
    if not lines.get("train"):
        raise DataError("the language-modelling training split is empty; check task.files.train")
    tok = train_word_tokenizer(lines["train"])
    eos = tok.token_to_id(EOS_WORD)
    pad = tok.token_to_id(SPECIALS[0])
    datasets = {}
    for split, split_lines in lines.items():
        ids: list[int] = []
        for enc in tok.encode_batch(split_lines):
            ids.extend(enc.ids)
            ids.append(eos)
        limit = cfg.get(f"max_{split}_tokens")
        if limit:
            ids = ids[: int(limit) + 1]
        datasets[split] = BlockDataset(torch.tensor(ids, dtype=torch.long), cfg["block_len"])
    return TaskData(
        kind="lm",
        datasets=datasets,
        collate=LMCollate(pad),
        vocab_size=tok.get_vocab_size(),
        pad_id=pad,
        bos_id=tok.token_to_id(SPECIALS[1]),
        eos_id=eos,
        max_len=cfg["block_len"],
        metric_flavours={
            "ppl": "perplexity per word-level token incl. <eos>, exp of mean natural-log NLL, "
            f"non-overlapping blocks of {cfg['block_len']}",
        },
        train_lengths=[cfg["block_len"]] * 10,
        detokenize=lambda ids: tok.decode(ids),
        description=f"{cfg['name']} ({cfg['source']}), word-level vocabulary of {tok.get_vocab_size()}",
    )
