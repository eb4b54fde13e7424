"""SuperGLUE reading-comprehension metrics: MultiRC (EM per question, F1a) and ReCoRD (max-over-gold F1 / EM).

Both follow the official SuperGLUE scoring; scores are x 100 like the leaderboard.

- MultiRC: every answer option of a question is a yes/no decision. ``em`` = % of questions (grouped by
  paragraph and question index) whose every option is decided right; ``f1a`` = binary F1 of the positive
  class over all answer options of the split.
- ReCoRD: one predicted entity string per query against its gold answer strings, SQuAD-normalised
  (lower case, punctuation and the articles a/an/the removed, whitespace collapsed); ``f1`` is the token F1
  and ``em`` the exact match, each the maximum over the query's gold answers, averaged over queries
  (the ReCoRD / SuperGLUE evaluation script).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Hashable, Sequence

import torch
from torchmetrics.functional.classification import binary_f1_score

MULTIRC_METRICS = {
    "em": "exact match per question: all answer options of the question right (grouped by paragraph+question)",
    "f1a": "binary F1 of the positive class over all answer options",
}
SUPERGLUE_RECORD_METRICS = {
    "f1": "token F1 of the predicted entity, max over the query's gold answers, SQuAD-normalised, mean over queries",
    "em": "exact match of the predicted entity, max over the query's gold answers, SQuAD-normalised, "
          "mean over queries",
}


def multirc_scores(predictions: Sequence[int], labels: Sequence[int],
                   questions: Sequence[Hashable]) -> dict[str, float]:
    """``em`` and ``f1a`` (x 100) of per-option binary predictions; ``questions[i]`` names option i's question."""
    if not len(predictions) == len(labels) == len(questions):
        raise ValueError(f"{len(predictions)} predictions, {len(labels)} labels, {len(questions)} question ids")
    if not labels:
        return {}
    all_right: dict[Hashable, bool] = {}
    for pred, gold, question in zip(predictions, labels, questions):
        all_right[question] = all_right.get(question, True) and int(pred) == int(gold)
    em = sum(all_right.values()) / len(all_right)
    f1a = float(binary_f1_score(torch.tensor([int(p) for p in predictions]), torch.tensor([int(y) for y in labels])))
    return {"em": 100.0 * em, "f1a": 100.0 * f1a}


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def squad_normalise(text: str) -> str:
    """The SQuAD / ReCoRD answer normalisation: lower, drop punctuation, drop a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    pred_tokens, gold_tokens = squad_normalise(prediction).split(), squad_normalise(gold).split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> float:
    return float(squad_normalise(prediction) == squad_normalise(gold))


def superglue_record_scores(predictions: Sequence[str], answers: Sequence[Sequence[str]]) -> dict[str, float]:
    """``f1`` and ``em`` (x 100): per query the best over its gold answers, then the mean over queries.

    A query without gold answers scores 0 (it cannot be answered right), as in the official script.
    """
    if len(predictions) != len(answers):
        raise ValueError(f"{len(predictions)} predictions but {len(answers)} answer sets")
    if not predictions:
        return {}
    f1 = em = 0.0
    for pred, golds in zip(predictions, answers):
        f1 += max((token_f1(pred, g) for g in golds), default=0.0)
        em += max((exact_match(pred, g) for g in golds), default=0.0)
    return {"f1": 100.0 * f1 / len(predictions), "em": 100.0 * em / len(predictions)}


def pick_candidates(scores: Sequence[float], queries: Sequence[Hashable],
                    candidates: Sequence[str]) -> dict[Hashable, str]:
    """Per query, the candidate with the highest score (the first one on a tie), in order of first appearance."""
    best: dict[Hashable, tuple[float, str]] = {}
    for score, query, candidate in zip(scores, queries, candidates):
        if query not in best or float(score) > best[query][0]:
            best[query] = (float(score), candidate)
    return {query: candidate for query, (_, candidate) in best.items()}
