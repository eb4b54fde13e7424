"""Long Range Arena byte-level tasks (Tay et al. 2021): ``lra/text`` (IMDb) and ``lra/retrieval`` (AAN).

Both are byte-level classification: a document's UTF-8 bytes are the tokens (id = byte + 4 after the
shared specials; vocabulary 260, plus one separator for retrieval), cut at ``max_len`` bytes (counted
and logged, never silent). No local copies exist on our machines.

``lra/text`` (loader ``lra_text``): IMDb sentiment, 2 classes. Hub ``stanfordnlp/imdb`` (``text``,
``label``), or locally the Stanford ``aclImdb`` release folders (``files.<split>`` = a folder holding
``pos/*.txt`` and ``neg/*.txt``). LRA evaluates on the IMDb test set and also validates on it; the configs
do the same (``val`` = test) and say so.

``lra/retrieval`` (loader ``lra_retrieval``): ACL Anthology Network citation matching, 2 classes. No public
hub copy is known; locally LRA's release ``tsv_data/new_aan_pairs.{train,eval,test}.tsv`` (columns
``label id1 id2 text1 text2``, tab-separated, an optional header row; texts may be written as Python bytes
literals ``b'...'``, which are decoded as literals, never evaluated as code). LRA encodes the two documents
with two weight-sharing encoders and classifies MLP([X1, X2, X1*X2, X1-X2]); here both documents go
through ONE encoder as ``doc1 <sep> doc2`` (each cut at ``max_len`` bytes): a pair-as-one-sequence
simplification, not LRA's dual-encoder model, so numbers are not directly comparable with LRA Table 1.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path
from typing import Any

from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.batching import ClassificationCollate, LabelledDataset
from attnlab.tasks.registry import register_task_family
from attnlab.tasks.sources import find_file, load_hub_dataset, read_lines, resolve_data_root

BYTE_OFFSET = 4          # ids 0-3 are <pad>, <s>, </s>, <unk>
SEP_ID = BYTE_OFFSET + 256
IMDB_LABELS = ("neg", "pos")
AAN_HINT = ("download lra_release.gz (github.com/google-research/long-range-arena), unpack it and set "
            "task.files.{train,val,test} to tsv_data/new_aan_pairs.{train,eval,test}.tsv under paths.data_root")
IMDB_HINT = ("or put the Stanford aclImdb release under paths.data_root and use task.source=local "
             "(task.files.<split> = aclImdb/train or aclImdb/test)")


def byte_ids(data: bytes | str) -> list[int]:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return [b + BYTE_OFFSET for b in raw]


def _subset(rows: list, cap: Any, seed: int) -> list:
    """At most ``cap`` rows, a seeded random choice kept in file order (files are often sorted by label)."""
    if not cap or len(rows) <= int(cap):
        return rows
    keep = sorted(random.Random(seed).sample(range(len(rows)), int(cap)))
    return [rows[i] for i in keep]


def _cut(ids: list[int], limit: int, counter: list[int]) -> list[int]:
    if len(ids) > limit:
        counter[0] += 1
        return ids[:limit]
    return ids or [3]


# -- IMDb --------------------------------------------------------------------------------------------------
def read_aclimdb(folder: Path) -> list[tuple[bytes, int]]:
    """(review bytes, label) for ``folder/{neg,pos}/*.txt`` in name order (neg = 0, pos = 1)."""
    if not folder.is_dir():
        raise DataError(f"IMDb folder {folder} not found; set paths.data_root / task.files, or use task.source=hub")
    out = []
    for label, name in enumerate(IMDB_LABELS):
        files = sorted((folder / name).glob("*.txt"))
        if not files:
            raise DataError(f"{folder / name}: no *.txt reviews (expected the aclImdb layout {name}/*.txt)")
        for path in files:
            try:
                out.append((path.read_bytes(), label))
            except OSError as exc:
                raise DataError(f"cannot read {path}: {exc}") from None
    return out


def _imdb_rows(cfg: dict[str, Any], split: str) -> list[tuple[bytes | str, int]]:
    if cfg["source"] == "hub":
        ds = load_hub_dataset(cfg["hub_id"], cfg.get("hub_config"), local_hint=IMDB_HINT)
        name = cfg["hub_splits"][split]
        if name not in ds:
            raise DataError(f"hub dataset {cfg['hub_id']} has no split {name!r}; it has: {', '.join(ds)}")
        rows = []
        for i, r in enumerate(ds[name]):
            label = r[cfg["hub_label_field"]]
            if label not in (0, 1):
                raise DataError(f"{cfg['hub_id']}:{name}:{i}: label {label!r} is not 0 or 1")
            rows.append((r[cfg["hub_text_field"]], int(label)))
        return rows
    if cfg["source"] != "local":
        raise DataError(f"task.source={cfg['source']!r}; valid: local, hub")
    if cfg["format"] != "aclimdb":
        raise DataError(f"task.format={cfg['format']!r}; lra_text reads format aclimdb")
    return read_aclimdb(resolve_data_root(cfg["data_root"]) / cfg["files"][split])


# -- AAN ----------------------------------------------------------------------------------------------------
def _aan_text(field: str, where: str) -> bytes:
    text = field.strip()
    if len(text) >= 3 and text[0] == "b" and text[1] in "'\"" and text[-1] == text[1]:
        try:
            value = ast.literal_eval(text)  # a literal parser: bytes literals only, nothing is executed
        except (ValueError, SyntaxError):
            raise DataError(f"{where}: malformed bytes literal") from None
        if isinstance(value, bytes):
            return value
    return field.encode("utf-8")


def read_aan_pairs(path: Path) -> list[tuple[bytes, bytes, int]]:
    """(doc1 bytes, doc2 bytes, label) per line of an LRA ``new_aan_pairs.*.tsv`` file."""
    out = []
    for number, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        where = f"{path}:{number}"
        if len(fields) < 5:
            raise DataError(f"{where}: {len(fields)} tab-separated columns, expected 5 (label id1 id2 text1 text2)")
        try:
            label = float(fields[0])
        except ValueError:
            if number == 1 and not out:  # a header row
                continue
            raise DataError(f"{where}: label {fields[0]!r} is not a number") from None
        if label not in (0.0, 1.0):
            raise DataError(f"{where}: label {fields[0]!r} is not 0 or 1")
        out.append((_aan_text(fields[3], where), _aan_text(fields[4], where), int(label)))
    if not out:
        raise DataError(f"{path}: no pairs")
    return out


def _aan_rows(cfg: dict[str, Any], split: str) -> list[tuple[bytes | str, bytes | str, int]]:
    if cfg["source"] == "hub":
        if not cfg.get("hub_id"):
            raise DataError(f"{cfg['name']}: the AAN pairs have no public hub id (task.hub_id=null); {AAN_HINT}")
        ds = load_hub_dataset(cfg["hub_id"], cfg.get("hub_config"), local_hint=AAN_HINT)
        name = cfg["hub_splits"][split]
        if name not in ds:
            raise DataError(f"hub dataset {cfg['hub_id']} has no split {name!r}; it has: {', '.join(ds)}")
        return [(r["text1"], r["text2"], int(float(r["label"]))) for r in ds[name]]
    if cfg["source"] != "local":
        raise DataError(f"task.source={cfg['source']!r}; valid: local, hub")
    if cfg["format"] != "aan_tsv":
        raise DataError(f"task.format={cfg['format']!r}; lra_retrieval reads format aan_tsv")
    root = resolve_data_root(cfg["data_root"])
    rel = cfg["files"].get(split)
    if not rel:
        raise DataError(f"task.files.{split} is not set; {AAN_HINT}")
    try:
        path = find_file(root, rel)
    except DataError:
        raise DataError(f"{root / rel} not found; {AAN_HINT}") from None
    return read_aan_pairs(path)


def _task_data(cfg, datasets, cut, *, vocab_size: int, what: str, flavour: str) -> TaskData:
    lengths = [len(ids) for ids, _ in datasets["train"].examples]
    return TaskData(
        kind="classification",
        datasets=datasets,
        collate=ClassificationCollate(0),
        vocab_size=vocab_size,
        pad_id=0,
        max_len=max(len(ids) for ds in datasets.values() for ids, _ in ds.examples),
        num_classes=2,
        eval_splits={"test": "test"},
        metric_flavours={
            "acc": "accuracy (fraction) of the 2-way label; LRA Table 1 reports it x 100",
            "data": flavour + f"; {cut} documents cut at {cfg['max_len']} bytes",
        },
        train_lengths=lengths,
        description=f"{what}: " + ", ".join(f"{s} {len(d)}" for s, d in datasets.items()),
    )


@register_task_family("lra_text")
def load_lra_text(cfg: dict[str, Any], seed: int) -> TaskData:
    limit, cut = int(cfg["max_len"]), [0]
    datasets = {}
    for split in ("train", "val", "test"):
        rows = _imdb_rows(cfg, split)
        if not rows:
            raise DataError(f"{cfg['name']}: split {split} is empty")
        cap = cfg.get("max_train_examples") if split == "train" else cfg.get("max_eval_examples")
        rows = _subset(rows, cap, int(cfg["seed_split"]))
        datasets[split] = LabelledDataset([(_cut(byte_ids(text), limit, cut), y) for text, y in rows])
    source = f"hub {cfg['hub_id']}" if cfg["source"] == "hub" else "local aclImdb folders"
    val = cfg["hub_splits"]["val"] if cfg["source"] == "hub" else cfg["files"]["val"]
    return _task_data(cfg, datasets, cut[0], vocab_size=BYTE_OFFSET + 256, what="LRA text (IMDb bytes)",
                      flavour=f"IMDb reviews as UTF-8 bytes ({source}); validation split = {val} "
                              "(LRA validates on the test set too)")


@register_task_family("lra_retrieval")
def load_lra_retrieval(cfg: dict[str, Any], seed: int) -> TaskData:
    limit, cut = int(cfg["max_len"]), [0]
    datasets = {}
    for split in ("train", "val", "test"):
        rows = _aan_rows(cfg, split)
        cap = cfg.get("max_train_examples") if split == "train" else cfg.get("max_eval_examples")
        rows = _subset(rows, cap, int(cfg["seed_split"]))
        datasets[split] = LabelledDataset(
            [(_cut(byte_ids(a), limit, cut) + [SEP_ID] + _cut(byte_ids(b), limit, cut), y) for a, b, y in rows])
    return _task_data(cfg, datasets, cut[0], vocab_size=SEP_ID + 1, what="LRA retrieval (AAN byte pairs)",
                      flavour="AAN citation pairs as UTF-8 bytes, ONE encoder over doc1 <sep> doc2 (LRA: two "
                              "weight-sharing encoders + MLP([X1, X2, X1*X2, X1-X2]); not directly comparable)")
