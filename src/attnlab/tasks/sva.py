"""Subject-verb agreement number prediction (Linzen, Dupoux & Goldberg 2016; UT paper Table 2).

The input is the sentence up to (not including) its present-tense verb; the label is the verb's number
(``VBZ`` singular, ``VBP`` plural). Accuracy is reported overall (the module's ``acc``) and by the number of
agreement attractors, ``acc_attractors_<k>`` for k = 0..``max_attractors``: attractors are the intervening
nouns whose number differs from the subject's (``n_diff_intervening``). As in Linzen et al.'s analysis,
the per-attractor accuracies count only sentences whose intervening nouns are all attractors
(``n_intervening == n_diff_intervening``; ``only_attractors: false`` counts every sentence).

Data: Linzen et al.'s ``agr_50_mostcommon_10K.tsv`` (tab-separated, one header row with the columns
``sentence orig_sentence pos_sentence subj verb subj_pos has_rel has_nsubj verb_pos subj_index verb_index
n_intervening last_intervening n_diff_intervening distance max_depth all_nouns nouns_up_to_verb``;
``verb_index`` is 1-based). No public Hugging Face hub copy is known, so ``source: hub`` needs
``task.hub_id`` (rows with the same columns) and otherwise fails with what to do; ``source: local`` reads
the TSV under ``paths.data_root``. One file (``files.all``) is cut into train / val / test by
``split_fractions`` (default 9% / 1% / 90%, Linzen et al.'s proportions), seeded; ``files`` may instead
name ``train``, ``val`` and ``test`` files.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.batching import indexed_classification_task
from attnlab.tasks.registry import register_task_family
from attnlab.tasks.sources import find_file, load_hub_dataset, read_tsv, resolve_data_root
from attnlab.tasks.tokenization import build_tokenizer, encode_all

LABELS = {"VBZ": 0, "VBP": 1}   # singular, plural
REQUIRED = ("verb_pos", "verb_index", "n_intervening", "n_diff_intervening")
LOCAL_HINT = ("supply Linzen et al.'s agr_50_mostcommon_10K.tsv locally: task.source=local "
              "task.files.all=<its path under paths.data_root>")


@dataclass
class Example:
    words: list[str]
    label: int
    n_intervening: int
    n_diff: int


def _int(value: Any, column: str, where: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DataError(f"{where}: column {column} is {value!r}, not an integer") from None


def parse_row(row: dict[str, Any], text_field: str, where: str) -> Example:
    for column in (text_field, *REQUIRED):
        if column not in row:
            raise DataError(f"{where}: no column {column!r} (expected Linzen et al.'s agreement TSV)")
    pos = str(row["verb_pos"]).strip()
    if pos not in LABELS:
        raise DataError(f"{where}: verb_pos {pos!r} is not one of {', '.join(LABELS)}")
    words = str(row[text_field]).split()
    verb_index = _int(row["verb_index"], "verb_index", where)
    if not 2 <= verb_index <= len(words):
        raise DataError(f"{where}: verb_index {verb_index} outside 2..{len(words)} (the sentence's words)")
    return Example(words[: verb_index - 1], LABELS[pos], _int(row["n_intervening"], "n_intervening", where),
                   _int(row["n_diff_intervening"], "n_diff_intervening", where))


def read_agreement_tsv(path, text_field: str = "sentence") -> list[Example]:
    head, rows = read_tsv(path, header=True)
    if not head:
        raise DataError(f"{path}: empty file")
    return [parse_row(dict(zip(head, fields)), text_field, f"{path}:{number}")
            for number, fields in enumerate(rows, 2)]


def _load_splits(cfg: dict[str, Any]) -> dict[str, list[Example]]:
    text_field = cfg["text_field"]
    source = cfg["source"]
    if source == "hub":
        if not cfg.get("hub_id"):
            raise DataError(f"{cfg['name']}: the agreement data has no public hub id (task.hub_id=null); {LOCAL_HINT}")
        ds = load_hub_dataset(cfg["hub_id"], cfg.get("hub_config"), local_hint=LOCAL_HINT)
        split = cfg["hub_split"]
        if split not in ds:
            raise DataError(f"hub dataset {cfg['hub_id']} has no split {split!r}; it has: {', '.join(ds)}")
        rows = [parse_row(r, text_field, f"{cfg['hub_id']}:{split}:{i}") for i, r in enumerate(ds[split])]
        return _cut(rows, cfg)
    if source != "local":
        raise DataError(f"task.source={source!r}; valid: hub, local")
    files = dict(cfg.get("files") or {})
    root = resolve_data_root(cfg["data_root"])
    if files.get("all"):
        return _cut(read_agreement_tsv(find_file(root, files["all"]), text_field), cfg)
    if all(files.get(s) for s in ("train", "val", "test")):
        return {s: read_agreement_tsv(find_file(root, files[s]), text_field) for s in ("train", "val", "test")}
    raise DataError(f"{cfg['name']}: task.files names no data; {LOCAL_HINT} (or files.train/val/test)")


def _cut(rows: list[Example], cfg: dict[str, Any]) -> dict[str, list[Example]]:
    fractions = cfg["split_fractions"]
    try:
        f_train, f_val = float(fractions["train"]), float(fractions["val"])
    except (KeyError, TypeError, ValueError):
        raise DataError("task.split_fractions needs numeric train, val and test fractions") from None
    if f_train <= 0 or f_val < 0 or f_train + f_val >= 1:
        raise DataError(f"task.split_fractions={dict(fractions)}: train > 0 and train + val < 1 are required")
    order = list(range(len(rows)))
    random.Random(int(cfg["seed_split"])).shuffle(order)
    n_train, n_val = int(len(rows) * f_train), int(len(rows) * f_val)
    pick = lambda idx: [rows[i] for i in sorted(idx)]  # noqa: E731
    return {"train": pick(order[:n_train]), "val": pick(order[n_train:n_train + n_val]),
            "test": pick(order[n_train + n_val:])}


@dataclass
class AttractorScorer:
    """References are (label, n_intervening, n_diff_intervening); outputs are predicted labels."""

    max_attractors: int
    only_attractors: bool

    def __call__(self, predictions: list[int], references: list[tuple[int, int, int]]) -> dict[str, float]:
        hits: dict[int, list[int]] = {}
        for pred, (gold, n_int, n_diff) in zip(predictions, references):
            if self.only_attractors and n_int != n_diff:
                continue
            if n_diff <= self.max_attractors:
                hits.setdefault(n_diff, []).append(int(int(pred) == int(gold)))
        return {f"acc_attractors_{k}": sum(v) / len(v) for k, v in sorted(hits.items())}


@register_task_family("sva")
def load_sva(cfg: dict[str, Any], seed: int) -> TaskData:
    splits = _load_splits(cfg)
    if cfg.get("max_examples"):
        splits = {s: rows[: int(cfg["max_examples"])] for s, rows in splits.items()}
    for split, rows in splits.items():
        if not rows:
            raise DataError(f"{cfg['name']}: split {split} is empty")
    t = cfg["tokenizer"]
    texts = {s: [" ".join(e.words) for e in rows] for s, rows in splits.items()}
    tok = build_tokenizer(t.get("kind", "word"), texts["train"], vocab_size=int(t.get("vocab_size", 0)),
                          min_frequency=int(t.get("min_frequency", 1)), cache_dir=cfg.get("tokenizer_cache"))
    labelled = {}
    for split, rows in splits.items():
        ids = [i or [3] for i in encode_all(tok, texts[split], cache_dir=cfg.get("tokenizer_cache"))]
        labelled[split] = [(i, e.label) for i, e in zip(ids, rows)]
    k = int(cfg["max_attractors"])
    return indexed_classification_task(
        labelled,
        vocab_size=tok.get_vocab_size(),
        num_classes=2,
        eval_splits={"test": "test"},
        metric_flavours={
            "acc": "accuracy of the verb number (singular VBZ / plural VBP) over all test sentences, as a fraction",
            "acc_attractors_k": f"accuracy (fraction) on test sentences with k = 0..{k} attractors (intervening "
                                "nouns of the other number)"
                                + ("; only sentences whose intervening nouns are all attractors, as Linzen et al."
                                   if cfg["only_attractors"] else "; all sentences"),
            "data": f"Linzen et al. 2016 agreement data, column {cfg['text_field']!r}, prefix up to the verb; "
                    + ", ".join(f"{s} {len(r)}" for s, r in splits.items()),
        },
        description=f"{cfg['name']}: " + ", ".join(f"{s} {len(r)}" for s, r in splits.items()),
        score_text=AttractorScorer(k, bool(cfg["only_attractors"])),
        references={s: [(e.label, e.n_intervening, e.n_diff) for e in rows]
                    for s, rows in splits.items() if s != "train"},
    )
