"""GLUE and SuperGLUE sentence(-pair) tasks as classification (or regression for STS-B), trained from scratch.

Local files: GLUE TSVs (``download_glue_data.py`` layout), SuperGLUE JSON Lines, or the original WiC text
release (``format: wic``: ``*.data.txt`` + ``*.gold.txt``). Hub: ``nyu-mll/glue`` / ``aps/super_glue`` rows,
whose integer labels are class indices. The text fields of one example are joined with `` [SEP] `` (pairs as
sentence1 [SEP] sentence2; COPA as premise [SEP] question [SEP] choice1 [SEP] choice2; WSC as the text with
its two spans) and tokenized by a WordPiece vocabulary trained on the training text.

GLUE / SuperGLUE test labels are hidden, so the official-metric evaluation runs on the dev (validation) split
under the ``test`` prefix, as the papers' dev-set tables; metric_flavours says so. Official metrics per task
come from ``metrics`` (torchmetrics): CoLA MCC, STS-B Pearson/Spearman, MRPC/QQP F1 (+ accuracy), CB
accuracy + macro-F1, the rest accuracy. MultiRC and ReCoRD (group-level EM/F1) are not implemented.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from attnlab.metrics.classification import METRICS, classification_scores
from attnlab.tasks.base import DataError, TaskData, register_task_family
from attnlab.tasks.batching import IndexedClassificationCollate, IndexedDataset
from attnlab.tasks.sources import find_file, load_hub_dataset, read_jsonl, read_lines, read_tsv, resolve_data_root
from attnlab.tasks.tokenization import build_tokenizer, encode_all

SEP = " [SEP] "


def _field(row: Any, key: Any, where: str):
    value = row
    for part in str(key).split("."):
        try:
            value = value[int(part)] if isinstance(value, list) else value[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise DataError(f"{where}: no field {key!r}") from None
    return value


def _label_index(value: Any, label_values: list[str] | None, where: str, *, hub: bool) -> float | int:
    if label_values is None:  # regression
        try:
            return float(value)
        except (TypeError, ValueError):
            raise DataError(f"{where}: score {value!r} is not a number") from None
    if hub and isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < len(label_values):
            raise DataError(f"{where}: label {value} outside 0..{len(label_values) - 1}")
        return value
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if text not in label_values:
        raise DataError(f"{where}: label {value!r} is not one of {label_values}")
    return label_values.index(text)


def _local_rows(cfg: dict[str, Any], split: str) -> list[tuple[list[Any], Any, str]]:
    root = resolve_data_root(cfg["data_root"])
    fmt = cfg["format"]
    rel = cfg["files"][split]
    if fmt == "wic":
        data = find_file(root, f"{rel}.data.txt")
        gold = find_file(root, f"{rel}.gold.txt")
        _, rows = read_tsv(data, header=False, min_columns=5)
        labels = [x.strip() for x in read_lines(gold) if x.strip()]
        if len(rows) != len(labels):
            raise DataError(f"{data} has {len(rows)} examples but {gold} has {len(labels)} labels")
        return [([r[0], r[3], r[4]], lab, f"{gold}:{i}") for i, (r, lab) in enumerate(zip(rows, labels), 1)]
    path = find_file(root, rel)
    if fmt == "jsonl":
        out = []
        for i, r in enumerate(read_jsonl(path), 1):
            where = f"{path}:{i}"
            out.append(([_field(r, k, where) for k in cfg["text_fields"]], _field(r, cfg["label_field"], where), where))
        return out
    if fmt == "tsv":
        head, rows = read_tsv(path, header=bool(cfg["header"]))
        first = 2 if cfg["header"] else 1

        def col(key):
            if isinstance(key, int):
                return key
            if key not in head:
                raise DataError(f"{path}: no column {key!r}; columns: {', '.join(head)}")
            return head.index(key)

        cols = [col(k) for k in cfg["text_fields"]]
        label_col = col(cfg["label_field"])
        out = []
        for i, r in enumerate(rows):
            where = f"{path}:{i + first}"
            if max(*cols, label_col) >= len(r):
                raise DataError(f"{where}: {len(r)} columns, expected more than {max(*cols, label_col)}")
            out.append(([r[c] for c in cols], r[label_col], where))
        return out
    raise DataError(f"task.format={fmt!r}; valid: tsv, jsonl, wic")


def _rows(cfg: dict[str, Any], split: str) -> list[tuple[list[Any], Any, str]]:
    if cfg["source"] == "hub":
        ds = load_hub_dataset(cfg["hub_id"], cfg.get("hub_config"),
                              local_hint="the local GLUE/SuperGLUE tasks are glue/{cola,sst2,mrpc,stsb,rte} and "
                                         "superglue/{rte,cb,copa,wic,wsc,boolq}")
        name = cfg["hub_splits"][split]
        if name not in ds:
            raise DataError(f"hub dataset {cfg['hub_id']} has no split {name!r}; it has: {', '.join(ds)}")
        where = f"{cfg['hub_id']}/{cfg.get('hub_config')}:{name}"
        return [([_field(r, k, where) for k in cfg["hub_text_fields"]], r[cfg["hub_label_field"]], f"{where}:{i}")
                for i, r in enumerate(ds[name])]
    if cfg["source"] != "local":
        raise DataError(f"task.source={cfg['source']!r}; valid: local, hub")
    return _local_rows(cfg, split)


@dataclass
class GlueScorer:
    names: tuple[str, ...]
    num_classes: int

    def __call__(self, predictions: list, labels: list) -> dict[str, float]:
        return classification_scores(predictions, labels, self.names, self.num_classes)


@register_task_family("glue")
def load_glue(cfg: dict[str, Any], seed: int) -> TaskData:
    label_values = cfg.get("label_values")
    label_values = [str(v) for v in label_values] if label_values is not None else None
    regression = label_values is None
    names = tuple(cfg["metrics"])
    unknown = [m for m in names if m not in METRICS]
    if unknown:
        raise DataError(f"task.metrics has {unknown[0]!r}; valid: {', '.join(METRICS)}")
    hub = cfg["source"] == "hub"
    split_names = list(cfg["hub_splits"] if hub else cfg["files"])
    raw = {split: _rows(cfg, split) for split in split_names}
    holdout = cfg.get("holdout_fraction")
    if holdout:  # only a dev file exists locally (BoolQ): cut it into train / dev, seeded
        rows = raw.pop("val")
        order = list(range(len(rows)))
        random.Random(int(cfg.get("seed_split", 0))).shuffle(order)
        n_dev = int(round(len(rows) * float(holdout)))
        raw["val"] = [rows[i] for i in sorted(order[:n_dev])]
        raw["train"] = [rows[i] for i in sorted(order[n_dev:])]
    for split, rows in raw.items():
        if not rows:
            raise DataError(f"{cfg['name']}: split {split} is empty")
    examples = {
        split: [(SEP.join(str(x).strip() for x in texts), _label_index(label, label_values, where, hub=hub))
                for texts, label, where in rows]
        for split, rows in raw.items()
    }
    if cfg.get("max_train_examples"):
        examples["train"] = examples["train"][: int(cfg["max_train_examples"])]
    t = cfg["tokenizer"]
    tok = build_tokenizer(t.get("kind", "wordpiece"), [x for x, _ in examples["train"]],
                          vocab_size=int(t.get("vocab_size", 8000)), lowercase=bool(t.get("lowercase", True)),
                          min_frequency=int(t.get("min_frequency", 2)), cache_dir=cfg.get("tokenizer_cache"))
    limit = int(cfg["max_seq_len"])
    datasets, lengths, cut = {}, [], 0
    for split, items in examples.items():
        ids = encode_all(tok, [x for x, _ in items])
        cut += sum(len(i) > limit for i in ids)
        ids = [i[:limit] or [3] for i in ids]  # an empty text becomes one <unk>, never a zero-length row
        lengths.extend(len(i) for i in ids)
        datasets[split] = IndexedDataset([(i, y) for i, (_, y) in zip(ids, items)])
    eval_splits = dict(cfg.get("eval_splits") or {"test": "val"})
    num_classes = 1 if regression else len(label_values)
    flavours = {
        "metrics": ", ".join(f"{m}: {METRICS[m]} x 100" for m in names)
        + ("; acc (module): accuracy as a fraction" if not regression else "; mse (module): mean squared error"),
        "split": f"'test' metrics are on {', '.join(f'{k}={v}' for k, v in eval_splits.items())} "
                 "(GLUE/SuperGLUE test labels are hidden: dev-set results, as the papers' dev tables)"
                 + (f"; train/dev cut {1 - float(holdout):.0%}/{float(holdout):.0%} from the validation file "
                    f"(seed {cfg.get('seed_split', 0)})" if holdout else ""),
        "model": f"from scratch, {t.get('kind', 'wordpiece')} vocabulary of {tok.get_vocab_size()}, inputs joined "
                 f"with [SEP], cut at {limit} tokens ({cut} cut)",
    }
    if cfg.get("stand_in"):
        flavours["data"] = f"STAND-IN: {cfg['stand_in']}"
    return TaskData(
        kind="regression" if regression else "classification",
        datasets=datasets,
        collate=IndexedClassificationCollate(0, regression=regression),
        vocab_size=tok.get_vocab_size(),
        pad_id=0,
        max_len=max(lengths) + 1,
        num_classes=num_classes,
        eval_splits=eval_splits,
        metric_flavours=flavours,
        train_lengths=[len(i) for i, _ in datasets["train"].examples],
        description=f"{cfg['name']}: " + ", ".join(f"{k} {len(v)}" for k, v in examples.items()),
        score_text=GlueScorer(names, num_classes),
        references={split: [y for _, y in items] for split, items in examples.items() if split != "train"},
    )
