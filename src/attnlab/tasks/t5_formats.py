"""T5's text-to-text formats of the GLUE and SuperGLUE tasks (``t5.data.preprocessors.glue``, ``stsb``, ``wsc``):
how each task's fields become one input line and its label a target word. Used by the text-to-text family
(tasks/text_to_text.py) and by the shared T5 vocabulary (tasks/span_corruption.py), which must spell every word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class T5Format:
    """How T5 writes one task: prefix, the member's text fields by name (in the member config's order),
    label words by class index (None: STS-B's score), and the fields' order in the input (None: sorted)."""

    benchmark: str
    fields: tuple[str, ...]
    labels: tuple[str, ...] | None
    order: tuple[str, ...] | None = None
    local_fields: tuple[str, ...] | None = None  # replaces the member's text_fields (WSC needs span indices)
    hub_fields: tuple[str, ...] | None = None

    def inputs(self, values: list[Any]) -> str:
        named = dict(zip(self.fields, values))
        if self.benchmark == "wsc":
            return wsc_input(**named)
        parts = [self.benchmark]
        for name in self.order or tuple(sorted(self.fields)):
            parts += [f"{name}:", str(named[name]).strip()]
        return " ".join(parts)

    def target(self, label: float | int) -> str:
        return stsb_target(float(label)) if self.labels is None else self.labels[int(label)]


NLI3 = ("entailment", "neutral", "contradiction")
BOOL = ("False", "True")
T5_FORMATS: dict[str, T5Format] = {
    "glue/cola": T5Format("cola", ("sentence",), ("unacceptable", "acceptable")),
    "glue/sst2": T5Format("sst2", ("sentence",), ("negative", "positive")),
    "glue/mrpc": T5Format("mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent")),
    "glue/stsb": T5Format("stsb", ("sentence1", "sentence2"), None),
    "glue/qqp": T5Format("qqp", ("question1", "question2"), ("not_duplicate", "duplicate")),
    "glue/mnli": T5Format("mnli", ("premise", "hypothesis"), NLI3),
    "glue/qnli": T5Format("qnli", ("question", "sentence"), ("entailment", "not_entailment")),
    "glue/rte": T5Format("rte", ("sentence1", "sentence2"), ("entailment", "not_entailment")),
    "glue/wnli": T5Format("wnli", ("sentence1", "sentence2"), ("not_entailment", "entailment")),
    "superglue/boolq": T5Format("boolq", ("question", "passage"), BOOL),
    "superglue/cb": T5Format("cb", ("premise", "hypothesis"), ("entailment", "contradiction", "neutral")),
    "superglue/copa": T5Format("copa", ("premise", "question", "choice1", "choice2"), ("choice1", "choice2")),
    "superglue/rte": T5Format("rte", ("premise", "hypothesis"), ("entailment", "not_entailment")),
    # T5 orders WiC's fields explicitly and leaves out the word's positions (glue_utils).
    "superglue/wic": T5Format("wic", ("word", "sentence1", "sentence2"), BOOL,
                              order=("sentence1", "sentence2", "word")),
    "superglue/wsc": T5Format(
        "wsc", ("text", "span1_text", "span1_index", "span2_text", "span2_index"), BOOL,
        local_fields=("text", "target.span1_text", "target.span1_index", "target.span2_text", "target.span2_index"),
        hub_fields=("text", "span1_text", "span1_index", "span2_text", "span2_index")),
}


def stsb_target(score: float) -> str:
    """T5's STS-B target: the score rounded to the nearest 0.2, one decimal (``tf.round`` rounds halves to even)."""
    return f"{round(score * 5) / 5:.1f}"


def _mark_span(text: str, span: str, index: int, mark: str) -> str:
    pattern = rf"^((?:\S+\s){{{int(index)}}})({re.escape(str(span))})"
    return re.sub(pattern, lambda m: f"{m.group(1)}{mark} {m.group(2)} {mark}", text, count=1)


def wsc_input(text: str, span1_text: str, span1_index: int, span2_text: str, span2_index: int) -> str:
    """T5's ``wsc``: ``*`` around the noun (span 1), ``#`` around the pronoun (span 2)."""
    text = _mark_span(str(text), span1_text, span1_index, "*")
    # The first mark added two words before span 2 when span 1 comes first (T5's compensation).
    text = _mark_span(text, span2_text, int(span2_index) + 2 * (int(span1_index) < int(span2_index)), "#")
    return f"wsc text: {text}"


def format_words() -> str:
    """Every task prefix, field name and label word of the formats, and the STS-B targets, on one line."""
    words = {"*", "#"} | {stsb_target(i / 5) for i in range(26)}
    for fmt in T5_FORMATS.values():
        words |= {fmt.benchmark, *(f"{f}:" for f in fmt.order or fmt.fields), *(fmt.labels or ())}
    words.add("text:")
    return " ".join(sorted(words))
