"""Machine translation (WMT14, IWSLT, Multi30k, TED pairs): parallel text from local files or the hub.

Each split (``train``, ``val``, ``test`` and any ``extra_tests``) is a spec: ``source: local`` with
``format: lines`` (two aligned files, .gz allowed) or ``format: sgm`` (WMT SGML / IWSLT XML ``<seg>``s), or
``source: hub`` with ``hub_id``/``hub_config``/``hub_split`` and a ``hub_schema`` (``translation``: WMT/IWSLT
rows ``{"translation": {lang: text}}``; ``flat``: ``{lang: text}`` as bentrevett/multi30k; ``ted_multi``:
neulab/ted_multi rows ``{"translations": {"language": [...], "translation": [...]}}``).

One joint BPE vocabulary is trained on both sides of the training text (the papers share source and target
embeddings). Test hypotheses are detokenized and scored against the split's raw reference strings with
sacreBLEU (signature in ``metric_flavours``), plus tokenized BLEU where the paper used multi-bleu.perl.
"""

from __future__ import annotations

import html
import logging
from dataclasses import dataclass
from typing import Any

from attnlab.decoding.options import DecodingOptions
from attnlab.metrics.text import bleu_signature, chrf_signature, corpus_bleu, corpus_chrf, tokenized_bleu
from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.batching import IndexedDataset, IndexedSeq2SeqCollate
from attnlab.tasks.registry import register_task_family
from attnlab.tasks.sources import find_file, load_hub_dataset, read_lines, read_segments, resolve_data_root
from attnlab.tasks.tokenization import UNK_ESCAPE, Detokenizer, build_tokenizer, encode_all
from attnlab.tasks.vocab import Vocab

log = logging.getLogger("attnlab")

SPEC_KEYS = {"source", "format", "src", "tgt", "unescape", "hub_id", "hub_config", "hub_split", "hub_schema", "note"}


def _check_spec(name: str, spec: dict[str, Any]) -> None:
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise DataError(f"task.{name}.{unknown[0]} is not a split setting; valid: {', '.join(sorted(SPEC_KEYS))}")
    if spec.get("source", "local") not in ("local", "hub"):
        raise DataError(f"task.{name}.source={spec.get('source')!r}; valid: local, hub")


def _hub_pairs(spec: dict[str, Any], src_lang: str, tgt_lang: str, hint: str) -> list[tuple[str, str]]:
    ds = load_hub_dataset(spec["hub_id"], spec.get("hub_config"), local_hint=hint)
    split = spec.get("hub_split", "train")
    if split not in ds:
        raise DataError(f"hub dataset {spec['hub_id']} has no split {split!r}; it has: {', '.join(ds)}")
    return hub_rows_to_pairs(ds[split], spec.get("hub_schema", "translation"), src_lang, tgt_lang)


def hub_rows_to_pairs(rows, schema: str, src_lang: str, tgt_lang: str) -> list[tuple[str, str]]:
    """(source, target) strings from hub rows of the given schema; ted_multi rows lacking a side are skipped."""
    pairs = []
    for row in rows:
        if schema == "translation":
            pairs.append((row["translation"][src_lang], row["translation"][tgt_lang]))
        elif schema == "flat":
            pairs.append((row[src_lang], row[tgt_lang]))
        elif schema == "ted_multi":
            by_lang = dict(zip(row["translations"]["language"], row["translations"]["translation"]))
            s, t = by_lang.get(src_lang), by_lang.get(tgt_lang)
            # Qi et al.'s reader drops any pair that contains the corpus' missing-sentence marker.
            if s and t and "__NULL__" not in s and "__NULL__" not in t:
                pairs.append((s, t))
        else:
            raise DataError(f"hub_schema={schema!r}; valid: translation, flat, ted_multi")
    return pairs


def _local_pairs(spec: dict[str, Any], root, name: str) -> list[tuple[str, str]]:
    fmt = spec.get("format", "lines")
    # MT sets the source per split: task.<split>.source (there is no task.source)
    paths = [find_file(root, spec[side], hub_override=f"task.{name}.source=hub with task.{name}.hub_id=<id>")
             for side in ("src", "tgt")]
    if fmt == "lines":
        src, tgt = (read_lines(p) for p in paths)
    elif fmt == "sgm":
        src, tgt = (read_segments(p) for p in paths)
    else:
        raise DataError(f"task.{name}.format={fmt!r}; valid: lines, sgm")
    if len(src) != len(tgt):
        longer = paths[0] if len(src) > len(tgt) else paths[1]
        unit = "line" if fmt == "lines" else "segment"
        raise DataError(f"parallel files differ in length: {paths[0]} has {len(src)} segments, "
                        f"{paths[1]} has {len(tgt)}; {longer}:{min(len(src), len(tgt)) + 1} is the first {unit} "
                        f"without a partner")
    if not src:
        raise DataError(f"split {name} is empty: {paths[0]}")
    return list(zip(src, tgt))


