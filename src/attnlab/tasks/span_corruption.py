"""T5 span-corruption pre-training (Raffel et al. 2020, Sec. 3.1.4 and 3.3.4) and the vocabulary it shares
with the text-to-text GLUE / SuperGLUE tasks (tasks/text_to_text.py).

The objective follows T5's ``random_spans_noise_mask`` and ``noise_span_to_unique_sentinel``
(``t5.data.preprocessors``): of a chunk of n tokens, round(n * noise_density) are noise, cut into
round(noise / mean_noise_span_length) spans (at least one token of each kind, at least one span); span
lengths are a random partition of each count, and spans alternate non-noise / noise starting with
non-noise. The input keeps the non-noise tokens and puts one sentinel ``<extra_id_i>`` where the i-th noise
span was; the target is every sentinel followed by the tokens it replaced. Both end in EOS (the collate
adds it). T5's ``random_spans_helper`` picks the chunk length so that corrupted inputs are exactly
``input_length`` tokens: 512 -> chunks of 568 tokens, targets of 114.

Data: the documents of a corpus are tokenized and concatenated without separators (T5's
``reduce_concat_tokens``), then cut into chunks. The paper's corpus is C4 (``allenai/c4``, config ``en``),
streamed from the hub; offline that fails at once, and the laptop scale reads WikiText-2 instead (a
STAND-IN, said in ``metric_flavours``). T5 draws a fresh mask every time a chunk is read (C4 is never
repeated); a smaller corpus repeats, so each training chunk is laid out ``masks_per_chunk`` times, every copy
with its own mask drawn from (seed, index) - deterministic, so resumed runs and data-loader workers see the
same examples. Evaluation chunks are corrupted once, from ``eval_seed``, the same for every run.

Metrics: ``val/loss`` and ``val/ppl`` are the teacher-forced NLL (natural log) and perplexity per target
token (sentinels and EOS included) on held-out corrupted text; ``test/char_acc`` / ``test/seq_acc`` score
greedy decoding of the test targets token by token and whole.

The vocabulary (``vocabulary`` in both task configs) is a subword tokenizer learned on the vocabulary corpus,
plus ``sentinels`` extra tokens ``<extra_id_0..>`` appended after it (T5: 32,000 pieces + 100 sentinels).
It is cached on disk under a key of its settings and corpus (the local files' bytes, or the hub id,
config and document count), so the pre-training task and the multitask task that fine-tunes its weights
load the same file and share one embedding table.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer
from torch.utils.data import Dataset

from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.batching import IndexedSeq2SeqCollate
from attnlab.tasks.disk_cache import write_entry
from attnlab.tasks.registry import register_task_family
from attnlab.tasks.sources import (
    HUB_ERRORS,
    find_file,
    go_offline_if_unreachable,
    hf_offline,
    hub_error,
    read_lines,
    resolve_data_root,
)
from attnlab.tasks.t5_formats import format_words  # the label words must be spellable (shared_vocabulary)
from attnlab.tasks.tokenization import Detokenizer, build_tokenizer, default_cache_dir, load_cached_tokenizer
from attnlab.tasks.vocab import Vocab

log = logging.getLogger("attnlab")

SENTINEL = "<extra_id_{}>"
VOCABULARY_VERSION = 1  # bump when the way a vocabulary is built changes, so old cache files are not reused
ENCODE_BATCH = 10_000   # documents tokenized at a time: bounded memory for a large streamed corpus


# -- the objective ------------------------------------------------------------------------------------------
def random_spans_noise_mask(length: int, noise_density: float, mean_noise_span_length: float,
                            rng: np.random.Generator) -> np.ndarray:
    """T5's noise mask of ``length`` tokens (True = noise), with T5's counts and degeneracy guards."""
    orig_length = length
    length = max(length, 2)  # T5: avoid degeneracy, then cut back to the real length
    num_noise_tokens = int(round(length * noise_density))
    num_noise_tokens = min(max(num_noise_tokens, 1), length - 1)
    num_noise_spans = max(int(round(num_noise_tokens / mean_noise_span_length)), 1)
    num_nonnoise_tokens = length - num_noise_tokens

    def random_segmentation(num_items: int, num_segments: int) -> np.ndarray:
        # T5's _random_segmentation: shuffle (num_segments - 1) segment starts among the num_items - 1
        # positions after the first, so every partition into non-empty segments is equally likely.
        first_in_segment = np.zeros(num_items, dtype=np.int64)
        first_in_segment[1:] = rng.permutation(np.arange(num_items - 1) < num_segments - 1)
        return np.bincount(np.cumsum(first_in_segment), minlength=num_segments)

    noise_span_lengths = random_segmentation(num_noise_tokens, num_noise_spans)
    nonnoise_span_lengths = random_segmentation(num_nonnoise_tokens, num_noise_spans)
    interleaved = np.stack([nonnoise_span_lengths, noise_span_lengths], axis=1).reshape(-1)
    span_starts = np.cumsum(interleaved)[:-1]
    span_start_indicator = np.zeros(length, dtype=np.int64)
    span_start_indicator[span_starts] = 1
    is_noise = np.cumsum(span_start_indicator) % 2 == 1
    return is_noise[:orig_length]


def noise_span_to_unique_sentinel(tokens: np.ndarray, noise_mask: np.ndarray, sentinel_ids: np.ndarray) -> np.ndarray:
    """Each run of noise tokens replaced by one sentinel, the i-th run by ``sentinel_ids[i]`` (T5's function,
    with sentinels counted upwards from ``<extra_id_0>``)."""
    previous_is_noise = np.concatenate([[False], noise_mask[:-1]])
    first_noise = noise_mask & ~previous_is_noise
    subsequent_noise = noise_mask & previous_is_noise
    out = tokens.copy()
    span_number = np.cumsum(first_noise) - 1
    if first_noise.any() and span_number[first_noise].max() >= len(sentinel_ids):
        raise DataError(f"{int(span_number.max()) + 1} noise spans but only {len(sentinel_ids)} sentinels; raise "
                        f"task.vocabulary.sentinels or shorten task.input_length")
    out[first_noise] = sentinel_ids[span_number[first_noise]]
    return out[~subsequent_noise]


def span_corrupt(tokens: np.ndarray, noise_mask: np.ndarray, sentinel_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) without EOS: T5's ``noise_span_to_unique_sentinel`` and its non-noise twin."""
    return (noise_span_to_unique_sentinel(tokens, noise_mask, sentinel_ids),
            noise_span_to_unique_sentinel(tokens, ~noise_mask, sentinel_ids))


