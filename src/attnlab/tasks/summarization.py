"""Abstractive summarization (CNN/DailyMail 3.0.0 from the hub; SAMSum locally as the CPU-scale stand-in).

Rows are ``{source_field: document, target_field: summary}`` from JSON Lines files (SAMSum: id, dialogue,
summary) or the hub (cnn_dailymail: article, highlights, id). Newlines (``\\r\\n`` or ``\\n``: SAMSum mixes
both) become a `` <n> `` word for the model, so dialogue turns and summary sentences survive BPE; decoded
summaries get their newlines back, so ``rougeLsum`` sees one sentence per line as in the CNN/DM convention.
Sources longer than ``max_src_len`` tokens are cut in every split (counted and logged), as the papers do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from attnlab.metrics.text import rouge_f1
from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.registry import register_task_family
from attnlab.tasks.sources import find_file, load_hub_dataset, read_jsonl, resolve_data_root
from attnlab.tasks.translation import text_seq2seq_task

NEWLINE = " <n> "
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def to_model_text(text: str) -> str:
    return re.sub(r"\s*\r?\n\s*", NEWLINE, text.strip())


def from_model_text(text: str) -> str:
    return re.sub(r"\s*<n>\s*", "\n", text).strip()


def normalise_reference(text: str) -> str:
    return re.sub(r"\s*\r?\n\s*", "\n", text.strip())


@dataclass
class RougeScorer:
    """ROUGE-1/2/L/Lsum F1 x 100, Google rouge-score with Porter stemming."""

    def __call__(self, hypotheses: list[str], references: list[str]) -> dict[str, float]:
        return rouge_f1(hypotheses, references, types=ROUGE_TYPES, use_stemmer=True)


def summary_rows(cfg: dict[str, Any], split: str) -> list[dict]:
    """The raw rows of one split (local JSON Lines or the hub), each with the source and target fields."""
    if cfg["source"] == "hub":
        ds = load_hub_dataset(cfg["hub_id"], cfg.get("hub_config"),
                              local_hint="the local stand-in is task=sum/samsum")
        name = cfg["hub_splits"][split]
        if name not in ds:
            raise DataError(f"hub dataset {cfg['hub_id']} has no split {name!r}; it has: {', '.join(ds)}")
        return list(ds[name])
    if cfg["source"] != "local":
        raise DataError(f"task.source={cfg['source']!r}; valid: local, hub")
    path = find_file(resolve_data_root(cfg["data_root"]), cfg["files"][split], hub_override="task.source=hub")
    rows = read_jsonl(path)
    for number, row in enumerate(rows, 1):
        for key in (cfg["source_field"], cfg["target_field"]):
            if not isinstance(row.get(key), str):
                raise DataError(f"{path}: record {number} has no string field {key!r}")
    return rows


@register_task_family("summarization")
def load_summarization(cfg: dict[str, Any], seed: int) -> TaskData:
    src_f, tgt_f = cfg["source_field"], cfg["target_field"]
    split_pairs = {}
    references = {}
    for split in ("train", "val", "test"):
        rows = summary_rows(cfg, split)
        split_pairs[split] = [(to_model_text(r[src_f]), to_model_text(r[tgt_f])) for r in rows]
        references[split] = [normalise_reference(r[tgt_f]) for r in rows]
    flavours = {
        "rouge": "rouge-score (Google) F1 x 100, mean over examples, Porter stemmer on; rougeL over the whole "
                 "summary, rougeLsum with one sentence per line (newlines kept from the reference / restored "
                 "from <n> in hypotheses)",
    }
    task = text_seq2seq_task(cfg, split_pairs, RougeScorer(), flavours, f"{src_f}->{tgt_f}",
                             truncate_eval_src=True, postprocess=from_model_text)
    cap = cfg.get("max_eval_pairs")
    # Scores compare with the raw summaries (newlines normalised), not the <n>-marked model text.
    task.references = {k: (v[:cap] if cap else v) for k, v in references.items() if k != "train"}
    return task