def load_pairs(cfg: dict[str, Any], name: str) -> list[tuple[str, str]]:
    spec = cfg[name]
    _check_spec(name, spec)
    if spec.get("source", "local") == "hub":
        hint = (f"the local alternative is task=mt/multi30k_en_de (or set task.{name}.source=local with files "
                f"under paths.data_root)")
        pairs = _hub_pairs(spec, cfg["src_lang"], cfg["tgt_lang"], hint)
    else:
        pairs = _local_pairs(spec, resolve_data_root(cfg["data_root"]), name)
    if spec.get("unescape"):  # Moses escapes (&apos; &quot; &amp; ...) back to characters
        pairs = [(html.unescape(s), html.unescape(t)) for s, t in pairs]
    return [(s.strip(), t.strip()) for s, t in pairs]


@dataclass
class MTScorer:
    """Corpus BLEU (sacreBLEU), optional tokenized BLEU and chrF of detokenized hypotheses."""

    tokenize: str = "13a"
    tokenized: bool = False
    chrf: bool = True

    def __call__(self, hypotheses: list[str], references: list[str]) -> dict[str, float]:
        out = {"bleu": corpus_bleu(hypotheses, references, tokenize=self.tokenize)}
        if self.tokenized:
            out["tok_bleu"] = tokenized_bleu(hypotheses, references)
        if self.chrf:
            out["chrf"] = corpus_chrf(hypotheses, references)
        return out


def _truncate(ids: list[int], limit: int) -> tuple[list[int], bool]:
    return (ids[:limit], True) if limit and len(ids) > limit else (ids, False)


@register_task_family("translation")
def load_translation(cfg: dict[str, Any], seed: int) -> TaskData:
    train = load_pairs(cfg, "train")
    val = load_pairs(cfg, "val")
    tests = {"test": load_pairs(cfg, "test")}
    for prefix in cfg.get("extra_tests") or {}:
        tests[prefix] = load_pairs({**cfg, prefix: cfg["extra_tests"][prefix]}, prefix)
    tokenize = cfg.get("sacrebleu_tokenize", "13a")
    scorer = MTScorer(tokenize=tokenize, tokenized=bool(cfg.get("tokenized_bleu")))
    ref_note = cfg.get("reference_note") or "raw (untokenized) reference text"
    flavours = {
        "bleu": f"sacreBLEU corpus BLEU, {ref_note}; signature {bleu_signature(tokenize=tokenize)}; "
                f"<unk> in hypotheses written {UNK_ESCAPE} (fairseq) so it never matches",
        "chrf": f"sacreBLEU chrF, signature {chrf_signature()}",
    }
    if scorer.tokenized:
        flavours["tok_bleu"] = ("tokenized BLEU (multi-bleu.perl equivalent: sacreBLEU tokenize=none, "
                                f"case-sensitive) on the tokenized text; signature {bleu_signature(tokenize='none')}")
    return text_seq2seq_task(cfg, {"train": train, "val": val, **tests}, scorer, flavours,
                             f"{cfg['src_lang']}->{cfg['tgt_lang']}")