def corrupted_lengths(tokens_length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """(inputs, targets) lengths, EOS included, of a chunk of ``tokens_length`` tokens (T5's arithmetic)."""
    num_noise_tokens = int(round(tokens_length * noise_density))
    num_noise_spans = int(round(num_noise_tokens / mean_noise_span_length))
    return (tokens_length - num_noise_tokens + num_noise_spans + 1, num_noise_tokens + num_noise_spans + 1)


def random_spans_helper(inputs_length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """(chunk length, targets length): the longest chunk whose corrupted inputs fit ``inputs_length`` (T5's
    ``random_spans_helper``; 512 -> 568 tokens, targets 114)."""
    tokens_length = inputs_length - 1
    while corrupted_lengths(tokens_length + 1, noise_density, mean_noise_span_length)[0] <= inputs_length:
        tokens_length += 1
    return tokens_length, corrupted_lengths(tokens_length, noise_density, mean_noise_span_length)[1]


class SpanCorruptionDataset(Dataset):
    """Consecutive chunks of a token stream, corrupted on access; index i is chunk ``i % chunks`` with the mask
    drawn from (seed, i), so ``copies`` laps over the chunks give each one ``copies`` different masks."""

    def __init__(self, stream: np.ndarray, chunk_len: int, *, copies: int, seed: int, noise_density: float,
                 mean_noise_span_length: float, sentinel_ids: np.ndarray, max_chunks: int | None = None) -> None:
        starts = np.arange(0, len(stream), chunk_len)
        # A last chunk under 2 tokens cannot hold a noise and a non-noise token.
        starts = starts[np.minimum(starts + chunk_len, len(stream)) - starts >= 2]
        self.starts = starts[:max_chunks] if max_chunks else starts
        self.stream, self.chunk_len, self.copies, self.seed = stream, chunk_len, copies, seed
        self.noise_density, self.mean_noise_span_length = noise_density, mean_noise_span_length
        self.sentinel_ids = sentinel_ids

    def __len__(self) -> int:
        return len(self.starts) * self.copies

    def chunk(self, i: int) -> np.ndarray:
        start = self.starts[i % len(self.starts)]
        return self.stream[start : start + self.chunk_len]

    def __getitem__(self, i: int):
        if not -len(self) <= i < len(self):
            raise IndexError(f"example {i} out of range for {len(self)}")  # ends plain iteration
        i %= len(self)
        tokens = self.chunk(i)
        mask = random_spans_noise_mask(len(tokens), self.noise_density, self.mean_noise_span_length,
                                       np.random.default_rng([self.seed, i]))
        inputs, targets = span_corrupt(tokens, mask, self.sentinel_ids)
        return inputs.tolist(), targets.tolist(), i


# -- corpora ------------------------------------------------------------------------------------------------
def read_documents(spec: dict[str, Any], split: str, data_root: str | os.PathLike, *, limit: int | None,
                   skip: int = 0, local_hint: str, key: str = "task") -> list[str]:
    """The non-empty documents of one split: lines of a local file, or texts streamed from the hub.

    ``key``: where ``spec`` sits in the config (``task``, or ``task.vocabulary.corpus``), for messages."""
    source = spec.get("source", "local")
    if source == "local":
        files = spec.get("files") or {}
        if split not in files:
            raise DataError(f"no local file for split {split!r}; set {key}.files.{split}")
        path = find_file(resolve_data_root(data_root), files[split], hub_override=f"{key}.source=hub")
        lines = [x.strip() for x in read_lines(path)]
        docs = [x for x in lines if x][skip:]
        return docs[:limit] if limit else docs
    if source != "hub":
        raise DataError(f"source={source!r}; valid: local, hub")
    hub_id, config = spec.get("hub_id"), spec.get("hub_config")
    name = f"{hub_id}{'/' + config if config else ''}"
    if not limit:
        raise DataError(f"the streamed hub corpus {name} needs a document count: set max_train_documents / "
                        f"max_eval_documents (the vocabulary: corpus.max_documents)")
    # Streamed (C4 is too big to download whole), so there is no local cache to fall back on offline.
    if hf_offline():
        raise hub_error(name, ConnectionError("offline"), local_hint, streamed=True)
    go_offline_if_unreachable(hub_id, name, local_hint, streamed=True)
    import datasets  # seconds to import; only a streamed C4 read needs it

    hub_split = (spec.get("hub_splits") or {}).get(split, split)
    field = spec.get("hub_text_field", "text")
    try:
        stream = datasets.load_dataset(hub_id, config, split=hub_split, streaming=True)
        docs = [str(row[field]).strip() for row in itertools.islice(stream, skip, skip + int(limit))]
    except HUB_ERRORS as exc:
        raise hub_error(name, exc, local_hint, streamed=True) from None
    return [d for d in docs if d]


def encode_stream(tok: Tokenizer, documents: list[str]) -> np.ndarray:
    """Every document's ids, concatenated without separators (T5's ``reduce_concat_tokens``)."""
    parts = [np.zeros(0, dtype=np.int32)]
    for start in range(0, len(documents), ENCODE_BATCH):
        batch = tok.encode_batch(documents[start : start + ENCODE_BATCH], add_special_tokens=False)
        parts.extend(np.asarray(e.ids, dtype=np.int32) for e in batch)
    return np.concatenate(parts)


# -- the shared vocabulary ----------------------------------------------------------------------------------
@dataclass
class SharedVocabulary:
    tokenizer: Tokenizer
    sentinel_ids: np.ndarray
    key: str
    description: str

    @property
    def size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def seq2seq_task(self, datasets: dict[str, Dataset], **fields: Any) -> TaskData:
        """A seq2seq TaskData over this vocabulary (source and target share it, as in T5); ``fields`` are the
        task's own (max_len, flavours, lengths, scoring...)."""
        ids = Vocab([])
        return TaskData(kind="seq2seq", datasets=datasets,
                        collate=IndexedSeq2SeqCollate(ids.pad_id, ids.bos_id, ids.eos_id),
                        vocab_size=self.size, src_vocab_size=self.size, pad_id=ids.pad_id, bos_id=ids.bos_id,
                        eos_id=ids.eos_id, eval_splits={"test": "test"}, **fields)


VOCABULARY_KEYS = {"kind", "vocab_size", "lowercase", "min_frequency", "sentinels", "corpus"}
CORPUS_KEYS = {"source", "files", "hub_id", "hub_config", "hub_splits", "hub_text_field", "max_documents", "note"}


def _check_vocabulary(cfg: dict[str, Any]) -> None:
    if not cfg:
        raise DataError("task.vocabulary is empty; it names the tokenizer settings and the corpus it is learned on")
    unknown = sorted(set(cfg) - VOCABULARY_KEYS)
    if unknown:
        raise DataError(f"task.vocabulary.{unknown[0]} is not a vocabulary setting; "
                        f"valid: {', '.join(sorted(VOCABULARY_KEYS))}")
    unknown = sorted(set(cfg.get("corpus") or {}) - CORPUS_KEYS)
    if unknown:
        raise DataError(f"task.vocabulary.corpus.{unknown[0]} is not a corpus setting; "
                        f"valid: {', '.join(sorted(CORPUS_KEYS))}")
    if int(cfg.get("sentinels", 0)) < 1:
        raise DataError(f"task.vocabulary.sentinels={cfg.get('sentinels')!r}; span corruption needs at least 1")


def vocabulary_key(cfg: dict[str, Any], data_root: str | os.PathLike, extra_text: str) -> str:
    """A hash of everything that shapes the vocabulary: settings, corpus spec, local corpus bytes, extra text."""
    corpus = dict(cfg.get("corpus") or {})
    corpus.pop("note", None)
    identity: dict[str, Any] = {k: v for k, v in cfg.items() if k != "corpus"}
    identity.update(corpus=corpus, extra_text=extra_text, v=VOCABULARY_VERSION)
    if corpus.get("source", "local") == "local":
        train = (corpus.get("files") or {}).get("train")
        if not train:
            raise DataError("task.vocabulary.corpus.files.train is not set: the file the vocabulary is learned on")
        path = find_file(resolve_data_root(data_root), train, hub_override="task.vocabulary.corpus.source=hub")
        identity["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def shared_vocabulary(cfg: dict[str, Any], *, data_root: str | os.PathLike,
                      cache_dir: str | os.PathLike | None = None) -> SharedVocabulary:
    """The tokenizer both T5-style tasks use: learned once on the vocabulary corpus, then loaded by key."""
    _check_vocabulary(cfg)
    # T5's SentencePiece vocabulary spells every task prefix and label word; a small corpus may lack a
    # character of them (WikiText-2 has no "_", needed by not_entailment), so one line of them joins the text.
    extra_text = format_words()
    key = vocabulary_key(cfg, data_root, extra_text)
    folder = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    path = folder / f"t5vocab-{key}.tokenizer"
    count = int(cfg["sentinels"])
    sentinels = [SENTINEL.format(i) for i in range(count)]
    tok = load_cached_tokenizer(path)  # the two tasks of a pipeline may build it at the same time: atomic
    if tok is None:
        corpus = cfg.get("corpus") or {}
        hint = ("the vocabulary's corpus is hub-only: at scale=cpu the T5-style tasks learn it on local WikiText-2 "
                "(task.vocabulary.corpus.source=local), or run once with network access to fill the cache")
        docs = read_documents(corpus, "train", data_root, limit=corpus.get("max_documents"), local_hint=hint,
                              key="task.vocabulary.corpus")
        tok = build_tokenizer(cfg.get("kind", "bpe"), [*docs, extra_text], vocab_size=int(cfg["vocab_size"]),
                              lowercase=bool(cfg.get("lowercase", False)),
                              min_frequency=int(cfg.get("min_frequency", 2)), cache_dir=cache_dir)
        tok.add_special_tokens(sentinels)
        write_entry(path, tok.to_str().encode("utf-8"))
    ids = [tok.token_to_id(s) for s in sentinels]
    if None in ids or ids != list(range(ids[0], ids[0] + count)):
        raise DataError(f"vocabulary file {path} lacks the {count} sentinel tokens in order; delete it to rebuild")
    corpus = cfg.get("corpus") or {}
    where = (corpus.get("files") or {}).get("train") if corpus.get("source", "local") == "local" \
        else f"{corpus.get('hub_id')}/{corpus.get('hub_config')} (first {corpus.get('max_documents')} documents)"
    description = (f"{cfg.get('kind', 'bpe')} vocabulary of {ids[0]} learned on {where} + {count} sentinels "
                   f"<extra_id_0..{count - 1}> = {tok.get_vocab_size()} ids; key {key} (shared by the span-corruption "
                   f"and text-to-text tasks: same key, same embedding table)")
    return SharedVocabulary(tok, np.asarray(ids, dtype=np.int64), key, description)


# -- the task -----------------------------------------------------------------------------------------------
LOCAL_HINT = ("the local stand-in is the cpu scale (task.source=local: WikiText-2 under paths.data_root, "
              "wikitext2/wiki.{train,valid,test}.tokens)")


def _check_objective(cfg: dict[str, Any]) -> None:
    if not 0.0 < float(cfg["noise_density"]) < 1.0:
        raise DataError(f"task.noise_density={cfg['noise_density']}; it must be in (0, 1) (T5: 0.15)")
    if float(cfg["mean_noise_span_length"]) < 1.0:
        raise DataError(f"task.mean_noise_span_length={cfg['mean_noise_span_length']}; it must be >= 1 (T5: 3.0)")
    if int(cfg["input_length"]) < 4:
        raise DataError(f"task.input_length={cfg['input_length']}; it must be at least 4 (T5: 512)")
    if int(cfg["masks_per_chunk"]) < 1:
        raise DataError(f"task.masks_per_chunk={cfg['masks_per_chunk']}; it must be at least 1")


def _count(value: Any) -> int | None:
    return int(value) if value else None


@register_task_family("span_corruption")
def load_span_corruption(cfg: dict[str, Any], seed: int) -> TaskData:
    _check_objective(cfg)
    vocab = shared_vocabulary(cfg["vocabulary"], data_root=cfg["data_root"], cache_dir=cfg.get("tokenizer_cache"))
    density, mean_span = float(cfg["noise_density"]), float(cfg["mean_noise_span_length"])
    chunk_len, targets_length = random_spans_helper(int(cfg["input_length"]), density, mean_span)
    eval_docs = cfg.get("max_eval_documents")
    documents = {"train": read_documents(cfg, "train", cfg["data_root"], limit=cfg.get("max_train_documents"),
                                         local_hint=LOCAL_HINT)}
    hub_splits = cfg.get("hub_splits") or {}
    for split in ("val", "test"):
        # C4 has one validation split: the test documents then follow the validation ones (disjoint).
        same = cfg["source"] == "hub" and split == "test" and hub_splits.get("test") == hub_splits.get("val")
        documents[split] = read_documents(cfg, split, cfg["data_root"], limit=eval_docs,
                                          skip=int(eval_docs or 0) if same else 0, local_hint=LOCAL_HINT)
    common = dict(noise_density=density, mean_noise_span_length=mean_span, sentinel_ids=vocab.sentinel_ids)
    datasets, tokens = {}, {}
    for split, docs in documents.items():
        if not docs:
            raise DataError(f"{cfg['name']}: split {split} has no documents")
        stream = encode_stream(vocab.tokenizer, docs)
        tokens[split] = len(stream)
        train = split == "train"
        datasets[split] = SpanCorruptionDataset(
            stream, chunk_len, copies=int(cfg["masks_per_chunk"]) if train else 1,
            seed=seed if train else int(cfg["eval_seed"]),
            max_chunks=_count(cfg.get("max_train_chunks") if train else cfg.get("max_eval_chunks")), **common)
        if not len(datasets[split]):
            raise DataError(f"{cfg['name']}: split {split} holds no chunk of at least 2 tokens")
    flavours = {
        "objective": f"T5 span corruption: noise density {density}, mean noise span length {mean_span}; chunks of "
                     f"{chunk_len} tokens -> inputs {cfg['input_length']} / targets {targets_length} tokens (EOS "
                     f"included); documents concatenated without separators; {cfg['masks_per_chunk']} mask(s) per "
                     f"training chunk drawn from (seed, index), evaluation masks from eval_seed {cfg['eval_seed']}",
        "val/ppl": "teacher-forced perplexity per target token (sentinels and EOS included) on held-out corrupted "
                   "text, natural log; val/loss is its mean NLL (the run record keeps the best in metrics.best)",
        "char_acc/seq_acc": "greedy decoding of the test targets: token accuracy at each position / whole targets",
        "vocabulary": vocab.description,
    }
    if cfg.get("stand_in"):
        flavours["data"] = f"STAND-IN: {cfg['stand_in']}"
    counts = ", ".join(f"{k} {len(v)} chunks ({tokens[k]} tokens)" for k, v in datasets.items())
    sample = datasets["train"]
    return vocab.seq2seq_task(
        datasets,
        max_len=max(int(cfg["input_length"]), targets_length + 1),
        metric_flavours=flavours,
        train_lengths=[len(sample[i][0]) + 1 for i in range(min(len(sample), 256))],
        detokenize=Detokenizer(vocab.tokenizer),
        description=f"{cfg['name']} ({cfg['source']}): {counts}"
        + (f"; STAND-IN: {cfg['stand_in']}" if cfg.get("stand_in") else ""),
    )
