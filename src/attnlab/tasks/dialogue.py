"""PersonaChat / ConvAI2 (self_original) response generation: persona + recent history -> the bot's reply.

ParlAI text format: ``N your persona: ...`` lines, then ``N <partner utterance>\\t<bot reply>`` lines; N
restarts at 1 for each dialogue. Each exchange line is one example. The local copy has the validation file
only, so ``split_fractions`` cuts it into train/val/test BY DIALOGUE (no dialogue in two splits); with the
official train file present, ``files`` names one file per split and ``split_fractions`` is left empty.

Metrics (offline): corpus BLEU-1 and BLEU-4 (sacreBLEU), ROUGE-L F1 (rouge-score, stemming), CIDEr-D
(metrics/text.py, from its definition). METEOR needs NLTK's WordNet download and embedding similarity
needs pretrained word vectors: both are reported as unavailable instead of being approximated.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from attnlab.metrics.text import bleu_signature, cider_d, corpus_bleu, rouge_f1
from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.registry import register_task_family
from attnlab.tasks.sources import find_file, read_lines, resolve_data_root
from attnlab.tasks.translation import text_seq2seq_task

TURN = " <t> "
PERSONA = " <p> "
_LINE = re.compile(r"^(\d+) (.*)$")


def parse_parlai(lines: list[str], path: str = "?") -> list[dict[str, Any]]:
    """Dialogues as ``{"persona": [...], "turns": [(partner, bot), ...]}``."""
    dialogues: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        m = _LINE.match(line)
        if not m:
            raise DataError(f"{path}:{number}: expected '<n> <text>' (ParlAI format)")
        n, text = int(m.group(1)), m.group(2)
        if n == 1 or not dialogues:
            dialogues.append({"persona": [], "turns": []})
        if text.startswith("your persona:"):
            dialogues[-1]["persona"].append(text[len("your persona:"):].strip())
        else:
            parts = text.split("\t")
            if len(parts) < 2:
                raise DataError(f"{path}:{number}: exchange line without a tab-separated reply")
            dialogues[-1]["turns"].append((parts[0].strip(), parts[1].strip()))
    return dialogues


def examples(dialogue: dict[str, Any], history_turns: int, use_persona: bool) -> list[tuple[str, str]]:
    out = []
    history: list[str] = []
    for partner, bot in dialogue["turns"]:
        history.append(partner)
        context = history[-(history_turns + 1):] if history_turns >= 0 else history
        source = TURN.join(context)
        if use_persona and dialogue["persona"]:
            source = " ".join(dialogue["persona"]) + PERSONA + source
        out.append((source, bot))
        history.append(bot)
    return out


@dataclass
class DialogueScorer:
    def __call__(self, hypotheses: list[str], references: list[str]) -> dict[str, float]:
        return {
            "bleu1": corpus_bleu(hypotheses, references, max_ngram_order=1),
            "bleu4": corpus_bleu(hypotheses, references, max_ngram_order=4),
            "rougeL": rouge_f1(hypotheses, references, types=("rougeL",))["rougeL"],
            "cider": cider_d(hypotheses, references),
        }


def dialogue_split_pairs(cfg: dict[str, Any]) -> tuple[dict[str, list[tuple[str, str]]], dict[str, int]]:
    """(context, reply) pairs per split as the loader trains and scores them, and the dialogues per split."""
    if cfg["source"] != "local":
        raise DataError("task.source for dialogue must be local (ParlAI text files under paths.data_root)")
    root = resolve_data_root(cfg["data_root"])
    fractions = cfg.get("split_fractions") or {}
    by_split: dict[str, list[dict[str, Any]]] = {}
    if fractions:
        path = find_file(root, cfg["files"]["all"])
        dialogues = parse_parlai(read_lines(path), str(path))
        order = list(range(len(dialogues)))
        random.Random(cfg.get("seed_split", 0)).shuffle(order)
        total = sum(fractions.values())
        start = 0
        for i, split in enumerate(("train", "val", "test")):
            count = round(len(order) * fractions[split] / total) if i < 2 else len(order) - start
            by_split[split] = [dialogues[j] for j in sorted(order[start:start + count])]
            start += count
    else:
        for split in ("train", "val", "test"):
            path = find_file(root, cfg["files"][split])
            by_split[split] = parse_parlai(read_lines(path), str(path))
    split_pairs = {
        split: [ex for d in ds for ex in examples(d, int(cfg["history_turns"]), bool(cfg["use_persona"]))]
        for split, ds in by_split.items()
    }
    return split_pairs, {split: len(ds) for split, ds in by_split.items()}


@register_task_family("dialogue")
def load_dialogue(cfg: dict[str, Any], seed: int) -> TaskData:
    split_pairs, dialogue_counts = dialogue_split_pairs(cfg)
    fractions = cfg.get("split_fractions") or {}
    flavours = {
        "bleu1/bleu4": f"sacreBLEU corpus BLEU with max n-gram order 1 / 4; signature "
                       f"{bleu_signature(max_ngram_order=4)} (ngram order varies)",
        "rougeL": "rouge-score ROUGE-L F1 x 100, Porter stemmer on, mean over responses",
        "cider": "CIDEr-D (Vedantam et al. 2015; coco-caption definition: sigma 6, clipping, x10), one reference, "
                 "document frequencies from the test references, lower-cased word tokens",
        "meteor": "unavailable offline: needs NLTK's WordNet data download",
        "embedding_similarity": "unavailable offline: needs pretrained word embeddings (download)",
        "split": (f"dialogues of {cfg['files'].get('all')} split {dict(fractions)} by dialogue (seed "
                  f"{cfg.get('seed_split', 0)}): {', '.join(f'{k} {n}' for k, n in dialogue_counts.items())} dialogues")
        if fractions else "official files per split",
    }
    return text_seq2seq_task(cfg, split_pairs, DialogueScorer(), flavours, "context->reply", truncate_eval_src=True)
