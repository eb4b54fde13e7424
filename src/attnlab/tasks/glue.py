"""GLUE and SuperGLUE sentence(-pair) tasks as classification (or regression for STS-B), trained from scratch.

Local files: GLUE TSVs (``download_glue_data.py`` layout), SuperGLUE JSON Lines, or the original WiC text
release (``format: wic``: ``*.data.txt`` + ``*.gold.txt``). Hub: ``nyu-mll/glue`` / ``aps/super_glue`` rows,
whose integer labels are class indices. The text fields of one example are joined with `` [SEP] `` (pairs as
sentence1 [SEP] sentence2; COPA as premise [SEP] question [SEP] choice1 [SEP] choice2; WSC as the text with
its two spans) and tokenized by a WordPiece vocabulary trained on the training text.

GLUE / SuperGLUE test labels are hidden, so the official-metric evaluation runs on the dev (validation) split
under the ``test`` prefix, as the papers' dev-set tables; metric_flavours says so. Official metrics per task
come from ``metrics`` (torchmetrics): CoLA MCC, STS-B Pearson/Spearman, MRPC/QQP F1 (+ accuracy), CB
accuracy + macro-F1, the rest accuracy.

MultiRC and ReCoRD (``scheme: multirc`` / ``scheme: record``) use the same encoder classifier, as the
non-generative SuperGLUE baselines do (BERT / jiant): MultiRC is binary classification of each (question,
answer option, paragraph), grouped back per question for its exact match; ReCoRD scores every candidate entity
of a passage substituted into the query's ``@placeholder`` as a binary "is this the answer" input, and the
prediction for a query is its candidate with the highest positive-class log-probability. Their rows come
from the hub (``aps/super_glue`` multirc / record) or from the SuperGLUE release JSON Lines (nested
passages / questions / answers), which are flattened into the hub's row schema first.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from attnlab.metrics.classification import METRICS, classification_scores
from attnlab.metrics.reading import (
    MULTIRC_METRICS,
    SUPERGLUE_RECORD_METRICS,
    multirc_scores,
    pick_candidates,
    squad_normalise,
    superglue_record_scores,
)
from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.batching import indexed_classification_task
from attnlab.tasks.registry import register_task_family
from attnlab.tasks.sources import (
    find_file,
    load_hub_dataset,
    read_jsonl_numbered,
    read_lines,
    read_tsv,
    resolve_data_root,
)
from attnlab.tasks.tokenization import build_tokenizer, encode_all

log = logging.getLogger("attnlab")

SEP = " [SEP] "
SCHEMES = ("classify", "multirc", "record")
PLACEHOLDER = "@placeholder"
LOCAL_HINT = ("the local GLUE/SuperGLUE tasks are glue/{cola,sst2,mrpc,stsb,rte} and "
              "superglue/{rte,cb,copa,wic,wsc,boolq}; MultiRC / ReCoRD read the SuperGLUE release files with "
              "task.source=local (superglue/MultiRC/{train,val}.jsonl, superglue/ReCoRD/{train,val}.jsonl)")


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
    path = find_file(root, rel, hub_override="task.source=hub" if cfg.get("hub_id") else None)
    if fmt == "jsonl":
        out = []
        for line, r in read_jsonl_numbered(path):
            where = f"{path}:{line}"
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


def _hub_rows(cfg: dict[str, Any], split: str) -> list[tuple[dict, str]]:
    """(row, where) of one hub split; fails fast offline naming the local alternatives."""
    ds = load_hub_dataset(cfg["hub_id"], cfg.get("hub_config"), local_hint=LOCAL_HINT)
    name = cfg["hub_splits"][split]
    if name not in ds:
        raise DataError(f"hub dataset {cfg['hub_id']} has no split {name!r}; it has: {', '.join(ds)}")
    where = f"{cfg['hub_id']}/{cfg.get('hub_config')}:{name}"
    return [(r, f"{where}:{i}") for i, r in enumerate(ds[name])]


def _rows(cfg: dict[str, Any], split: str) -> list[tuple[list[Any], Any, str]]:
    """(text fields, raw label, where) per example; MultiRC gives one row per answer option."""
    if cfg.get("scheme", "classify") == "multirc":
        return [(texts, label, where) for texts, label, where, _ in _multirc_rows(cfg, split)]
    if cfg["source"] == "hub":
        return [([_field(r, k, where) for k in cfg["hub_text_fields"]], r[cfg["hub_label_field"]], where)
                for r, where in _hub_rows(cfg, split)]
    if cfg["source"] != "local":
        raise DataError(f"task.source={cfg['source']!r}; valid: local, hub")
    return _local_rows(cfg, split)


# -- MultiRC and ReCoRD: the SuperGLUE release nests passages -> questions -> answers; flatten it into the
# hub's row schema so both sources go through one conversion.
def _release_rows(cfg: dict[str, Any], split: str, flatten) -> list[tuple[dict, str]]:
    if cfg["source"] == "hub":
        return _hub_rows(cfg, split)
    if cfg["source"] != "local":
        raise DataError(f"task.source={cfg['source']!r}; valid: local, hub")
    if cfg["format"] != "jsonl":
        raise DataError(f"task.format={cfg['format']!r}: {cfg['name']} reads the SuperGLUE release JSON Lines "
                        f"(format: jsonl)")
    path = find_file(resolve_data_root(cfg["data_root"]), cfg["files"][split], hub_override="task.source=hub")
    return [(row, f"{path}:{line}") for line, item in read_jsonl_numbered(path)
            for row in flatten(item, f"{path}:{line}")]


def _list(value: Any, where: str, what: str) -> list:
    if not isinstance(value, list):
        raise DataError(f"{where}: {what} is not a list")
    return value


def flatten_multirc(item: dict, where: str) -> list[dict]:
    """One release line (a paragraph with its questions and answer options) -> hub rows, one per option."""
    text = _field(item, "passage.text", where)
    rows = []
    # Without release indices the line and positions still tell questions apart (EM groups by them).
    for q, question in enumerate(_list(_field(item, "passage.questions", where), where, "passage.questions")):
        for a, answer in enumerate(_list(_field(question, "answers", where), where, "answers")):
            label = answer.get("label", -1)
            rows.append({"paragraph": text, "question": _field(question, "question", where),
                         "answer": _field(answer, "text", where),
                         "idx": {"paragraph": item.get("idx", where), "question": question.get("idx", q),
                                 "answer": answer.get("idx", a)},
                         "label": int(label) if isinstance(label, bool) else label})
    return rows


def flatten_superglue_record(item: dict, where: str) -> list[dict]:
    """One release line (a passage with entity spans and its queries) -> hub rows, one per query.

    Entity ``end`` offsets are inclusive in the release (the hub builder reads ``text[start:end + 1]``).
    """
    text = _field(item, "passage.text", where)
    entities = []
    for span in _list(_field(item, "passage.entities", where), where, "passage.entities"):
        start, end = _field(span, "start", where), _field(span, "end", where)
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end < len(text)):
            raise DataError(f"{where}: entity span {start}..{end} is outside the passage ({len(text)} characters)")
        entities.append(text[start:end + 1])
    rows = []
    for q, qa in enumerate(_list(_field(item, "qas", where), where, "qas")):
        answers = sorted({_field(a, "text", where) for a in _list(qa.get("answers", []), where, "answers")})
        rows.append({"passage": text, "query": _field(qa, "query", where), "entities": sorted(set(entities)),
                     "answers": answers, "idx": {"passage": item.get("idx", where), "query": qa.get("idx", q)}})
    return rows


def _multirc_rows(cfg: dict[str, Any], split: str) -> list[tuple[list[Any], Any, str, Hashable]]:
    """(text fields, raw label, where, question key) per answer option."""
    out = []
    for row, where in _release_rows(cfg, split, flatten_multirc):
        question = (_field(row, "idx.paragraph", where), _field(row, "idx.question", where))
        out.append(([_field(row, k, where) for k in cfg["hub_text_fields"]], _field(row, cfg["hub_label_field"], where),
                    where, question))
    return out


@dataclass
class Candidate:
    """One ReCoRD classifier input: a candidate entity in the query of one passage."""

    text: str
    label: int
    query: Hashable
    entity: str
    answers: tuple[str, ...]


def superglue_record_candidates(row: dict, where: str) -> list[Candidate]:
    """Every distinct candidate entity substituted into the query's @placeholder, then [SEP] the passage.

    The label is 1 when the entity equals a gold answer under the SQuAD normalisation the metric uses.
    """
    query = _field(row, "query", where)
    if PLACEHOLDER not in query:
        raise DataError(f"{where}: the query has no {PLACEHOLDER}")
    # @highlight lines are the article's summary bullets; "- " keeps them as bullets for the tokenizer.
    passage = str(_field(row, "passage", where)).replace("@highlight\n", "- ").strip()
    answers = tuple(str(a) for a in _field(row, "answers", where))
    gold = {squad_normalise(a) for a in answers}
    key = (_field(row, "idx.passage", where), _field(row, "idx.query", where))
    entities = list(dict.fromkeys(str(e) for e in _field(row, "entities", where)))
    return [Candidate(query.replace(PLACEHOLDER, e) + SEP + passage, int(squad_normalise(e) in gold), key, e, answers)
            for e in entities]


@dataclass
class GlueScorer:
    names: tuple[str, ...]
    num_classes: int

    def __call__(self, predictions: list, labels: list) -> dict[str, float]:
        return classification_scores(predictions, labels, self.names, self.num_classes)


@dataclass
class MultircScorer:
    """References are (label, question key); outputs are predicted labels of the answer options."""

    def __call__(self, predictions: list, references: list) -> dict[str, float]:
        return multirc_scores(predictions, [r[0] for r in references], [r[1] for r in references])


@dataclass
class ReCoRDScorer:
    """References are (label, query key, entity, gold answers); outputs are (predicted label, positive-class
    log-probability) per candidate. Each query's prediction is its highest-scoring candidate entity."""

    needs_scores = True  # ClassificationModule then hands over (label, log p(positive)) per input

    def __call__(self, outputs: list, references: list) -> dict[str, float]:
        picked = pick_candidates([o[1] for o in outputs], [r[1] for r in references], [r[2] for r in references])
        answers = {r[1]: r[3] for r in references}
        return superglue_record_scores([picked[q] for q in picked], [answers[q] for q in picked])


