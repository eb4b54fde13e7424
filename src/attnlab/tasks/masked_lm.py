"""Masked language modelling (BERT, Devlin et al. 2019) on a local text corpus (WikiText-2, PTB).

Data: the corpus is read and tokenized as the causal LM task does (``tasks/text_lm.py``: word level by
default, ``tokenizer.kind: bpe`` for subwords; one end-of-line token per line), plus one ``<mask>`` token,
and the token stream is cut into non-overlapping blocks of ``block_len`` tokens (the sequence length the
model sees; the tokens after the last whole block are left out and counted in ``metric_flavours``).

Masking, as BERT's ``create_masked_lm_predictions`` (google-research/bert ``create_pretraining_data.py``):
of a block of n tokens, exactly ``max(1, round(n * mask_prob))`` positions are chosen at random (15%), and
each chosen position is replaced by ``<mask>`` with probability 0.8, by a random token with probability 0.1
(drawn uniformly from the token types of the training stream) and kept with probability 0.1. Only the
chosen positions are scored, in training and evaluation. A training block is laid out ``masks_per_block``
times, each copy with its own mask drawn from (seed, index) (RoBERTa's static masking duplicated 10 times,
deterministic, so resumed runs see the same examples); evaluation blocks are masked once from ``eval_seed``,
the same for every run and row, so all rows of a table are scored on the same masked positions. Rows of
different block lengths (BigBird Table 10) set ``eval_masking: stream`` (one mask drawn over the whole split)
and ``eval_tokens_multiple`` (every evaluation stream cut to a multiple of the longest block): then every row
scores the same tokens of the same text, replaced the same way, and the rows' difference is a paired one.

Metrics (``training.modules.MaskedLMModule``), over the masked positions only:
- ``mlm_acc``: fraction of masked positions whose arg-max prediction is the original token.
- ``bpc``: bits per character = total masked-token NLL in bits / number of characters those tokens cover.
  A token covers the characters from the end of the previous token up to its own end in its line (so a
  word also covers the space before it), and the end-of-line token covers the rest of the line and the
  newline: the tokens of a file partition its characters, and scoring every token would give the
  ordinary bits per character of the (tokenized) file.
- ``bits_per_token``: total masked-token NLL in bits / masked tokens. This is what RoBERTa, Longformer and
  BigBird (Table 10) print as "BPC": Longformer's released pre-training code (allenai/longformer
  ``scripts/convert_model_to_long.ipynb``, ``pretrain_and_evaluate``) logs ``eval_loss / math.log(2)``,
  the mean MLM loss over masked subword tokens in bits, as "bpc".
- ``loss``: mean masked-token NLL in nats.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.registry import register_task_family
from attnlab.tasks.text_lm import _first_words, _split_lines, lm_token_ids, lm_tokenizer

MASK = "<mask>"

log = logging.getLogger("attnlab")


def bert_mask(ids: np.ndarray, rng: np.random.Generator, *, mask_prob: float, mask_id: int,
              random_ids: np.ndarray, mask_ratio: float = 0.8, random_ratio: float = 0.1,
              ) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, chosen) for one block: BERT's masking of ``ids`` (see the module docstring).

    ``chosen`` is a bool array of the scored positions; ``inputs`` has ``mask_id`` at about ``mask_ratio``
    of them, a token from ``random_ids`` at about ``random_ratio`` and the original elsewhere.
    """
    n = len(ids)
    count = min(max(1, int(round(n * mask_prob))), n)
    positions = rng.choice(n, size=count, replace=False)
    draw = rng.random(count)
    inputs = ids.copy()
    inputs[positions[draw < mask_ratio]] = mask_id
    replaced = positions[(draw >= mask_ratio) & (draw < mask_ratio + random_ratio)]
    inputs[replaced] = rng.choice(random_ids, size=len(replaced))
    chosen = np.zeros(n, dtype=bool)
    chosen[positions] = True
    return inputs, chosen


