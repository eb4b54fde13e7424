"""LAMBADA (Paperno et al. 2016; UT Table 3): predict the last word of a passage, language-modelling setting.

The LAMBADA training corpus (2662 novels) is not local, so the LM is trained on the corpus named by
``lm_files`` (WikiText-2 by default: a different domain, said in metric_flavours and the description). Text is
lower-cased and BPE-tokenized (the LAMBADA plain-text release is lower-cased and tokenized), so target words
are never <unk>. Evaluation passages (dev 4869, test 5153; the original plain-text release) keep their last
``block_len + 1`` tokens; the last whitespace word's tokens are the scored positions. Reported per split:
``last_word_acc`` (every subword of the last word is the argmax given the true prefix, in %),
``last_word_ppl`` (exp of the last word's total NLL per passage: per-word perplexity of the target word) and
``ppl`` over all passage subwords.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.utils.data import Dataset

from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.batching import LMCollate
from attnlab.tasks.registry import register_task_family
from attnlab.tasks.sources import find_file, read_lines, resolve_data_root
from attnlab.tasks.text_lm import BlockDataset, _first_words, lm_token_ids
from attnlab.tasks.tokenization import build_tokenizer
from attnlab.tasks.vocab import SPECIALS

log = logging.getLogger("attnlab")


class PassageDataset(Dataset):
    """One passage per item: ``{"ids": [...], "mask": [...]}`` with mask 1 on the last word's tokens."""

    def __init__(self, items: list[dict[str, list[int]]]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


def passage_item(tok, passage: str, block_len: int, eos: int) -> dict[str, list[int]]:
    text = passage.strip()
    cut = text.rfind(" ")
    if cut < 0:
        raise DataError("a LAMBADA passage has a single word; nothing to predict from")
    enc = tok.encode(text)
    ids = [eos, *enc.ids]  # the line-end token opens every passage, as after a corpus line
    mask = [0] + [int(b > cut + 1) for _, b in enc.offsets]  # a Metaspace piece's span includes its space
    if not any(mask):
        raise DataError(f"the last word of a LAMBADA passage produced no tokens: {text[-40:]!r}")
    ids, mask = ids[-(block_len + 1):], mask[-(block_len + 1):]
    return {"ids": ids, "mask": mask, "cut": len(enc.ids) + 1 > block_len + 1}


@register_task_family("lambada")
def load_lambada(cfg: dict[str, Any], seed: int) -> TaskData:
    root = resolve_data_root(cfg["data_root"])
    corpus = {split: read_lines(find_file(root, rel)) for split, rel in cfg["lm_files"].items()}
    if not corpus.get("train"):
        raise DataError("task.lm_files.train is empty: LAMBADA needs an LM training corpus")
    limit = cfg.get("max_train_tokens")
    if limit:
        corpus["train"] = _first_words(corpus["train"], int(limit))
    t = cfg["tokenizer"]
    tok = build_tokenizer("bpe", corpus["train"], vocab_size=int(t.get("vocab_size", 8000)), lowercase=True,
                          min_frequency=int(t.get("min_frequency", 2)), cache_dir=cfg.get("tokenizer_cache"))
    eos = tok.token_to_id(SPECIALS[2])
    block = int(cfg["block_len"])
    datasets: dict[str, Dataset] = {}
    for split, lines in corpus.items():
        ids: list[int] = []
        for enc in tok.encode_batch(lines):
            ids.extend(enc.ids)
            ids.append(eos)
        if limit and split == "train":
            ids = ids[: int(limit) + 1]
        datasets[split] = BlockDataset(torch.tensor(ids, dtype=torch.long), block)
    eval_splits = {}
    cuts = [f"LM corpus {split} {datasets[split].unused_targets} targets after the last whole block unused"
            for split in corpus]
    for prefix, rel in cfg["eval_files"].items():
        passages = [p for p in read_lines(find_file(root, rel)) if p.strip()]
        if cfg.get("max_eval_passages"):
            passages = passages[: int(cfg["max_eval_passages"])]
        if not passages:
            raise DataError(f"{rel}: no passages")
        items = [passage_item(tok, p, block, eos) for p in passages]
        cut = sum(item.pop("cut") for item in items)
        cuts.append(f"{prefix} {cut} of {len(items)} passages")
        if cut:
            log.warning("LAMBADA %s: %d of %d passages cut to their last %d tokens", prefix, cut, len(items), block)
        datasets[prefix] = PassageDataset(items)
        eval_splits[prefix] = prefix
    corpus_name = cfg.get("lm_corpus_name", "the configured corpus")
    return TaskData(
        kind="lm",
        datasets=datasets,
        collate=LMCollate(tok.token_to_id(SPECIALS[0])),
        **lm_token_ids(tok, eos),
        max_len=block,
        eval_splits=eval_splits,
        metric_flavours={
            "last_word_acc": "% of passages whose every last-word subword is the argmax given the true prefix "
                             "(greedy, teacher-forced)",
            "last_word_ppl": "exp(total NLL of the last word's subwords / passages): per-word perplexity of the "
                             "target word, natural log",
            "ppl": "per-subword perplexity over every passage token (val: over the LM corpus blocks)",
            "lm_corpus": f"LM trained on {corpus_name}, NOT the LAMBADA novels (not local); lower-cased BPE "
                         f"{tok.get_vocab_size()}; contexts cut to the last {block} tokens",
            "truncation": f"passage contexts cut to their last {block} tokens (the target word always kept): "
                          + ", ".join(cuts),
        },
        train_lengths=[block] * 10,
        detokenize=lambda ids: tok.decode(ids),
        description=f"LAMBADA, LM trained on {corpus_name}; "
                    + ", ".join(f"{k} {len(v)}" for k, v in datasets.items()),
    )