def _cap_whole_groups(items: list, keys: list, cap: int) -> int:
    """How many leading items to keep so that at most ``cap`` remain without splitting a group (at least one
    whole group is kept)."""
    if len(items) <= cap:
        return len(items)
    end = cap
    while 0 < end < len(items) and keys[end] == keys[end - 1]:
        end -= 1
    if end == 0:  # the first group alone is larger than the cap
        end = 1
        while end < len(items) and keys[end] == keys[0]:
            end += 1
    return end


@register_task_family("glue")
def load_glue(cfg: dict[str, Any], seed: int) -> TaskData:
    scheme = cfg.get("scheme", "classify")
    if scheme not in SCHEMES:
        raise DataError(f"task.scheme={scheme!r}; valid: {', '.join(SCHEMES)}")
    if scheme == "multirc":
        return _load_multirc(cfg)
    if scheme == "record":
        return _load_superglue_record(cfg)
    label_values = cfg.get("label_values")
    label_values = [str(v) for v in label_values] if label_values is not None else None
    regression = label_values is None
    names = tuple(cfg["metrics"])
    unknown = [m for m in names if m not in METRICS]
    if unknown:
        raise DataError(f"task.metrics has {unknown[0]!r}; valid: {', '.join(METRICS)}")
    hub = cfg["source"] == "hub"
    raw = raw_splits(cfg)
    holdout = cfg.get("holdout_fraction")
    examples = {
        split: [(SEP.join(str(x).strip() for x in texts), _label_index(label, label_values, where, hub=hub))
                for texts, label, where in rows]
        for split, rows in raw.items()
    }
    for split in examples:
        cap = _cap(cfg, split)
        if cap:
            examples[split] = examples[split][:cap]
    num_classes = 1 if regression else len(label_values)
    metrics_text = (", ".join(f"{m}: {METRICS[m]} x 100" for m in names)
                    + ("; acc (module): accuracy as a fraction" if not regression
                       else "; mse (module): mean squared error"))
    return _classifier_task(
        cfg, examples, {split: [y for _, y in items] for split, items in examples.items() if split != "train"},
        tokenizer_text=[x for x, _ in examples["train"]], scorer=GlueScorer(names, num_classes),
        num_classes=num_classes, metrics_text=metrics_text,
        split_note=(f"; train/dev cut {1 - float(holdout):.0%}/{float(holdout):.0%} from the validation file "
                    f"(seed {cfg.get('seed_split', 0)})" if holdout else ""))