def covered_characters(line: str, offsets: list[tuple[int, int]]) -> list[int]:
    """Characters each token of ``line`` covers, then the end-of-line token's: token i covers from the end
    of token i-1 (the line start for i = 0) to its own end; the end-of-line token covers the rest of the line
    and the newline. The counts sum to ``len(line) + 1``."""
    counts, previous = [], 0
    for _, end in offsets:
        end = min(max(end, previous), len(line))
        counts.append(end - previous)
        previous = end
    counts.append(len(line) - previous + 1)
    return counts


class MaskedBlockDataset(Dataset):
    """Blocks of ``block_len`` tokens, masked on access: index i is block ``i % blocks`` with the mask drawn
    from (seed, i), so ``copies`` laps over the blocks give each block ``copies`` different masks.

    With ``stream_mask`` (evaluation, ``task.eval_masking=stream``) the mask is drawn once over the whole token
    stream from ``seed`` and each block is its slice: which tokens are scored, and what replaces them, then
    depends on the text alone, not on the block length, so rows of different lengths are scored on the same
    tokens (a paired comparison)."""

    def __init__(self, stream: np.ndarray, chars: np.ndarray, block_len: int, *, copies: int, seed: int,
                 mask_prob: float, mask_id: int, random_ids: np.ndarray, stream_mask: bool = False) -> None:
        self.stream, self.chars, self.block_len = stream, chars, block_len
        self.blocks = len(stream) // block_len
        self.unused_tokens = len(stream) - self.blocks * block_len
        self.copies, self.seed, self.mask_prob = copies, seed, mask_prob
        self.mask_id, self.random_ids = mask_id, random_ids
        self.stream_mask = None
        if stream_mask:
            if copies != 1:
                raise ValueError("a stream mask is one mask per token: copies must be 1")
            self.stream_mask = bert_mask(stream, np.random.default_rng([seed]), mask_prob=mask_prob,
                                         mask_id=mask_id, random_ids=random_ids)

    def __len__(self) -> int:
        return self.blocks * self.copies

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"example {i} out of range for {len(self)}")  # ends plain iteration
        i %= len(self)
        start = (i % self.blocks) * self.block_len
        target = self.stream[start : start + self.block_len]
        if self.stream_mask is not None:
            inputs, chosen = (a[start : start + self.block_len] for a in self.stream_mask)
        else:
            inputs, chosen = bert_mask(target, np.random.default_rng([self.seed, i]), mask_prob=self.mask_prob,
                                       mask_id=self.mask_id, random_ids=self.random_ids)
        return {"ids": torch.from_numpy(inputs.astype(np.int64)),
                "target": torch.from_numpy(target.astype(np.int64)),
                "scored": torch.from_numpy(chosen),
                "chars": torch.from_numpy(self.chars[start : start + self.block_len].astype(np.int64))}


