"""bAbI QA tasks 1-20 v1.2 (Weston et al. 2015; UT Table 1), ``en`` (1k) or ``en-10k``, single-task or joint.

Head: classification over the answer vocabulary, as tensor2tensor's bAbI problems (which the UT paper used)
treat the answer: multi-word answers (task 8 lists "apple,football", task 19 paths "n,e") are one class each.
The input is the story (the non-question sentences before the question, at most ``max_story_sentences``
most recent ones, all by default) followed by ``<q>`` and the question, word-level, lower-cased.

The label set is the answers of the train and test files of the chosen tasks (the closed answer inventory;
no test example can then have an answer the head cannot output). Validation is the last ``val_fraction`` of
each task's training questions (as the official ``en-valid`` split). Metrics: accuracy, per-task error, mean
error and the number of failed tasks (error > 5%), the UT / MemN2N reporting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from attnlab.metrics.classification import babi_scores
from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.batching import indexed_classification_task
from attnlab.tasks.registry import register_task_family
from attnlab.tasks.sources import read_lines, resolve_data_root
from attnlab.tasks.tokenization import build_tokenizer, encode_all

_WORDS = re.compile(r"\w+|[^\w\s]")
QUESTION = "<q>"


def parse_babi(lines: list[str], path: str = "?") -> list[tuple[list[str], str, str]]:
    """(story sentences, question, answer) per question line of one bAbI file."""
    out = []
    story: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        head, _, text = line.partition(" ")
        if not head.isdigit():
            raise DataError(f"{path}:{number}: expected '<n> <sentence>' (bAbI format)")
        if head == "1":
            story = []
        if "\t" in text:
            parts = text.split("\t")
            if len(parts) < 2 or not parts[1].strip():
                raise DataError(f"{path}:{number}: question line without an answer")
            out.append((list(story), parts[0].strip(), parts[1].strip()))
        else:
            story.append(text.strip())
    return out


def task_file(root, variant: str, task: int, split: str):
    folder = root / "babi" / "tasks_1-20_v1-2" / variant
    matches = sorted(folder.glob(f"qa{task}_*_{split}.txt")) + sorted(folder.glob(f"qa{task}_*_{split}.txt.gz"))
    if not matches:
        raise DataError(f"bAbI file qa{task}_*_{split}.txt[.gz] not found in {folder}"
                        + ("; en-10k qa3 train is missing from the shared copy: use variant=en or drop task 3"
                           if variant == "en-10k" and task == 3 else "; set paths.data_root"))
    return matches[0]


def words(text: str) -> str:
    return " ".join(_WORDS.findall(text.lower()))


@dataclass
class BabiScorer:
    """References are (answer class, task id); outputs are predicted classes."""

    def __call__(self, predictions: list[int], references: list[tuple[int, int]]) -> dict[str, float]:
        return babi_scores(predictions, [r[0] for r in references], [r[1] for r in references])


@register_task_family("babi")
def load_babi(cfg: dict[str, Any], seed: int) -> TaskData:
    tasks = list(range(1, 21)) if cfg["tasks"] in ("all", None) else [int(t) for t in cfg["tasks"]]
    bad = [t for t in tasks if not 1 <= t <= 20]
    if bad:
        raise DataError(f"task.tasks has {bad[0]}; bAbI tasks are 1..20")
    if len(tasks) > 1 and not cfg.get("joint", True):
        raise DataError("task.joint=false trains one task: set task.tasks to one task id (one run per task)")
    root = resolve_data_root(cfg["data_root"])
    variant = cfg["variant"]
    cap = cfg.get("max_story_sentences")
    splits: dict[str, list[tuple[str, str, int]]] = {"train": [], "val": [], "test": []}
    for task in tasks:
        for split in ("train", "test"):
            path = task_file(root, variant, task, split)
            rows = [(story[-cap:] if cap else story, q, a) for story, q, a in parse_babi(read_lines(path), str(path))]
            if not rows:
                raise DataError(f"{path}: no questions")
            if cfg.get("max_questions_per_task"):
                rows = rows[: int(cfg["max_questions_per_task"])]
            items = [(" ".join(words(s) for s in story) + f" {QUESTION} " + words(q), a, task)
                     for story, q, a in rows]
            if split == "train":
                n_val = int(round(len(items) * float(cfg["val_fraction"])))
                splits["train"].extend(items[: len(items) - n_val])
                splits["val"].extend(items[len(items) - n_val:])
            else:
                splits["test"].extend(items)
    answers = sorted({a for items in splits.values() for _, a, _ in items})
    label = {a: i for i, a in enumerate(answers)}
    tok = build_tokenizer("word", [x for x, _, _ in splits["train"]], vocab_size=0, min_frequency=1,
                          cache_dir=cfg.get("tokenizer_cache"))
    labelled = {}
    for split, items in splits.items():
        ids = encode_all(tok, [x for x, _, _ in items], cache_dir=cfg.get("tokenizer_cache"))
        labelled[split] = [(i, label[a]) for i, (_, a, _) in zip(ids, items)]
    name = "joint" if len(tasks) > 1 else f"qa{tasks[0]}"
    return indexed_classification_task(
        labelled,
        vocab_size=tok.get_vocab_size(),
        num_classes=len(answers),
        eval_splits={"test": "test"},
        metric_flavours={
            "acc": "accuracy over all test questions of the chosen tasks",
            "error_qaN/mean_error": "per-task test error (%) and its mean over the tasks run",
            "failed_tasks": "number of tasks with test error > 5% (UT Table 1)",
            "head": f"classification over {len(answers)} answers (multi-word answers are one class)",
            "data": f"bAbI v1.2 {variant}, tasks {tasks if len(tasks) < 20 else '1-20'} ({name}), "
                    f"val = last {cfg['val_fraction']:.0%} of each train file"
                    + (f", story cut to the last {cap} sentences" if cap else ""),
        },
        detokenize=None,
        description=f"bAbI {variant} {name}: train {len(splits['train'])}, val {len(splits['val'])}, "
                    f"test {len(splits['test'])} questions",
        score_text=BabiScorer(),
        references={split: [(label[a], t) for _, a, t in items] for split, items in splits.items() if split != "train"},
    )