def raw_splits(cfg: dict[str, Any]) -> dict[str, list[tuple[list[Any], Any, str]]]:
    """(text fields, raw label, where) per example of every split of a ``classify`` task, after the seeded
    train/dev cut of a task whose only local file is the dev set (BoolQ); no split is empty."""
    raw = {split: _rows(cfg, split) for split in _split_names(cfg)}
    holdout = cfg.get("holdout_fraction")
    if holdout:  # only a dev file exists locally (BoolQ): cut it into train / dev, seeded
        rows = raw.pop("val")
        order = list(range(len(rows)))
        random.Random(int(cfg.get("seed_split", 0))).shuffle(order)
        n_dev = int(round(len(rows) * float(holdout)))
        raw["val"] = [rows[i] for i in sorted(order[:n_dev])]
        raw["train"] = [rows[i] for i in sorted(order[n_dev:])]
    _check_not_empty(cfg, raw)
    return raw


def labelled_splits(cfg: dict[str, Any]) -> dict[str, list[tuple[list[Any], float | int, str]]]:
    """``raw_splits`` with each label as its class index (or the STS-B score): the examples the classifier
    trains on, for other views of the same data (the text-to-text tasks, tasks/text_to_text.py)."""
    values = cfg.get("label_values")
    values = [str(v) for v in values] if values is not None else None
    hub = cfg["source"] == "hub"
    return {split: [(texts, _label_index(label, values, where, hub=hub), where) for texts, label, where in rows]
            for split, rows in raw_splits(cfg).items()}