def collate_blocks(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Blocks all have ``block_len`` tokens: stacked, no padding."""
    return {key: torch.stack([b[key] for b in batch]) for key in batch[0]}


@register_task_family("masked_lm")
def load_masked_lm(cfg: dict[str, Any], seed: int) -> TaskData:
    lines = _split_lines(cfg)
    if not lines.get("train"):
        raise DataError("the masked-LM training split is empty; check task.files.train")
    if not 0.0 < float(cfg["mask_prob"]) < 1.0:
        raise DataError(f"task.mask_prob={cfg['mask_prob']} must lie strictly between 0 and 1 (BERT: 0.15)")
    if int(cfg["masks_per_block"]) < 1:
        raise DataError(f"task.masks_per_block={cfg['masks_per_block']} must be >= 1")
    masking = cfg.get("eval_masking", "block")
    if masking not in ("block", "stream"):
        raise DataError(f"task.eval_masking={masking!r}; valid: block (BERT: each block its own mask), stream (one "
                        "mask over the split, the same tokens for every block length)")
    multiple = cfg.get("eval_tokens_multiple")
    if multiple is not None and (isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1):
        raise DataError(f"task.eval_tokens_multiple={multiple!r} must be a whole number of tokens >= 1, or null")
    tok, eos, unit = lm_tokenizer(cfg, lines["train"])
    tok.add_special_tokens([MASK])
    mask_id = tok.token_to_id(MASK)
    block_len = int(cfg["block_len"])
    streams, notes = {}, []
    for split, split_lines in lines.items():
        limit = cfg.get(f"max_{split}_tokens")
        if limit:
            split_lines = _first_words(split_lines, int(limit))
        ids: list[int] = []
        chars: list[int] = []
        for line, enc in zip(split_lines, tok.encode_batch(split_lines)):
            ids.extend(enc.ids)
            ids.append(eos)
            chars.extend(covered_characters(line, enc.offsets))
        if limit:
            ids, chars = ids[: int(limit)], chars[: int(limit)]
        if multiple and split != "train":  # every block length that divides it scores the same stretch of text
            keep = len(ids) // int(multiple) * int(multiple)
            ids, chars = ids[:keep], chars[:keep]
        streams[split] = (np.asarray(ids, dtype=np.int64), np.asarray(chars, dtype=np.int64))
    random_ids = np.setdiff1d(np.unique(streams["train"][0]), [mask_id])
    datasets = {}
    for split, (ids, chars) in streams.items():
        train = split == "train"
        datasets[split] = MaskedBlockDataset(
            ids, chars, block_len, copies=int(cfg["masks_per_block"]) if train else 1,
            seed=int(seed if train else cfg["eval_seed"]), mask_prob=float(cfg["mask_prob"]), mask_id=mask_id,
            random_ids=random_ids, stream_mask=not train and masking == "stream")
        if datasets[split].blocks == 0:
            raise DataError(f"the {split} split has {len(ids)} tokens, fewer than one block of "
                            f"task.block_len={block_len}; shorten the blocks or raise max_{split}_tokens")
        notes.append(f"{split}: {datasets[split].blocks} blocks, {datasets[split].unused_tokens} of {len(ids)} "
                     f"tokens after the last whole block unused")
        log.info("%s: %s", cfg["name"], notes[-1])
    flavours = {
        "mlm_acc": f"masked-token accuracy (arg-max = original {unit}) over the {cfg['mask_prob']:.0%} masked "
                   f"positions (BERT 80/10/10 <mask>/random/kept), blocks of {block_len}, evaluation masks "
                   f"from eval_seed={cfg['eval_seed']}"
                   + (", drawn once over each evaluation split's token stream (the same scored tokens for every "
                      "block length)" if masking == "stream" else "")
                   + (f", evaluation streams cut to a multiple of {multiple} tokens" if multiple else ""),
        "bpc": "bits per character: total masked-token NLL in bits / characters those tokens cover (a token "
               "covers the text since the previous token's end, the line end covers the newline), characters "
               "of the tokenized corpus file",
        "bits_per_token": f"mean masked-token NLL in bits per {unit}: what RoBERTa/Longformer/BigBird print "
                          f"as 'BPC' (Longformer's pretrain_and_evaluate: eval_loss / log 2)",
        "mlm_acc_shuffled": "mlm_acc on the same test blocks with each block's tokens in a random order (inputs, "
                            "targets and masks moved together): what a model that ignores word order scores in "
                            "order too",
        "mlm_acc_from_order": "mlm_acc - mlm_acc_shuffled: what the row gets from word order (about 0 for a "
                              "model that has learned only which words occur in a block)",
        "truncation": "; ".join(notes),
    }
    return TaskData(
        kind="mlm",
        datasets=datasets,
        collate=collate_blocks,
        **lm_token_ids(tok, eos),
        max_len=block_len,
        metric_flavours=flavours,
        train_lengths=[block_len] * 10,
        detokenize=lambda ids: tok.decode(ids),
        description=f"masked LM on {cfg['name']} ({unit} vocabulary of {tok.get_vocab_size()}), blocks of {block_len}",
    )
