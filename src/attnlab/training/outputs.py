"""Decoded test outputs beside the record, so a user can rescore them, test significance and read errors.

For every evaluation split of a sequence-to-sequence task (``test``, ``test_2017_flickr``, ...) the folder
gets, one line per example in reference order (the split's own order, as the references files):

- ``<prefix>.hyp``: the hypotheses exactly as scored (detokenized; ``<unk>`` written UNKNOWNTOKENINHYP);
- ``<prefix>.ref``: the references the metric compared against (raw text for text tasks);
- ``<prefix>.src``: the sources (raw text, or the detokenized source ids for generated tasks);
- ``<prefix>.jsonl``: ``{"index", "source", "reference", "hypothesis"}`` per example, exact (no line folding).

A line break inside a text (a summary, a dialogue turn) becomes a space in the three line-aligned files only,
so ``sacrebleu <prefix>.ref -i <prefix>.hyp`` reproduces ``test/bleu`` for MT, as fairseq-generate's H-lines
and Hugging Face's ``generated_predictions.txt`` allow.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from attnlab.results.record import atomic_write_text
from attnlab.tasks import TaskData


def _line(text: Any) -> str:
    return " ".join(str(text).splitlines()) if "\n" in str(text) or "\r" in str(text) else str(text)


def split_rows(task: TaskData, split: str, outputs: dict[int, Any]) -> list[dict[str, Any]]:
    """One row per decoded example of ``split``, in the split's order."""
    dataset = task.datasets[split]
    references, sources = task.references.get(split), task.sources.get(split)
    rows = []
    for index in sorted(outputs):
        example = dataset[index]
        if references is not None and isinstance(references[index], str):
            reference = references[index]
        elif references is not None and isinstance(references[index], tuple) and isinstance(references[index][-1], str):
            reference = references[index][-1]  # (member, text): a mixture's reference carries its member
        else:  # generated tasks, T5 labels: the target as the model should have written it
            reference = task.detokenize(example[1]) if task.detokenize else None
        source = sources[index] if sources is not None else (task.detokenize(example[0]) if task.detokenize else None)
        rows.append({"index": index, "source": source, "reference": reference, "hypothesis": outputs[index]})
    return rows


def write_decoded_outputs(folder: str | os.PathLike, test_outputs: dict[str, dict[int, Any]],
                          task: TaskData) -> list[Path]:
    """Write the files above for every split with text outputs; returns the hypotheses files written."""
    folder = Path(folder)
    written = []
    for prefix, outputs in test_outputs.items():
        split = task.eval_splits.get(prefix)
        if split is None or not outputs or not all(isinstance(v, str) for v in outputs.values()):
            continue
        rows = split_rows(task, split, outputs)
        folder.mkdir(parents=True, exist_ok=True)
        for suffix, key in (("hyp", "hypothesis"), ("ref", "reference"), ("src", "source")):
            # atomic: a reader (or a kill) never sees half a file
            atomic_write_text(folder / f"{prefix}.{suffix}", "".join(_line(r[key]) + "\n" for r in rows))
        atomic_write_text(folder / f"{prefix}.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        written.append(folder / f"{prefix}.hyp")
    return written
