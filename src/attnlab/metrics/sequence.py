"""Character (symbol) and sequence accuracy of decoded outputs, as the UT paper reports for algorithmic tasks;
perplexity and masked-LM scores (accuracy, bits per character and per token) as sums over ranks."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torchmetrics import Metric


def strip_after_eos(ids: list[int], eos_id: int) -> list[int]:
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


class SequenceAccuracy(Metric):
    """``char_acc``: target symbols right at their position (a short output counts the missing symbols
    wrong); ``seq_acc``: outputs exactly equal to their target. Counts are summed across ranks by
    torchmetrics, so the distributed value is exact.
    """

    full_state_update = False

    def __init__(self, eos_id: int, pad_id: int) -> None:
        super().__init__()
        self.eos_id, self.pad_id = eos_id, pad_id
        for name in ("correct_symbols", "total_symbols", "correct_seqs", "total_seqs"):
            self.add_state(name, default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, predictions: torch.Tensor, targets: torch.Tensor) -> None:
        cs = ts = cq = 0
        for pred_row, tgt_row in zip(predictions.tolist(), targets.tolist()):
            pred = strip_after_eos(pred_row, self.eos_id)
            tgt = strip_after_eos([t for t in tgt_row if t != self.pad_id], self.eos_id)
            cs += sum(1 for i, t in enumerate(tgt) if i < len(pred) and pred[i] == t)
            ts += len(tgt)
            cq += int(pred == tgt)
        self.correct_symbols += cs
        self.total_symbols += ts
        self.correct_seqs += cq
        self.total_seqs += len(targets)

    def compute(self) -> dict[str, torch.Tensor]:
        return {
            "char_acc": self.correct_symbols.double() / self.total_symbols.clamp_min(1),
            "seq_acc": self.correct_seqs.double() / self.total_seqs.clamp_min(1),
        }


class Perplexity(Metric):
    """exp(sum NLL / tokens) over non-padding targets, natural log; summed across ranks."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("nll_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tokens", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, nll_sum: torch.Tensor, tokens: torch.Tensor | int) -> None:
        self.nll_sum += nll_sum.detach().double()
        self.tokens += tokens  # a tensor stays on its device: int() would wait for the accelerator

    def compute(self) -> dict[str, torch.Tensor]:
        mean = self.nll_sum / self.tokens.clamp_min(1)
        return {"nll": mean, "ppl": torch.exp(mean)}


class Ratio(Metric):
    """sum(numerator) / sum(denominator), summed across ranks (e.g. LAMBADA last-word accuracy)."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("num", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("den", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, numerator: torch.Tensor | float, denominator: torch.Tensor | float) -> None:
        # Added on the device (no float(): a host synchronisation per batch)
        self.num += torch.as_tensor(numerator, device=self.num.device).detach().to(torch.float64)
        self.den += torch.as_tensor(denominator, device=self.den.device).detach().to(torch.float64)

    def compute(self) -> torch.Tensor:
        return self.num / self.den.clamp_min(1e-12)


class MaskedLMScore(Metric):
    """Sums over masked positions (across ranks): NLL in nats, tokens, correct predictions, characters."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        for name in ("nll", "tokens", "correct", "chars"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, target: torch.Tensor, chars: torch.Tensor) -> None:
        self.nll += F.cross_entropy(logits.float(), target, reduction="sum").detach().double()
        self.tokens += target.numel()
        self.correct += logits.argmax(-1).eq(target).sum().double()
        self.chars += chars.sum().double()

    def compute(self) -> dict[str, torch.Tensor]:
        bits = self.nll / math.log(2)
        return {"loss": self.nll / self.tokens.clamp_min(1), "mlm_acc": self.correct / self.tokens.clamp_min(1),
                "bpc": bits / self.chars.clamp_min(1), "bits_per_token": bits / self.tokens.clamp_min(1)}


class GroupedAnswerScore(Metric):
    """Per group of scored positions (a probe's ``group``, e.g. the hops a query needs; groups 1..max_groups-1,
    0 = ungrouped): answers, correct answers, the summed layer applications (steps) and their squares (for the
    spread of the steps: ACT that halts every position at the same step is a constant, not a mechanism at work),
    reduced across ranks."""

    full_state_update = False

    def __init__(self, max_groups: int = 64) -> None:
        super().__init__()
        for name in ("answers", "correct", "steps", "steps_sq"):
            self.add_state(name, default=torch.zeros(max_groups, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, group: torch.Tensor, correct: torch.Tensor, steps: torch.Tensor) -> None:
        """``group`` (int), ``correct`` (bool) and ``steps`` (float) at the scored positions, one entry each."""
        group = group.long()
        if group.numel() and int(group.max()) >= self.answers.numel():
            raise ValueError(f"group {int(group.max())} beyond the {self.answers.numel()} groups this score keeps")
        self.answers.index_add_(0, group, torch.ones_like(group, dtype=torch.float64))
        self.correct.index_add_(0, group, correct.double())
        self.steps.index_add_(0, group, steps.double())
        self.steps_sq.index_add_(0, group, steps.double().square())

    def compute(self) -> dict[str, torch.Tensor]:
        """``acc_h<g>`` and ``steps_h<g>`` for every group g >= 1 with answers; over all grouped answers
        ``acc_grouped``, ``steps_mean`` and ``steps_std`` (the standard deviation of the steps over the answers, 0
        when every answer got the same number of steps); and ``steps_gain``, the steps of the highest group minus
        those of the lowest (how much more computation the hardest answers get)."""
        out: dict[str, torch.Tensor] = {}
        present = [g for g in range(1, self.answers.numel()) if self.answers[g] > 0]
        for g in present:
            out[f"acc_h{g}"] = self.correct[g] / self.answers[g]
            out[f"steps_h{g}"] = self.steps[g] / self.answers[g]
        if present:
            answers = self.answers[1:].sum()
            out["acc_grouped"] = self.correct[1:].sum() / answers
            out["steps_mean"] = self.steps[1:].sum() / answers
            out["steps_std"] = (self.steps_sq[1:].sum() / answers - out["steps_mean"].square()).clamp_min(0).sqrt()
        if len(present) >= 2:
            out["steps_gain"] = out[f"steps_h{present[-1]}"] - out[f"steps_h{present[0]}"]
        return out