def _cap(cfg: dict[str, Any], split: str) -> int | None:
    cap = cfg.get("max_train_examples") if split == "train" else cfg.get("max_eval_examples")
    return int(cap) if cap else None


def _check_not_empty(cfg: dict[str, Any], raw: dict[str, list]) -> None:
    for split, rows in raw.items():
        if not rows:
            where = cfg["hub_id"] if cfg["source"] == "hub" else cfg["files"].get(split, "?")
            raise DataError(f"{cfg['name']}: split {split} is empty ({where})")


def _split_names(cfg: dict[str, Any]) -> list[str]:
    return list(cfg["hub_splits"] if cfg["source"] == "hub" else cfg["files"])


def _distinct_fields(rows: list[list[Any]]) -> list[str]:
    """Each distinct text once: a paragraph repeated for every answer option or candidate must not weigh
    tens of times in the vocabulary's counts."""
    return list(dict.fromkeys(str(x).strip() for texts in rows for x in texts))


def _load_multirc(cfg: dict[str, Any]) -> TaskData:
    _check_scheme_metrics(cfg, MULTIRC_METRICS)
    label_values = [str(v) for v in cfg.get("label_values") or ["0", "1"]]
    if len(label_values) != 2:
        raise DataError(f"task.label_values={label_values}: MultiRC answer options are binary (false, true)")
    hub = cfg["source"] == "hub"
    raw = {split: _multirc_rows(cfg, split) for split in _split_names(cfg)}
    _check_not_empty(cfg, raw)
    for split, rows in raw.items():
        cap = _cap(cfg, split)
        if cap:
            raw[split] = rows[: _cap_whole_groups(rows, [r[3] for r in rows], cap)]
    examples, references = {}, {}
    for split, rows in raw.items():
        labels = [_label_index(label, label_values, where, hub=hub) for _, label, where, _ in rows]
        examples[split] = [(SEP.join(str(x).strip() for x in texts), y) for (texts, *_), y in zip(rows, labels)]
        references[split] = [(y, question) for y, (*_, question) in zip(labels, rows)]
    metrics_text = (", ".join(f"{m}: {MULTIRC_METRICS[m]} x 100" for m in cfg["metrics"])
                    + "; acc (module): per-option accuracy as a fraction")
    questions = {split: len({r[3] for r in rows}) for split, rows in raw.items()}
    return _classifier_task(
        cfg, examples, {k: v for k, v in references.items() if k != "train"},
        tokenizer_text=_distinct_fields([r[0] for r in raw["train"]]), scorer=MultircScorer(), num_classes=2,
        metrics_text=metrics_text,
        head=("binary classification of each (question [SEP] answer option [SEP] paragraph), as the "
              "non-generative SuperGLUE baselines; EM groups the options back per question"),
        counts={split: f"{len(rows)} options of {questions[split]} questions" for split, rows in raw.items()})


