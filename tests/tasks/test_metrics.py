"""Every metric against a known value: sacreBLEU's and rouge-score's own functions, hand-checked formulas."""

from __future__ import annotations

import math

import pytest
import sacrebleu
from rouge_score import rouge_scorer

from attnlab.metrics.classification import babi_scores, classification_scores
from attnlab.metrics.text import (
    bleu_signature,
    cider_d,
    corpus_bleu,
    corpus_chrf,
    rouge_f1,
    tokenized_bleu,
)

HYPS = ["The cat sat on the mat .", "A dog runs in the park", "completely unrelated words here"]
REFS = ["The cat is sitting on the mat.", "A dog is running in the park.", "Something else entirely."]


def test_bleu_matches_sacrebleu_and_signature_is_exact():
    assert corpus_bleu(HYPS, REFS) == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert corpus_bleu(HYPS, REFS, max_ngram_order=1) == pytest.approx(
        sacrebleu.metrics.BLEU(max_ngram_order=1).corpus_score(HYPS, [REFS]).score)
    sig = bleu_signature()
    assert sig.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")


def test_tokenized_bleu_is_whitespace_bleu():
    hyps, refs = ["a b c d e f"], ["a b c d e g"]
    # 5/6 unigrams, 4/5 bigrams, 3/4 trigrams, 2/3 4-grams, no brevity penalty (multi-bleu.perl arithmetic)
    expected = 100 * math.exp(sum(math.log(p) for p in (5 / 6, 4 / 5, 3 / 4, 2 / 3)) / 4)
    assert tokenized_bleu(hyps, refs) == pytest.approx(expected, rel=1e-6)
    # 13a would split "mat." and "mat ." alike; tokenize=none must not
    hyp, ref = ["the cat sat on the old mat."], ["the cat sat on the old mat ."]
    assert corpus_bleu(hyp, ref) == pytest.approx(100.0)
    assert tokenized_bleu(hyp, ref) < 100.0


def test_unknown_escape_never_matches():
    from attnlab.tasks.tokenization import UNK_ESCAPE

    assert corpus_bleu([f"a {UNK_ESCAPE} c d"], ["a <unk> c d"]) < 100.0


def test_chrf_matches_sacrebleu():
    assert corpus_chrf(HYPS, REFS) == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)


def test_rouge_matches_rouge_score_with_stemming():
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    expected = {k: 100 * sum(scorer.score(r, h)[k].fmeasure for h, r in zip(HYPS, REFS)) / 3
                for k in ("rouge1", "rouge2", "rougeL")}
    got = rouge_f1(HYPS, REFS)
    assert got == pytest.approx(expected)
    assert rouge_f1(["cats running"], ["cat runs"])["rouge1"] == pytest.approx(100.0)  # Porter stemming on


def test_cider_d_known_values():
    refs = ["a man rides a horse", "two dogs play in snow", "a woman cooks dinner"]
    assert cider_d(refs, refs) == pytest.approx(10.0)  # identical: every cosine 1, no length penalty
    assert cider_d(["zebra zebra", "zebra", "zebra"], refs) == 0.0
    # one shared unigram "a" that is in 2 of 3 documents: weight log(3/2); hand-computed cosine for n=1
    hyp = ["a", "x", "y"]
    w = math.log(3 / 2)
    idf_man = idf_rides = idf_horse = math.log(3)
    ref_norm = math.sqrt((2 * w) ** 2 + idf_man**2 + idf_rides**2 + idf_horse**2)
    cos1 = (w * 2 * w) / (w * ref_norm)  # min(hyp, ref) * ref / (|hyp| |ref|), clipped at the hypothesis weight
    penalty = math.exp(-((1 - 5) ** 2) / (2 * 36))
    expected_first = cos1 * penalty / 4 * 10
    assert cider_d(hyp, refs) == pytest.approx(expected_first / 3)


def test_classification_metrics_known_values():
    preds, gold = [1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 1, 1]
    tp, tn, fp, fn = 2, 2, 1, 1
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    got = classification_scores(preds, gold, ["acc", "mcc", "f1", "macro_f1"], 2)
    assert got["acc"] == pytest.approx(100 * 4 / 6)
    assert got["mcc"] == pytest.approx(100 * mcc)
    assert got["f1"] == pytest.approx(100 * 2 * tp / (2 * tp + fp + fn))
    assert got["macro_f1"] == pytest.approx(100 * (2 / 3 + 2 / 3) / 2)
    reg = classification_scores([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 5.0], ["pearson", "spearman"], 1)
    assert reg["spearman"] == pytest.approx(100.0)
    x, y = [1, 2, 3, 4], [1, 2, 3, 5]
    mx, my = sum(x) / 4, sum(y) / 4
    r = sum((a - mx) * (b - my) for a, b in zip(x, y)) / math.sqrt(
        sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))
    assert reg["pearson"] == pytest.approx(100 * r)
    with pytest.raises(ValueError, match="unknown classification metric"):
        classification_scores([0], [0], ["auc"], 2)


def test_babi_failed_tasks_counts_error_above_five_percent():
    preds = [1] * 100 + [1] * 96 + [0] * 4 + [1] * 94 + [0] * 6
    gold = [1] * 300
    tasks = [1] * 100 + [2] * 100 + [3] * 100
    got = babi_scores(preds, gold, tasks)
    assert got["error_qa1"] == 0.0 and got["error_qa2"] == pytest.approx(4.0)
    assert got["error_qa3"] == pytest.approx(6.0)
    assert got["failed_tasks"] == 1.0  # 4% passes, 6% fails
    assert got["mean_error"] == pytest.approx(10 / 3)