def text_seq2seq_task(cfg: dict[str, Any], split_pairs: dict[str, list[tuple[str, str]]], scorer,
                      flavours: dict[str, str], what: str, *, truncate_eval_src: bool = False,
                      postprocess=None) -> TaskData:
    """A seq2seq TaskData over (source text, target text) pairs: subword tokenizer, datasets, references.

    ``split_pairs`` holds ``train``, ``val`` and the evaluation splits (every other key, ``test`` first).
    Training pairs longer than ``max_src_len`` / ``max_tgt_len`` tokens are cut, counted and logged;
    evaluation sources are cut only with ``truncate_eval_src`` (summarization), also counted.
    ``postprocess`` maps a detokenized hypothesis to the reference's form before scoring.
    """
    train = split_pairs["train"]
    kept = [(s, t) for s, t in train if s and t]
    dropped_empty = len(train) - len(kept)
    if dropped_empty:
        log.info("%s: dropped %d of %d training pairs with an empty side", cfg["name"], len(train) - len(kept),
                 len(train))
    train = kept[: cfg["max_train_pairs"]] if cfg.get("max_train_pairs") else kept
    if not train:
        raise DataError(f"{cfg['name']}: the training split is empty")
    cap = cfg.get("max_eval_pairs")
    split_pairs = {k: (train if k == "train" else v[:cap] if cap else v) for k, v in split_pairs.items()}
    for k, v in split_pairs.items():
        if not v:
            raise DataError(f"{cfg['name']}: split {k} is empty")

    t = cfg["tokenizer"]
    kind, vocab_size = t.get("kind", "bpe"), int(t.get("vocab_size", 8000))
    common = dict(vocab_size=vocab_size, lowercase=bool(t.get("lowercase", False)),
                  min_frequency=int(t.get("min_frequency", 2)), cache_dir=cfg.get("tokenizer_cache"))
    joint = bool(t.get("joint", True))
    tgt_tok = build_tokenizer(kind, [x for pair in train for x in pair] if joint else [y for _, y in train], **common)
    src_tok = tgt_tok if joint else build_tokenizer(kind, [x for x, _ in train], **common)

    limits = (int(cfg.get("max_src_len") or 0), int(cfg.get("max_tgt_len") or 0))
    datasets, truncation = {}, []
    for split, pairs in split_pairs.items():
        src_ids = encode_all(src_tok, [s for s, _ in pairs], cache_dir=cfg.get("tokenizer_cache"))
        tgt_ids = encode_all(tgt_tok, [y for _, y in pairs], cache_dir=cfg.get("tokenizer_cache"))
        cut = 0
        if split == "train" or truncate_eval_src:
            rows = []
            for s, y in zip(src_ids, tgt_ids):
                s, cut_s = _truncate(s, limits[0])
                if split == "train":
                    y, cut_t = _truncate(y, limits[1])
                    cut_s = cut_s or cut_t
                cut += cut_s
                rows.append((s, y))
            src_ids, tgt_ids = [r[0] for r in rows], [r[1] for r in rows]
        if cut:
            log.warning("%s: truncated %d of %d %s pairs to max_src_len=%d / max_tgt_len=%d tokens",
                        cfg["name"], cut, len(pairs), split, *limits)
        if split == "train":
            truncation.append(f"train {cut} of {len(pairs)} pairs cut (source or target)")
        elif truncate_eval_src:
            truncation.append(f"{split} {cut} of {len(pairs)} sources cut")
        else:
            truncation.append(f"{split} not cut")
        datasets[split] = IndexedDataset(list(zip(src_ids, tgt_ids)))

    decoding = DecodingOptions.of(cfg.get("decoding"))
    longest_src = max(len(s) for d in datasets.values() for s, _ in d.examples) + 1
    longest_tgt = max(len(y) for d in datasets.values() for _, y in d.examples) + 1
    decode_bound = decoding.max_length(longest_src) + 1
    max_len = max(longest_src, longest_tgt + 1, decode_bound)

    flavours = {
        **flavours,
        "decoding": decoding.describe(),
        "tokenizer": f"joint {kind} vocabulary of {tgt_tok.get_vocab_size()} trained on the training text"
        if joint else f"separate {kind} vocabularies ({src_tok.get_vocab_size()} / {tgt_tok.get_vocab_size()})",
        "char_acc/seq_acc": "token-level accuracy of the decoded ids against the tokenized reference",
        "truncation": f"max_src_len={limits[0] or 'none'} / max_tgt_len={limits[1] or 'none'} tokens: "
                      + "; ".join(truncation) + " (references are the raw text, never cut)"
                      + (f"; {dropped_empty} training pairs with an empty side dropped" if dropped_empty else ""),
    }
    if cfg.get("stand_in"):
        flavours["data"] = f"STAND-IN: {cfg['stand_in']}"
    eval_names = [k for k in split_pairs if k not in ("train", "val")]
    references = {split: [y for _, y in pairs] for split, pairs in split_pairs.items() if split != "train"}
    counts = ", ".join(f"{k} {len(v)}" for k, v in split_pairs.items())
    vocab = Vocab([])
    detok = Detokenizer(tgt_tok)
    return TaskData(
        kind="seq2seq",
        datasets=datasets,
        collate=IndexedSeq2SeqCollate(vocab.pad_id, vocab.bos_id, vocab.eos_id),
        vocab_size=tgt_tok.get_vocab_size(),
        src_vocab_size=src_tok.get_vocab_size(),
        pad_id=vocab.pad_id,
        bos_id=vocab.bos_id,
        eos_id=vocab.eos_id,
        max_len=max_len,
        eval_splits={k: k for k in eval_names},
        metric_flavours=flavours,
        train_lengths=[len(s) + 1 for s, _ in datasets["train"].examples]
        + [len(y) + 1 for _, y in datasets["train"].examples],
        detokenize=detok if postprocess is None else _Post(detok, postprocess),
        description=f"{cfg['name']} {what} ({counts})"
        + (f"; STAND-IN: {cfg['stand_in']}" if cfg.get("stand_in") else ""),
        score_text=scorer,
        references=references,
        sources={split: [s for s, _ in pairs] for split, pairs in split_pairs.items() if split != "train"},
    )


@dataclass
class _Post:
    detok: Any
    post: Any

    def __call__(self, ids):
        return self.post(self.detok(ids))
