"""GLUE and SuperGLUE in T5's text-to-text form (Raffel et al. 2020), one task or a mixture trained together.

Each member of ``task.members`` is an ordinary ``glue`` task config (``conf/task/glue/*``,
``conf/task/superglue/*``): its rows are read by ``tasks/glue.py`` (local files or the hub, BoolQ's 80/20 cut)
and rewritten as T5 does (``t5.data.preprocessors.glue``, ``stsb``, ``wsc``; ``t5.data.glue_utils``):

- input ``"<task> <field>: <text> <field>: <text>"``, fields sorted by name (MNLI: ``mnli hypothesis: ...
  premise: ...``; WiC: sentence1, sentence2, word); WSC marks the noun with ``*`` and the pronoun with ``#``
  (``wsc text: # This # is a * test * sentence .``), the span text matched literally (T5 puts it in a regex);
- target: T5's label word (CoLA ``unacceptable`` / ``acceptable``, MNLI ``entailment`` / ``neutral`` /
  ``contradiction``, BoolQ / WiC / WSC ``False`` / ``True`` ...); STS-B the score rounded to the nearest 0.2
  and written with one decimal (``3.8``; Python's round, like TF's, rounds halves to even).

Mixing: examples-proportional with an artificial size limit K (T5 Sec. 3.5.2): member m is drawn with rate
min(n_m, K)^(1/T) / sum_k min(n_k, K)^(1/T) (temperature T = 1 by default). One epoch lays out
``epoch_examples`` slots (default sum_m min(n_m, K)) split by the rates; a member's slots walk through
seeded permutations of its examples, so a member larger than its share shows a seeded subset per epoch
(raise ``mixing.epoch_examples`` to cycle through all of it). T5's GLUE and SuperGLUE mixtures weight the
tasks by their example counts; none of their training sets exceeds K = 2^19.

Evaluation: greedy decoding of each member's dev split; the generated text is mapped back to a label by exact
match with a label word (T5's ``string_label_to_class_id``) and anything else counts wrong: accuracy counts
it as a miss, binary F1 as the other class (T5's ``f1_score_with_invalid``), MCC as a class of its own (as
sklearn's on T5's -1), CB's macro-F1 as a miss for its gold class (sklearn's ``labels=range(3)``). STS-B
parses a float; text that is not a number scores -1 (T5's ``string_to_float``). Scores come from
``metrics.classification`` (torchmetrics) x 100, against the official gold labels (STS-B: the unrounded
score, where T5 compared with its rounded targets). Keys are ``test/<task>/<metric>`` (MNLI mismatched:
``test/mnli_mismatched/acc``), ``test/<task>/invalid`` (% of generations that are no label) and
``test/<benchmark>_average``: T5's benchmark score, the mean over tasks of each task's score, where a task
with two numbers (MRPC F1/acc, STS-B Pearson/Spearman, QQP F1/acc, MNLI matched/mismatched, CB F1/acc)
contributes their mean.

Members whose data is hub-only (QQP, MNLI, QNLI on our machines) are skipped when the hub is unreachable,
with a logged line, and named in ``metric_flavours.skipped``; the average then covers the tasks present and
says which. The vocabulary is the span-corruption pre-training's (``task.vocabulary``, tasks/span_corruption.py),
so ``init_from=<pre-training checkpoint>`` fits the model.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from torchmetrics.functional.classification import multiclass_f1_score, multiclass_matthews_corrcoef

from attnlab.decoding.options import DecodingOptions
from attnlab.metrics.classification import METRICS, classification_scores
from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.batching import IndexedDataset
from attnlab.tasks.glue import labelled_splits
from attnlab.tasks.registry import register_task_family
from attnlab.tasks.schemas import with_defaults
from attnlab.tasks.sources import HubUnavailable
from attnlab.tasks.span_corruption import shared_vocabulary
from attnlab.tasks.t5_formats import T5_FORMATS, T5Format
from attnlab.tasks.tokenization import UNK_ESCAPE, Detokenizer, encode_all

log = logging.getLogger("attnlab")

INVALID = -1  # a generation that is no label word (T5's default class id)
INVALID_SCORE = -1.0  # STS-B text that is no number (T5's string_to_float default)


# -- from generated text back to labels, and scores ----------------------------------------------------------
def parse_label(text: str, label_texts: tuple[str, ...]) -> int:
    """The class whose label word the text is (exactly, spaces around ignored), else INVALID."""
    text = text.strip()
    return label_texts.index(text) if text in label_texts else INVALID


def parse_score(text: str) -> float:
    """STS-B: the text as a number, else INVALID_SCORE (T5's string_to_float)."""
    try:
        value = float(text.strip())
    except ValueError:
        return INVALID_SCORE
    return value if math.isfinite(value) else INVALID_SCORE


def t5_scores(predictions: list[float], golds: list[float], names: tuple[str, ...],
              num_classes: int) -> dict[str, float]:
    """The task's official metrics x 100 with invalid predictions (INVALID) counted wrong, as T5 does."""
    if num_classes == 1:
        # A constant prediction (e.g. every generation unparsable) has no correlation: scipy says NaN, which
        # would blank the benchmark average; it is scored 0 (no correlation) instead.
        with warnings.catch_warnings():  # torchmetrics warns about the constant input; handled right below
            warnings.filterwarnings("ignore", message=".*variance of predictions or target is close to zero.*")
            scores = classification_scores(predictions, golds, names, num_classes)
        return {k: v if math.isfinite(v) else 0.0 for k, v in scores.items()}
    if all(p != INVALID for p in predictions):
        return classification_scores(predictions, golds, names, num_classes)
    out: dict[str, float] = {}
    p = torch.tensor([num_classes if x == INVALID else int(x) for x in predictions])  # invalid: an extra class
    t = torch.tensor([int(x) for x in golds])
    for name in names:
        if name == "acc":
            out[name] = 100.0 * float((p == t).double().mean())
        elif name == "f1":  # T5's f1_score_with_invalid: an invalid prediction is set to the other class
            flipped = [1 - g if x == INVALID else x for x, g in zip(predictions, golds)]
            out.update(classification_scores(flipped, golds, ("f1",), num_classes))
        elif name == "mcc":  # sklearn's MCC on T5's -1: the invalid class is a class of its own
            out[name] = 100.0 * float(multiclass_matthews_corrcoef(p, t, num_classes=num_classes + 1))
        elif name == "macro_f1":  # sklearn's F1 over labels=range(n): an invalid prediction only misses its gold
            per_class = multiclass_f1_score(p, t, num_classes=num_classes + 1, average=None)
            out[name] = 100.0 * float(per_class[:num_classes].mean())
        else:
            raise DataError(f"metric {name!r} is not defined for text-to-text classification; "
                            f"valid: {', '.join(METRICS)}")
    return out


@dataclass
class EvalGroup:
    """One scored evaluation set: its member, metrics, and the label texts as the model spells them."""

    member: str
    metrics: tuple[str, ...]
    num_classes: int
    label_texts: tuple[str, ...] | None  # None: STS-B (parse a float)


@dataclass
class TextToTextScorer:
    """Per-group official metrics, invalid rates and the benchmark average (T5's GLUE / SuperGLUE score)."""

    groups: dict[str, EvalGroup]
    benchmark: str

    def __call__(self, hypotheses: list[str], references: list[tuple[str, float]]) -> dict[str, float]:
        by_group: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
        for text, (group, gold) in zip(hypotheses, references):
            spec = self.groups[group]
            pred = parse_score(text) if spec.label_texts is None else parse_label(text, spec.label_texts)
            by_group[group][0].append(pred)
            by_group[group][1].append(gold)
        out: dict[str, float] = {}
        per_member: dict[str, list[float]] = defaultdict(list)
        for group in sorted(by_group):
            preds, golds = by_group[group]
            spec = self.groups[group]
            for name, value in t5_scores(preds, golds, spec.metrics, spec.num_classes).items():
                out[f"{group}/{name}"] = value
                per_member[spec.member].append(value)
            bad = INVALID_SCORE if spec.label_texts is None else INVALID
            out[f"{group}/invalid"] = 100.0 * sum(p == bad for p in preds) / len(preds)
        if per_member:
            out[f"{self.benchmark}_average"] = benchmark_average(per_member)
        return out


def benchmark_average(per_member: dict[str, list[float]]) -> float:
    """T5's GLUE / SuperGLUE score: the mean over tasks of each task's mean metric."""
    return sum(sum(v) / len(v) for v in per_member.values()) / len(per_member)


# -- mixing -------------------------------------------------------------------------------------------------
def mixing_rates(sizes: dict[str, int], *, cap: int | None, temperature: float = 1.0) -> dict[str, float]:
    """Examples-proportional rates with an artificial size limit K (``cap``) and temperature (T5 Sec. 3.5.2)."""
    if cap is not None and int(cap) < 1:
        raise DataError(f"task.mixing.cap={cap}; it must be a positive number of examples or null (no limit)")
    if temperature <= 0:
        raise DataError(f"task.mixing.temperature={temperature}; it must be positive (1: examples-proportional)")
    weights = {k: float(min(n, int(cap)) if cap else n) ** (1.0 / temperature) for k, n in sizes.items()}
    total = sum(weights.values())
    if total <= 0:
        raise DataError("the text-to-text mixture has no training examples")
    return {k: w / total for k, w in weights.items()}


def mixture_slots(rates: dict[str, float], epoch_examples: int) -> dict[str, int]:
    """round(rate * epoch_examples) per member, by largest remainder so the slots add up exactly."""
    raw = {k: r * epoch_examples for k, r in rates.items()}
    slots = {k: int(math.floor(v)) for k, v in raw.items()}
    rest = epoch_examples - sum(slots.values())
    for k in sorted(raw, key=lambda k: (-(raw[k] - slots[k]), k))[:rest]:
        slots[k] += 1
    return slots


class MixtureDataset(Dataset):
    """One epoch of a mixture: ``slots[m]`` consecutive indices per member; slot s of member m is example
    ``perm_c[s % n_m]`` of a seeded permutation per lap c = s // n_m over the member's examples."""

    def __init__(self, members: dict[str, list[tuple[list[int], list[int]]]], slots: dict[str, int], seed: int):
        self.names = [k for k in members if slots.get(k, 0) > 0]
        self.examples = [members[k] for k in self.names]
        self.offsets = np.cumsum([0, *(slots[k] for k in self.names)])
        self.seed = seed
        self._perms: dict[tuple[int, int], np.ndarray] = {}

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, i: int) -> tuple[str, int]:
        """(member, its example index) of mixture index ``i``."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"example {i} out of range for {len(self)}")  # ends plain iteration
        i %= len(self)
        m = int(np.searchsorted(self.offsets, i, side="right")) - 1
        lap, pos = divmod(i - int(self.offsets[m]), len(self.examples[m]))
        if (m, lap) not in self._perms:
            self._perms[(m, lap)] = np.random.default_rng([self.seed, m, lap]).permutation(len(self.examples[m]))
        return self.names[m], int(self._perms[(m, lap)][pos])

    def __getitem__(self, i: int):
        name, j = self.locate(i)
        src, tgt = self.examples[self.names.index(name)][j]
        return src, tgt, i % len(self)


# -- the task -----------------------------------------------------------------------------------------------
@dataclass
class _Member:
    key: str
    cfg: dict[str, Any]
    fmt: T5Format
    splits: dict[str, list] = field(default_factory=dict)


def _member_config(key: str, member: dict[str, Any]) -> tuple[dict[str, Any], T5Format]:
    cfg = with_defaults(dict(member))
    cfg.pop("at_scale", None)
    fmt = T5_FORMATS.get(cfg.get("name"))
    if fmt is None:
        raise DataError(f"task.members.{key} is {cfg.get('name')!r}, which has no T5 text-to-text format; "
                        f"formats: {', '.join(sorted(T5_FORMATS))}")
    if cfg.get("scheme", "classify") != "classify":
        raise DataError(f"task.members.{key}: scheme {cfg['scheme']!r} has no text-to-text form here")
    if fmt.local_fields and cfg["source"] == "local":
        cfg["text_fields"] = list(fmt.local_fields)
    if fmt.hub_fields:
        cfg["hub_text_fields"] = list(fmt.hub_fields)
    return cfg, fmt


def _selected(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    members = dict(cfg.get("members") or {})
    if not members:
        raise DataError("task.members is empty; list the glue/superglue task configs to train on")
    wanted = cfg.get("tasks")
    if wanted is None:
        return members
    wanted = [wanted] if isinstance(wanted, str) else list(wanted)
    unknown = [w for w in wanted if w not in members]
    if unknown or not wanted:
        raise DataError(f"task.tasks={wanted}: {unknown[0] if unknown else 'empty'}; valid: {', '.join(members)}")
    return {k: members[k] for k in wanted}


def _group_name(key: str, prefix: str) -> str:
    return key if prefix == "test" else f"{key}_{prefix.removeprefix('test_')}"


def _cap(value: Any) -> int | None:
    return int(value) if value else None


@register_task_family("text_to_text")
def load_text_to_text(cfg: dict[str, Any], seed: int) -> TaskData:
    selected = _selected(cfg)
    vocab = shared_vocabulary(cfg["vocabulary"], data_root=cfg["data_root"], cache_dir=cfg.get("tokenizer_cache"))
    tok, detok = vocab.tokenizer, Detokenizer(vocab.tokenizer)
    members: list[_Member] = []
    skipped: list[str] = []
    for key, raw in selected.items():
        member_cfg, fmt = _member_config(key, raw)
        try:
            splits = labelled_splits(member_cfg)
        except HubUnavailable:  # neither in the local Hugging Face cache nor downloadable
            if member_cfg["source"] != "hub" or not cfg.get("skip_unavailable", True):
                raise
            where = f"{member_cfg['hub_id']}/{member_cfg.get('hub_config')}"
            log.warning("%s: skipping %s: its data is hub-only (%s), not in the local Hugging Face cache, "
                        "and the hub is unreachable", cfg["name"], member_cfg["name"], where)
            skipped.append(f"{member_cfg['name']} (hub-only: {where})")
            continue
        members.append(_Member(key, member_cfg, fmt, splits))
    if not members:
        raise DataError(f"{cfg['name']}: no member has data here (skipped: {'; '.join(skipped)}); use local members "
                        f"(task.tasks=...) or run with network access")

    limit = int(cfg["input_length"]) - 1  # the collate appends EOS
    max_eval, max_val = _cap(cfg.get("max_eval_examples")), _cap(cfg.get("max_val_examples"))
    train: dict[str, list] = {}
    val: list = []
    test: list = []
    test_refs: list = []
    groups: dict[str, EvalGroup] = {}
    cut = {"train": 0, "eval": 0}

    def encode(member: _Member, rows: list, what: str) -> list[tuple[list[int], list[int], float]]:
        texts = []
        for values, label, where in rows:
            if len(values) != len(member.fmt.fields):
                raise DataError(f"{where}: {len(values)} text fields, the T5 format of {member.cfg['name']} needs "
                                f"{len(member.fmt.fields)} ({', '.join(member.fmt.fields)})")
            texts.append((member.fmt.inputs(values), member.fmt.target(label)))
        src = encode_all(tok, [x for x, _ in texts], cache_dir=cfg.get("tokenizer_cache"))
        tgt = encode_all(tok, [y for _, y in texts], cache_dir=cfg.get("tokenizer_cache"))
        cut[what] += sum(len(s) > limit for s in src)
        longest = max((len(t) for t in tgt), default=0)
        if longest >= int(cfg["target_length"]):
            raise DataError(f"{member.cfg['name']}: a target is {longest} tokens; raise task.target_length "
                            f"(now {cfg['target_length']})")
        return [(s[:limit], t, label) for s, t, (_, label, _) in zip(src, tgt, rows)]

    for member in members:
        train_rows = member.splits["train"]
        cap = _cap(member.cfg.get("max_train_examples"))
        train[member.key] = [(s, t) for s, t, _ in encode(member, train_rows[:cap] if cap else train_rows, "train")]
        num_classes = 1 if member.fmt.labels is None else len(member.fmt.labels)
        label_texts = None if member.fmt.labels is None else tuple(
            detok(ids) for ids in encode_all(tok, list(member.fmt.labels), cache=False))
        unspellable = label_texts is not None and any(UNK_ESCAPE in x for x in label_texts)
        if label_texts is not None and (len(set(label_texts)) < num_classes or unspellable):
            raise DataError(f"{member.cfg['name']}: the vocabulary spells the label words {member.fmt.labels} as "
                            f"{label_texts}; they must come back distinct and without <unk>")
        eval_splits = dict(member.cfg.get("eval_splits") or {"test": "val"})
        for n, (prefix, split) in enumerate(eval_splits.items()):
            if split not in member.splits:
                raise DataError(f"{member.cfg['name']}: eval split {split!r} does not exist; it has "
                                f"{', '.join(member.splits)}")
            group = _group_name(member.key, prefix)
            groups[group] = EvalGroup(member.key, tuple(member.cfg["metrics"]), num_classes, label_texts)
            rows = member.splits[split]
            encoded = encode(member, rows[:max_eval] if max_eval else rows, "eval")
            test.extend((s, t) for s, t, _ in encoded)
            test_refs.extend((group, gold) for _, _, gold in encoded)
            if n == 0:
                kept = encoded[:max_val] if max_val else encoded
                val.extend((s, t) for s, t, _ in kept)
    for what, count in cut.items():
        if count:
            log.warning("%s: cut %d %s inputs to task.input_length=%s tokens (EOS included)", cfg["name"], count,
                        what, cfg["input_length"])

    mixing = dict(cfg.get("mixing") or {})
    sizes = {k: len(v) for k, v in train.items()}
    rates = mixing_rates(sizes, cap=_cap(mixing.get("cap")), temperature=float(mixing.get("temperature") or 1.0))
    cap = _cap(mixing.get("cap"))
    epoch = _cap(mixing.get("epoch_examples")) or sum(min(n, cap) if cap else n for n in sizes.values())
    slots = mixture_slots(rates, epoch)
    mixture_seed = seed if mixing.get("seed") is None else int(mixing["seed"])
    datasets = {"train": MixtureDataset(train, slots, mixture_seed), "val": IndexedDataset(val),
                "test": IndexedDataset(test)}

    decoding = DecodingOptions.of(cfg.get("decoding"))
    longest_tgt = max(len(t) for d in (val, test) for _, t in d)
    short_decoding = None
    if decoding.max_len_a == 0.0 and decoding.max_len_b < longest_tgt + 1:
        # Allowed (a smoke test may cap decoding), but every longer label then scores as invalid: say so.
        short_decoding = (f"task.decoding.max_len_b={decoding.max_len_b} is shorter than the longest label "
                          f"({longest_tgt} tokens + EOS): such labels cannot be generated and count wrong")
        log.warning("%s: %s", cfg["name"], short_decoding)
    longest_src = max(len(s) for d in (val, test) for s, _ in d)
    longest_src = max(longest_src, *(len(s) for v in train.values() for s, _ in v))
    present = [m.key for m in members]
    flavours = {
        "format": "T5 text-to-text (t5.data.preprocessors glue/stsb/wsc): '<task> <field>: <text> ...', fields sorted "
                  "by name (WiC: sentence1, sentence2, word; WSC: * noun *, # pronoun #); targets are T5's label "
                  "words, STS-B the score rounded to 0.2 with one decimal",
        "metrics": "greedy decoding; the text is mapped back to a label by exact match with a label word (T5's "
                   "string_label_to_class_id); other text counts wrong (acc: a miss; binary F1: the other class, "
                   "T5's f1_score_with_invalid; MCC: a class of its own; macro-F1: a miss for its gold class); "
                   "STS-B parses a float (-1 if not a number) against the unrounded gold score, and a constant "
                   "prediction's undefined correlation counts 0; "
                   + ", ".join(f"{g}: {'/'.join(s.metrics)}" for g, s in groups.items())
                   + " (x 100, torchmetrics); <task>/invalid: % of generations that are no label",
        f"{cfg['benchmark']}_average": f"T5's {cfg['benchmark'].upper()} score: mean over the tasks present of each "
                                       f"task's score, a task with two numbers (e.g. F1/acc, Pearson/Spearman, "
                                       f"matched/mismatched) contributing their mean; over {', '.join(present)} "
                                       f"({len(present)} task(s))",
        "split": "test/* metrics are on each task's dev split (GLUE/SuperGLUE test labels are hidden), as the "
                 "papers' dev tables" + (f"; at most {max_eval} examples per task" if max_eval else ""),
        "mixing": f"examples-proportional (T5 Sec. 3.5.2), K = {cap or 'none'}, temperature "
                  f"{float(mixing.get('temperature') or 1.0)}, seed {mixture_seed}: rates "
                  + ", ".join(f"{k} {r:.3f}" for k, r in rates.items())
                  + f"; one epoch = {epoch} examples ({', '.join(f'{k} {n}' for k, n in slots.items())})",
        "vocabulary": vocab.description,
    }
    if cfg.get("note"):
        flavours["coverage"] = str(cfg["note"])
    if short_decoding:
        flavours["decoding_limit"] = short_decoding
    if skipped:
        flavours["skipped"] = ("not in the mixture, the scores nor the average: " + "; ".join(skipped)
                               + " - the hub is unreachable here")
    notes = [f"{m.cfg['name']}: {m.cfg['stand_in']}" for m in members if m.cfg.get("stand_in")]
    if notes:
        flavours["data"] = "STAND-IN: " + "; ".join(notes)
    log.info("%s: mixture %s", cfg["name"], flavours["mixing"])
    return vocab.seq2seq_task(
        datasets,
        max_len=max(longest_src + 1, longest_tgt + 2),
        metric_flavours=flavours,
        train_lengths=[len(s) + 1 for v in train.values() for s, _ in v[:500]],
        detokenize=detok,
        description=f"{cfg['name']} (text-to-text): " + ", ".join(f"{k} {n}" for k, n in sizes.items())
        + f" training examples; {len(test)} evaluation examples" + (f"; skipped {len(skipped)}" if skipped else ""),
        score_text=TextToTextScorer(groups, cfg["benchmark"]),
        references={"test": test_refs},
    )