def _load_superglue_record(cfg: dict[str, Any]) -> TaskData:
    _check_scheme_metrics(cfg, SUPERGLUE_RECORD_METRICS)
    by_split: dict[str, list[Candidate]] = {}
    tokenizer_rows: list[list[str]] = []
    no_candidates = 0
    for split in _split_names(cfg):
        candidates: list[Candidate] = []
        for row, where in _release_rows(cfg, split, flatten_superglue_record):
            found = superglue_record_candidates(row, where)
            no_candidates += not found
            candidates.extend(found)
            if split == "train":
                tokenizer_rows.append([row["query"], row["passage"]])
        by_split[split] = candidates
    _check_not_empty(cfg, by_split)
    if no_candidates:
        log.warning("%s: %d queries have no candidate entities and are left out", cfg["name"], no_candidates)
    for split, items in by_split.items():
        cap = _cap(cfg, split)
        if cap:
            by_split[split] = items[: _cap_whole_groups(items, [c.query for c in items], cap)]
    examples = {split: [(c.text, c.label) for c in items] for split, items in by_split.items()}
    references = {split: [(c.label, c.query, c.entity, c.answers) for c in items]
                  for split, items in by_split.items() if split != "train"}
    metrics_text = (", ".join(f"{m}: {SUPERGLUE_RECORD_METRICS[m]} x 100" for m in cfg["metrics"])
                    + "; acc (module): per-candidate binary accuracy as a fraction")
    queries = {split: len({c.query for c in items}) for split, items in by_split.items()}
    return _classifier_task(
        cfg, examples, references, tokenizer_text=_distinct_fields(tokenizer_rows), scorer=ReCoRDScorer(),
        num_classes=2, metrics_text=metrics_text,
        head=("candidate-entity scoring, as the non-generative SuperGLUE baselines: each candidate entity is "
              "substituted into the query's @placeholder ([SEP] the passage) and classified answer / not answer; "
              "a query's prediction is its candidate with the highest positive-class log-probability (log-softmax "
              "of the two logits: a raw logit is not comparable across inputs)"),
        counts={split: f"{len(items)} candidates of {queries[split]} queries" for split, items in by_split.items()},
        extra_data=(f"; {no_candidates} queries without candidate entities left out" if no_candidates else ""))


def _check_scheme_metrics(cfg: dict[str, Any], valid: dict[str, str]) -> None:
    unknown = [m for m in cfg["metrics"] if m not in valid]
    if unknown or not cfg["metrics"]:
        raise DataError(f"task.metrics has {unknown[0] if unknown else 'nothing'!r} for scheme "
                        f"{cfg['scheme']}; valid: {', '.join(valid)}")


def _classifier_task(cfg: dict[str, Any], examples: dict[str, list[tuple[str, Any]]], references: dict[str, list],
                     *, tokenizer_text: list[str], scorer, num_classes: int, metrics_text: str, split_note: str = "",
                     head: str | None = None, counts: dict[str, str] | None = None,
                     extra_data: str = "") -> TaskData:
    """Tokenize, cut at ``max_seq_len`` (counted, logged and recorded) and wrap into a classifier TaskData."""
    regression = num_classes == 1
    t = cfg["tokenizer"]
    tok = build_tokenizer(t.get("kind", "wordpiece"), tokenizer_text,
                          vocab_size=int(t.get("vocab_size", 8000)), lowercase=bool(t.get("lowercase", True)),
                          min_frequency=int(t.get("min_frequency", 2)), cache_dir=cfg.get("tokenizer_cache"))
    limit = int(cfg["max_seq_len"])
    labelled, cut = {}, {}
    for split, items in examples.items():
        ids = encode_all(tok, [x for x, _ in items], cache_dir=cfg.get("tokenizer_cache"))
        cut[split] = sum(len(i) > limit for i in ids)
        ids = [i[:limit] or [3] for i in ids]  # an empty text becomes one <unk>, never a zero-length row
        labelled[split] = [(i, y) for i, (_, y) in zip(ids, items)]
    truncation = ", ".join(f"{split} {n} of {len(examples[split])}" for split, n in cut.items())
    if any(cut.values()):
        log.warning("%s: inputs longer than max_seq_len=%d tokens were cut: %s", cfg["name"], limit, truncation)
    eval_splits = dict(cfg.get("eval_splits") or {"test": "val"})
    flavours = {
        "metrics": metrics_text,
        "split": f"'test' metrics are on {', '.join(f'{k}={v}' for k, v in eval_splits.items())} "
                 "(GLUE/SuperGLUE test labels are hidden: dev-set results, as the papers' dev tables)" + split_note,
        "model": f"from scratch, {t.get('kind', 'wordpiece')} vocabulary of {tok.get_vocab_size()}, inputs joined "
                 f"with [SEP], cut at {limit} tokens ({sum(cut.values())} cut)",
        "truncation": f"inputs cut at max_seq_len={limit} tokens: {truncation}",
    }
    if head:
        flavours["head"] = head
    if cfg.get("stand_in"):
        flavours["data"] = f"STAND-IN: {cfg['stand_in']}"
    if extra_data:
        flavours["data"] = (flavours.get("data", "") + extra_data).lstrip("; ")
    counts = counts or {split: str(len(items)) for split, items in examples.items()}
    return indexed_classification_task(
        labelled,
        vocab_size=tok.get_vocab_size(),
        num_classes=num_classes,
        regression=regression,
        eval_splits=eval_splits,
        metric_flavours=flavours,
        description=f"{cfg['name']}: " + ", ".join(f"{k} {v}" for k, v in counts.items()),
        score_text=scorer,
        references=references,
    )
