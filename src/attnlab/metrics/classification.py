"""GLUE / SuperGLUE / bAbI metrics over whole evaluation splits (torchmetrics functional, not hand-written).

Scores are 0-100 like the GLUE leaderboard; correlations are Pearson / Spearman x 100.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchmetrics.functional import pearson_corrcoef, spearman_corrcoef
from torchmetrics.functional.classification import (
    binary_f1_score,
    binary_matthews_corrcoef,
    multiclass_f1_score,
)

from attnlab.registry import check_option

# Names a task may list in ``TaskData`` metric settings, each with what it computes.
METRICS = {
    "acc": "accuracy",
    "mcc": "Matthews correlation (binary)",
    "f1": "F1 of the positive class (label 1)",
    "macro_f1": "F1 averaged over classes (unweighted)",
    "pearson": "Pearson correlation",
    "spearman": "Spearman rank correlation",
}


def classification_scores(predictions: Sequence[float], labels: Sequence[float], names: Sequence[str],
                          num_classes: int) -> dict[str, float]:
    for name in sorted(names):
        check_option("classification metric", name, METRICS)
    if not labels:
        return {}
    out: dict[str, float] = {}
    if num_classes == 1:  # regression (STS-B)
        p = torch.tensor(predictions, dtype=torch.float64)
        t = torch.tensor(labels, dtype=torch.float64)
        for name in names:
            if name == "pearson":
                out[name] = 100.0 * float(pearson_corrcoef(p, t))
            elif name == "spearman":
                out[name] = 100.0 * float(spearman_corrcoef(p, t))
            else:
                raise ValueError(f"metric {name!r} needs class labels; a regression task reports pearson/spearman")
        return out
    p = torch.tensor([int(x) for x in predictions])
    t = torch.tensor([int(x) for x in labels])
    for name in names:
        if name == "acc":
            out[name] = 100.0 * float((p == t).double().mean())
        elif name == "mcc":
            out[name] = 100.0 * float(binary_matthews_corrcoef(p, t))
        elif name == "f1":
            out[name] = 100.0 * float(binary_f1_score(p, t))
        elif name == "macro_f1":
            out[name] = 100.0 * float(multiclass_f1_score(p, t, num_classes=num_classes, average="macro"))
        else:
            raise ValueError(f"metric {name!r} needs a regression task (num_classes=1)")
    return out


def babi_scores(predictions: Sequence[int], labels: Sequence[int], task_ids: Sequence[int], *,
                fail_threshold: float = 0.05) -> dict[str, float]:
    """Per-task error (%), mean error and the number of failed tasks (error > 5%), as in the UT / MemN2N
    tables. Tasks absent from the split are not counted. (Overall accuracy is the module's ``acc``.)"""
    per_task: dict[int, list[int]] = {}
    for pred, gold, task in zip(predictions, labels, task_ids):
        per_task.setdefault(int(task), []).append(int(pred == gold))
    out: dict[str, float] = {}
    errors = []
    for task in sorted(per_task):
        err = 1.0 - sum(per_task[task]) / len(per_task[task])
        errors.append(err)
        out[f"error_qa{task}"] = 100.0 * err
    if errors:
        out["mean_error"] = 100.0 * sum(errors) / len(errors)
        out["failed_tasks"] = float(sum(e > fail_threshold for e in errors))
    return out
