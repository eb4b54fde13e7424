"""Trivial baselines: what a model scores on a task without learning what the task is about.

A claim that one row beats another says nothing when neither row does better than an answer that ignores the
input (issue 37): bAbI answered without reading the story, a translation that copies the source, a summary made
of the document's first sentences. Each baseline here is computed from the task's own data, read the way its
loader reads it, and scored with the task's own scorer, so it lands in the same units as the run records' metrics
(``test/mean_error``, ``test/bleu``, ...). ``attnlab-baselines`` computes them for the run configurations behind
every table and writes ``results/baselines/``; the table builder then requires the better of two compared rows to
beat its baseline before a claim between them gets a verdict.

Every baseline is a function ``(task config, seed) -> TrivialBaseline`` registered for the task loaders it
applies to; the config is the resolved ``task`` section of a run (``.hydra/config.yaml``).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attnlab.registry import Registry
from attnlab.tasks.base import DataError
from attnlab.tasks.build import build_task


@dataclass
class TrivialBaseline:
    """Metric name (as in a run record's ``metrics.final``) -> value, and what produced them."""

    name: str
    what: str  # one sentence: the output that ignores the input, and where it is fitted
    values: dict[str, float]
    inputs: list[str] = field(default_factory=list)  # data files read (relative to the data root)


@dataclass
class _Entry:
    fn: Callable[[dict[str, Any], int], TrivialBaseline]
    loaders: tuple[str, ...]


BASELINES: Registry[_Entry] = Registry("trivial baseline", DataError)


def register_baseline(name: str, *, loaders: tuple[str, ...]):
    def wrap(fn):
        BASELINES.register(name, _Entry(fn, loaders))
        return fn

    return wrap


def compute_baseline(name: str, task_cfg: dict[str, Any], seed: int) -> TrivialBaseline:
    """The named baseline of one task configuration; DataError (one line) when it does not apply or data is absent."""
    entry = BASELINES.get(name)
    loader = task_cfg.get("loader")
    if loader not in entry.loaders:
        raise DataError(f"trivial baseline {name!r} applies to task loaders {', '.join(entry.loaders)}, not "
                        f"{loader!r} (task {task_cfg.get('name')})")
    from attnlab.tasks.schemas import with_defaults

    return entry.fn(with_defaults(task_cfg), seed)


def _rel(path) -> str:
    parts = str(path).replace("\\", "/").split("/")
    return "/".join(parts[-3:])  # the data root differs between machines; the tail names the file


# --- bAbI: the answer from the question alone -------------------------------------------------------------


@register_baseline("story_free_answer", loaders=("babi",))
def story_free_answer(cfg: dict[str, Any], seed: int) -> TrivialBaseline:
    """Per task, the most frequent training answer to each exact question (the task's most frequent answer for a
    question never seen in training), scored with the task's scorer on the test file."""
    from attnlab.metrics.classification import babi_scores
    from attnlab.tasks.babi import parse_babi, task_file
    from attnlab.tasks.sources import read_lines, resolve_data_root

    root = resolve_data_root(cfg["data_root"])
    tasks = list(range(1, 21)) if cfg["tasks"] in ("all", None) else [int(t) for t in cfg["tasks"]]
    predictions, gold, task_ids, inputs = [], [], [], []
    cap = cfg.get("max_questions_per_task")
    for task in tasks:
        rows = {}
        for split in ("train", "test"):
            path = task_file(root, cfg["variant"], task, split)
            inputs.append(_rel(path))
            rows[split] = parse_babi(read_lines(path), str(path))[: int(cap) if cap else None]
        # the model trains on the first (1 - val_fraction) of each train file: the guess sees no more
        train = rows["train"][: len(rows["train"]) - int(round(len(rows["train"]) * float(cfg["val_fraction"])))]
        by_question: dict[str, Counter] = defaultdict(Counter)
        for _, question, answer in train:
            by_question[question][answer] += 1
        overall = Counter(a for _, _, a in train).most_common(1)[0][0]
        for _, question, answer in rows["test"]:
            guess = by_question[question].most_common(1)[0][0] if question in by_question else overall
            predictions.append(guess)
            gold.append(answer)
            task_ids.append(task)
    labels = {a: i for i, a in enumerate(sorted(set(predictions) | set(gold)))}
    scores = babi_scores([labels[p] for p in predictions], [labels[g] for g in gold], task_ids)
    values = {f"test/{k}": v for k, v in scores.items()}
    values["test/acc"] = sum(p == g for p, g in zip(predictions, gold)) / len(gold)
    return TrivialBaseline("story_free_answer", "the most frequent training answer to each exact question, "
                           "without the story", values, inputs)


# --- generated sequence tasks: one constant output ---------------------------------------------------------


def _constant_output_scores(targets: list[list[int]]) -> tuple[float, float]:
    """The best char. and seq. accuracy of one output string given to every example: per position the most
    frequent target symbol (fitted on the scored targets themselves: an upper bound for any output that ignores
    the input), at the best length; the seq. accuracy of the most frequent whole target."""
    total = sum(map(len, targets))
    longest = max(map(len, targets))
    per_position = [Counter(t[i] for t in targets if i < len(t)).most_common(1)[0][1] for i in range(longest)]
    best, running = 0, 0
    for n in range(longest):
        running += per_position[n]
        best = max(best, running)
    seq = Counter(tuple(t) for t in targets).most_common(1)[0][1] / len(targets)
    return best / max(total, 1), seq


@register_baseline("constant_output", loaders=("algorithmic", "lte"))
def constant_output(cfg: dict[str, Any], seed: int) -> TrivialBaseline:
    """The best single output string for every input, per evaluation split (the generated data as the loader
    makes it, from the run's data seed)."""
    task = build_task(cfg, seed)
    values = {}
    for prefix, split in task.eval_splits.items():
        char, seq = _constant_output_scores([list(y) for _, y in task.datasets[split].pairs])
        values[f"{prefix}/char_acc"], values[f"{prefix}/seq_acc"] = char, seq
    return TrivialBaseline("constant_output", "one constant output string for every input, fitted per position on "
                           "the scored targets (an upper bound for any input-blind output)", values)


# --- classification: the majority class ---------------------------------------------------------------------


@register_baseline("majority_class", loaders=("listops", "glue"))
def majority_class(cfg: dict[str, Any], seed: int) -> TrivialBaseline:
    """The most frequent training label (the mean training label for a regression task), given to every
    evaluation example and scored with the task's scorer (accuracy where it has none)."""
    task = build_task(cfg, seed)
    train_labels = [y for *_, y in _examples(task.datasets["train"])]
    if task.kind == "regression":
        constant: Any = sum(train_labels) / len(train_labels)
    else:
        constant = Counter(train_labels).most_common(1)[0][0]
    values = {}
    for prefix, split in task.eval_splits.items():
        labels = [y for *_, y in _examples(task.datasets[split])]
        plain = all(isinstance(r, (int, float)) for r in task.references.get(split) or [None])
        if task.score_text is not None and plain:  # MultiRC and ReCoRD score grouped answers: accuracy only
            # a constant has no correlation: scipy/torch give NaN, which the claims read as 0 (no relation)
            scores = task.score_text([constant] * len(task.references[split]), task.references[split])
            values.update({f"{prefix}/{k}": (0.0 if v != v else v) for k, v in scores.items()})
        if task.kind != "regression":
            values[f"{prefix}/acc"] = sum(y == constant for y in labels) / len(labels)
    return TrivialBaseline("majority_class", "the most frequent training label for every example" if
                           task.kind != "regression" else "the mean training score for every example", values)


def _examples(dataset) -> list[tuple]:
    return list(getattr(dataset, "examples", None) or dataset.pairs)


# --- text generation: copy the source, lead sentences, one constant reply -----------------------------------


@register_baseline("source_copy", loaders=("translation", "translation_mixture"))
def source_copy(cfg: dict[str, Any], seed: int) -> TrivialBaseline:
    """Each source sentence given as its own translation, scored with the task's BLEU (names, numbers and
    punctuation often match across languages, so this is not 0)."""
    from attnlab.tasks.translation import MTScorer, load_pairs

    tokenize = cfg.get("sacrebleu_tokenize", "13a")
    scorer = MTScorer(tokenize=tokenize, tokenized=bool(cfg.get("tokenized_bleu")), chrf=False)
    values = {}
    if cfg["loader"] == "translation":
        cap = cfg.get("max_eval_pairs")
        tests = {"test": cfg["test"], **(cfg.get("extra_tests") or {})}
        for prefix, spec in tests.items():
            pairs = load_pairs({**cfg, prefix: spec}, prefix)[: int(cap) if cap else None]
            values.update({f"{prefix}/{k}": v for k, v in scorer([s for s, _ in pairs], [t for _, t in pairs]).items()})
    else:
        from attnlab.tasks.translation_mixture import active_members

        split = cfg.get("eval_split", "val")
        cap = cfg.get("max_eval_pairs")
        bleus = []
        for key, member in active_members(cfg).items():
            member = {**member, "data_root": member.get("data_root") or cfg.get("data_root")}
            pairs = load_pairs(member, split)[: int(cap) if cap else None]
            scores = scorer([s for s, _ in pairs], [t for _, t in pairs])
            values.update({f"test/{key}/{k}": v for k, v in scores.items()})
            bleus.append(scores["bleu"])
        values["test/bleu_average"] = sum(bleus) / len(bleus)
    return TrivialBaseline("source_copy", "the source sentence copied as its translation", values)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def lead_sentences(text: str, count: int = 3) -> str:
    """The first ``count`` sentences of a document, one per line (a line of a chat transcript is a sentence)."""
    sentences = [s for line in text.strip().splitlines() for s in _SENTENCE_END.split(line.strip()) if s]
    return "\n".join(sentences[:count])


@register_baseline("lead_3", loaders=("summarization",))
def lead_3(cfg: dict[str, Any], seed: int) -> TrivialBaseline:
    """The document's first three sentences as its summary (Lead-3, See et al. 2017), scored with the task's ROUGE."""
    from attnlab.tasks.summarization import RougeScorer, normalise_reference, summary_rows

    rows = summary_rows(cfg, "test")
    cap = cfg.get("max_eval_pairs")
    rows = rows[: int(cap) if cap else None]
    hypotheses = [lead_sentences(r[cfg["source_field"]]) for r in rows]
    references = [normalise_reference(r[cfg["target_field"]]) for r in rows]
    return TrivialBaseline("lead_3", "the document's first three sentences as its summary",
                           {f"test/{k}": v for k, v in RougeScorer()(hypotheses, references).items()})


REPLY_CANDIDATES = 100  # the most frequent training replies tried as the constant
REPLY_SAMPLE = 2000  # training replies the candidates are scored against (seeded sample)


@register_baseline("constant_reply", loaders=("dialogue",))
def constant_reply(cfg: dict[str, Any], seed: int) -> TrivialBaseline:
    """One reply given to every test context, scored with the task's scorer: of the most frequent training replies,
    the one with the best BLEU-1 against the training replies (chosen on training data only; a short frequent
    reply alone would lose most of its BLEU to the brevity penalty)."""
    import random

    from attnlab.metrics.text import corpus_bleu
    from attnlab.tasks.dialogue import DialogueScorer, dialogue_split_pairs

    pairs, _ = dialogue_split_pairs(cfg)
    replies = [t for _, t in pairs["train"]]
    sample = random.Random(0).sample(replies, min(len(replies), REPLY_SAMPLE))
    candidates = [r for r, _ in Counter(replies).most_common(REPLY_CANDIDATES)]
    reply = max(candidates, key=lambda r: (corpus_bleu([r] * len(sample), sample, max_ngram_order=1), r))
    cap = cfg.get("max_eval_pairs")
    references = [t for _, t in pairs["test"]][: int(cap) if cap else None]
    scores = DialogueScorer()([reply] * len(references), references)
    return TrivialBaseline("constant_reply", f"one reply to every context ({reply!r}: of the {REPLY_CANDIDATES} most "
                           "frequent training replies, the best BLEU-1 on training replies)",
                           {f"test/{k}": v for k, v in scores.items()})



# --- language modelling: a unigram model of the training stream ------------------------------------------------


def _unigram_log2(train_ids, vocab_size: int):
    """log2 p(token) of an add-one (Laplace) unigram model of the training token stream, for every id."""
    import numpy as np

    counts = np.bincount(np.asarray(train_ids, dtype=np.int64), minlength=vocab_size).astype(np.float64) + 1.0
    return np.log2(counts / counts.sum())


@register_baseline("unigram", loaders=("text_lm", "masked_lm", "lambada"))
def unigram(cfg: dict[str, Any], seed: int) -> TrivialBaseline:
    """An add-one unigram model of the training token stream (the run's own tokenizer and blocks): the probability
    of a token regardless of its context, scored on the tokens the task scores (every target of the causal LM's
    test blocks; the masked positions of the masked LM's test blocks, masked from the task's eval_seed)."""
    import math

    import numpy as np

    task = build_task(cfg, seed)
    values: dict[str, float] = {}
    if cfg["loader"] == "lambada":  # the passages' last words (LM trained on another corpus: its unigram)
        log2p = _unigram_log2(task.datasets["train"].stream.numpy(), task.vocab_size)
        best = int(np.argmax(log2p))
        for prefix, split in task.eval_splits.items():
            nats = tokens_nats = tokens = right = 0.0
            passages = task.datasets[split]
            for item in passages.items:
                ids, mask = np.asarray(item["ids"][1:]), np.asarray(item["mask"][1:], dtype=bool)
                token_nats = -log2p[ids] * math.log(2)
                nats += float(token_nats[mask].sum())
                tokens_nats += float(token_nats.sum())
                tokens += len(ids)
                right += bool((ids[mask] == best).all())
            values.update({f"{prefix}/last_word_ppl": math.exp(nats / len(passages)),
                           f"{prefix}/last_word_acc": 100.0 * right / len(passages),
                           f"{prefix}/ppl": math.exp(tokens_nats / tokens)})
    elif cfg["loader"] == "text_lm":
        train = task.datasets["train"].stream.numpy()
        log2p = _unigram_log2(train, task.vocab_size)
        for prefix, split in task.eval_splits.items():
            data = task.datasets[split]
            targets = data.stream[1 : data.count * data.block_len + 1].numpy()
            nats = -float(log2p[targets].sum()) * math.log(2)
            values[f"{prefix}/loss"] = nats / len(targets)  # nats per token, as the LM module's test/loss
            values[f"{prefix}/ppl"] = math.exp(nats / len(targets))
            if data.flags is not None:  # subword tokens: per whitespace word (and line end) too
                words = int(data.flags[1 : data.count * data.block_len + 1].sum())
                values[f"{prefix}/word_ppl"] = math.exp(nats / words)
    else:
        train = task.datasets["train"].stream
        log2p = _unigram_log2(train, task.vocab_size)
        best = int(np.argmax(log2p))
        for prefix, split in task.eval_splits.items():
            data = task.datasets[split]
            bits = chars = right = count = 0.0
            for i in range(len(data)):
                block = data[i]
                scored = block["scored"].numpy()
                targets = block["target"].numpy()[scored]
                bits -= float(log2p[targets].sum())
                chars += float(block["chars"].numpy()[scored].sum())
                right += float((targets == best).sum())
                count += len(targets)
            values.update({f"{prefix}/mlm_acc": right / count, f"{prefix}/bits_per_token": bits / count,
                           f"{prefix}/bpc": bits / chars, f"{prefix}/loss": bits * math.log(2) / count})
    return TrivialBaseline("unigram", "an add-one unigram model of the training tokens (no context)", values)


@register_baseline("majority_answer", loaders=("text_to_text",))
def majority_answer(cfg: dict[str, Any], seed: int) -> TrivialBaseline:
    """T5's text-to-text GLUE / SuperGLUE mixture answered with each task's most frequent training label (a constant
    score for STS-B: no correlation), scored per task as the mixture scores it and averaged into the benchmark
    score the same way (:func:`attnlab.tasks.text_to_text.benchmark_average`). Hub-only members without data here
    are left out, as the run leaves them out."""
    from attnlab.tasks.glue import labelled_splits
    from attnlab.tasks.sources import HubUnavailable
    from attnlab.tasks.text_to_text import _group_name, _member_config, _selected, benchmark_average, t5_scores

    values: dict[str, float] = {}
    per_member: dict[str, list[float]] = {}
    max_eval = int(cfg["max_eval_examples"]) if cfg.get("max_eval_examples") else None
    for key, raw in _selected(cfg).items():
        member, fmt = _member_config(key, {**raw, "data_root": raw.get("data_root") or cfg.get("data_root")})
        try:
            splits = labelled_splits(member)
        except HubUnavailable:
            continue
        labels = [label for _, label, _ in splits["train"]]
        regression = fmt.labels is None
        constant = sum(labels) / len(labels) if regression else Counter(labels).most_common(1)[0][0]
        for prefix, split in dict(member.get("eval_splits") or {"test": "val"}).items():
            rows = splits[split][:max_eval] if max_eval else splits[split]
            golds = [label for _, label, _ in rows]
            scores = t5_scores([constant] * len(golds), golds, tuple(member["metrics"]),
                               1 if regression else len(fmt.labels))
            group = _group_name(key, prefix)
            values.update({f"test/{group}/{k}": v for k, v in scores.items()})
            per_member.setdefault(key, []).extend(scores.values())
    if per_member:
        values[f"test/{cfg['benchmark']}_average"] = benchmark_average(per_member)
    return TrivialBaseline("majority_answer", "each task's most frequent training answer for every example", values)


# --- mechanism probes: the answer from the scored token alone --------------------------------------------------


@register_baseline("query_only_answer", loaders=("probe",))
def query_only_answer(cfg: dict[str, Any], seed: int, *, fit_examples: int = 20000) -> TrivialBaseline:
    """The most frequent training answer to each (position, token) at a scored position, fitted on the first
    ``fit_examples`` training examples (the overall most frequent answer where that pair was never seen), scored
    on the test split: what a model gets from the query and its place without reading the rest of the sequence."""
    from attnlab.tasks.probes import SPLIT_STREAMS, ProbeDataset, ProbeLayout

    layout = ProbeLayout(cfg)
    data_seed = int(seed if cfg.get("data_seed") is None else cfg["data_seed"])

    def scored(split: str, size: int):
        data = ProbeDataset(cfg, layout, size=size, seed=data_seed, stream=SPLIT_STREAMS[split])
        for i in range(len(data)):
            example = data[i]
            where = example["scored"].nonzero().flatten().tolist()
            ids, target, group = (example[k].tolist() for k in ("ids", "target", "group"))
            for p in where:
                yield (p, ids[p]), target[p], group[p]

    answers: dict[tuple[int, int], Counter] = defaultdict(Counter)
    overall: Counter = Counter()
    for key, target, _ in scored("train", min(fit_examples, int(cfg["train_size"]))):
        answers[key][target] += 1
        overall[target] += 1
    fallback = overall.most_common(1)[0][0]
    best = {key: counts.most_common(1)[0][0] for key, counts in answers.items()}
    right: Counter = Counter()
    total: Counter = Counter()
    for key, target, group in scored("test", int(cfg["test_size"])):
        hit = best.get(key, fallback) == target
        for g in {0, group}:
            right[g] += hit
            total[g] += 1
    values = {"test/mlm_acc": right[0] / total[0]}
    values.update({f"test/acc_h{g}": right[g] / total[g] for g in sorted(total) if g})
    return TrivialBaseline("query_only_answer", "the most frequent training answer to the scored token at its "
                           f"position (fitted on {min(fit_examples, int(cfg['train_size']))} training examples), "
                           "without reading the rest of the sequence", values)
