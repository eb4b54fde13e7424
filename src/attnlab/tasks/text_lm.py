"""Language modelling on a local text corpus (WikiText-2, PTB) or a hub corpus (WikiText-103, LM1B).

Default (``tokenizer.kind: word``): the corpus files are already tokenized with rare words as ``<unk>``; the
tokenizer is a word-level HF ``tokenizers`` model trained on the training split, and one ``<eos>`` closes
every line (the standard WikiText/PTB counting). With ``tokenizer.kind: bpe`` a BPE vocabulary is trained
instead; ``ppl`` is then per subword and ``word_ppl`` = exp(total NLL / words) is reported too, where words
are the whitespace words plus one per line end (the same count as word-level ``ppl``, so the two compare).
The stream is cut into non-overlapping blocks of ``block_len`` targets; evaluation uses the same blocks (no
sliding-window context), natural log, without extra context at block starts.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from torch.utils.data import Dataset

from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.batching import LMCollate
from attnlab.tasks.registry import register_task_family
from attnlab.tasks.sources import find_file, load_hub_dataset, read_lines, resolve_data_root
from attnlab.tasks.tokenization import build_tokenizer
from attnlab.tasks.vocab import SPECIALS

EOS_WORD = "<eos>"

log = logging.getLogger("attnlab")


class BlockDataset(Dataset):
    """Contiguous blocks of ``block_len + 1`` ids (input and shifted target), stride ``block_len``."""

    def __init__(self, stream: torch.Tensor, block_len: int, flags: torch.Tensor | None = None) -> None:
        self.stream, self.block_len, self.flags = stream, block_len, flags
        self.count = max(0, (len(stream) - 1) // block_len)
        # targets after the last whole block: never trained on or scored (counted in the run record)
        self.unused_targets = max(0, len(stream) - 1) - self.count * block_len

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        if not -self.count <= i < self.count:
            raise IndexError(f"block {i} out of range for {self.count} blocks")  # ends plain iteration
        start = (i % self.count) * self.block_len
        ids = self.stream[start : start + self.block_len + 1].tolist()
        if self.flags is None:
            return ids
        return ids, self.flags[start : start + self.block_len + 1].tolist()


def _split_lines(cfg: dict[str, Any]) -> dict[str, list[str]]:
    if cfg["source"] == "hub":
        ds = load_hub_dataset(cfg["hub_id"], cfg.get("hub_config"),
                              local_hint="the local alternative is task=lm/wikitext2 or task=lm/ptb "
                                         "(or task.source=local with task.files under paths.data_root)")
        names = cfg.get("hub_splits") or {"train": "train", "val": "validation", "test": "test"}
        field = cfg.get("hub_text_field", "text")
        missing = [s for s in names.values() if s not in ds]
        if missing:
            raise DataError(f"hub dataset {cfg['hub_id']} has no split {missing[0]!r}; it has: {', '.join(ds)}")
        return {split: [row[field].rstrip("\n") for row in ds[hub_split]] for split, hub_split in names.items()}
    if cfg["source"] != "local":
        raise DataError(f"task.source={cfg['source']!r}; valid: local, hub")
    root = resolve_data_root(cfg["data_root"])
    return {split: read_lines(find_file(root, rel, hub_override="task.source=hub"))
            for split, rel in cfg["files"].items()}


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


def lm_tokenizer(cfg: dict[str, Any], train_lines: list[str]) -> tuple[Tokenizer, int, str]:
    """(tokenizer, end-of-line id, token unit) of ``task.tokenizer``: the corpus' own words (``word``, the
    default) or a BPE vocabulary learned on the (capped) training text (``bpe``)."""
    t = cfg.get("tokenizer") or {"kind": "word"}
    kind = t.get("kind", "word")
    if kind == "word":
        tok = train_word_tokenizer(train_lines)
        return tok, tok.token_to_id(EOS_WORD), "word-level token"
    if kind == "bpe":
        limit = cfg.get("max_train_tokens")  # BPE learns from the text that is trained on (and trains faster)
        bpe_text = _first_words(train_lines, int(limit)) if limit else train_lines
        tok = build_tokenizer("bpe", bpe_text, vocab_size=int(t.get("vocab_size", 8000)),
                              lowercase=bool(t.get("lowercase", False)), min_frequency=int(t.get("min_frequency", 2)),
                              cache_dir=cfg.get("tokenizer_cache"))
        return tok, tok.token_to_id(SPECIALS[2]), "BPE subword"
    raise DataError(f"task.tokenizer.kind={kind!r}; valid: word, bpe")


def lm_token_ids(tok: Tokenizer, eos: int) -> dict[str, int]:
    """``TaskData``'s vocabulary fields of a language model over ``tok``: its size, the shared ``<pad>`` and
    ``<s>`` ids, and ``eos``, the id that closes each corpus line (a word-level corpus has its own)."""
    return {
        "vocab_size": tok.get_vocab_size(),
        "pad_id": tok.token_to_id(SPECIALS[0]),
        "bos_id": tok.token_to_id(SPECIALS[1]),
        "eos_id": eos,
    }


@register_task_family("text_lm")
def load_text_lm(cfg: dict[str, Any], seed: int) -> TaskData:
    lines = _split_lines(cfg)
    if not lines.get("train"):
        raise DataError("the language-modelling training split is empty; check task.files.train")
    tok, eos, unit = lm_tokenizer(cfg, lines["train"])
    kind = (cfg.get("tokenizer") or {}).get("kind", "word")
    pad = tok.token_to_id(SPECIALS[0])
    datasets, cuts = {}, []
    for split, split_lines in lines.items():
        # Subword evaluation splits also mark the token that opens each whitespace word (and each line end),
        # so word-level perplexity divides by exactly the word-level token count.
        mark = kind == "bpe" and split != "train"
        limit = cfg.get(f"max_{split}_tokens")
        if limit:  # encode only the leading lines that hold the capped stream (same ids, less work)
            split_lines = _first_words(split_lines, int(limit))
        ids: list[int] = []
        flags: list[int] = []
        for line, enc in zip(split_lines, tok.encode_batch(split_lines)):
            ids.extend(enc.ids)
            ids.append(eos)
            if mark:
                flags.extend(_word_start_flags(line, enc.offsets))
                flags.append(1)
        if limit:
            ids, flags = ids[: int(limit) + 1], flags[: int(limit) + 1]
        stream = torch.tensor(ids, dtype=torch.long)
        datasets[split] = BlockDataset(stream, cfg["block_len"], torch.tensor(flags) if mark else None)
        cut = f"{split}: " + (f"capped at max_{split}_tokens={limit} (its first {len(ids)} tokens), " if limit else "")
        cuts.append(cut + f"{datasets[split].unused_targets} of {max(0, len(ids) - 1)} targets after the last "
                          f"whole block unused")
        log.info("%s: %s", cfg["name"], cuts[-1])
    flavours = {
        "ppl": f"perplexity per {unit} incl. the line end, exp of mean natural-log NLL, "
        f"non-overlapping blocks of {cfg['block_len']}" + (" (word-level ppl)" if kind == "word" else ""),
    }
    flavours["truncation"] = f"non-overlapping blocks of {cfg['block_len']} targets; " + "; ".join(cuts)
    if kind == "bpe":
        flavours["word_ppl"] = ("word-level perplexity: exp(total NLL of the subwords / words), words = "
                                "whitespace words + one per line end; comparable with word-level ppl")
    if cfg.get("stand_in"):
        flavours["data"] = f"STAND-IN: {cfg['stand_in']}"
    return TaskData(
        kind="lm",
        datasets=datasets,
        collate=LMCollate(pad),
        **lm_token_ids(tok, eos),
        max_len=cfg["block_len"],
        metric_flavours=flavours,
        train_lengths=[cfg["block_len"]] * 10,
        detokenize=lambda ids: tok.decode(ids),
        description=f"{cfg['name']} ({cfg['source']}), {kind} vocabulary of {tok.get_vocab_size()}"
        + (f"; STAND-IN: {cfg['stand_in']}" if cfg.get("stand_in") else ""),
    )


def _word_start_flags(line: str, offsets: list[tuple[int, int]]) -> list[int]:
    """1 for the token whose character span holds the first character of a whitespace word, else 0."""
    starts = {m.start() for m in re.finditer(r"\S+", line)}
    return [int(any(p in starts for p in range(a, b))) for a, b in offsets]


def _first_words(lines: list[str], limit: int) -> list[str]:
    """The leading lines holding about ``limit`` words (a cap that keeps whole lines)."""
    out, total = [], 0
    for line in lines:
        if total > limit:
            break
        out.append(line)
        total += len(line.split()) + 1
    return out
