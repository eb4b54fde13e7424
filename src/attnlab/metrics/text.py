"""Text-generation metrics: sacreBLEU (detokenized, with its signature), tokenized BLEU, chrF, ROUGE, CIDEr-D.

Every score is on the 0-100 scale the papers print. References are always the raw strings of the split,
never ids passed back through a tokenizer.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

from sacrebleu.metrics import BLEU, CHRF


def _bleu(tokenize: str, lowercase: bool, max_ngram_order: int) -> BLEU:
    # force=True: tokenized input is expected for tokenize="none" (multi-bleu.perl style) and for data that
    # only exists Moses-tokenized; sacrebleu would otherwise warn once per call.
    return BLEU(tokenize=tokenize, lowercase=lowercase, max_ngram_order=max_ngram_order, force=True)


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], *, tokenize: str = "13a",
                lowercase: bool = False, max_ngram_order: int = 4) -> float:
    """sacreBLEU corpus BLEU against one reference per segment."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    return float(_bleu(tokenize, lowercase, max_ngram_order).corpus_score(list(hypotheses), [list(references)]).score)


def bleu_signature(*, tokenize: str = "13a", lowercase: bool = False, max_ngram_order: int = 4) -> str:
    """The sacreBLEU signature string of ``corpus_bleu`` with these settings (one reference)."""
    metric = _bleu(tokenize, lowercase, max_ngram_order)
    metric.corpus_score(["a"], [["a"]])  # the signature needs the reference count, known after one call
    return str(metric.get_signature())


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str], *, lowercase: bool = False) -> float:
    """BLEU on whitespace tokens as they are (multi-bleu.perl: no tokenization of its own, case-sensitive).

    sacreBLEU with ``tokenize='none'`` computes the same corpus statistics and brevity penalty as
    multi-bleu.perl; the two differ only in rounding.
    """
    return corpus_bleu(hypotheses, references, tokenize="none", lowercase=lowercase)


def corpus_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    return float(CHRF().corpus_score(list(hypotheses), [list(references)]).score)


def chrf_signature() -> str:
    metric = CHRF()
    metric.corpus_score(["a"], [["a"]])
    return str(metric.get_signature())


def rouge_f1(hypotheses: Sequence[str], references: Sequence[str], *,
             types: Sequence[str] = ("rouge1", "rouge2", "rougeL"), use_stemmer: bool = True) -> dict[str, float]:
    """Mean per-example ROUGE F1 x 100 from Google's ``rouge-score`` (Porter stemming on).

    ``rougeLsum`` splits summaries into sentences on newlines (the CNN/DailyMail convention); callers put
    one sentence per line for it.
    """
    from rouge_score import rouge_scorer

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    scorer = rouge_scorer.RougeScorer(list(types), use_stemmer=use_stemmer)
    totals = dict.fromkeys(types, 0.0)
    for hyp, ref in zip(hypotheses, references):
        for key, score in scorer.score(ref, hyp).items():  # score(target, prediction)
            totals[key] += score.fmeasure
    n = max(len(hypotheses), 1)
    return {key: 100.0 * value / n for key, value in totals.items()}


# -- CIDEr-D ---------------------------------------------------------------------------------------------
_WORD = re.compile(r"[a-z0-9']+")


def cider_tokenize(text: str) -> list[str]:
    """Lower-cased words without punctuation (what coco-caption's PTB tokenizer leaves, approximately)."""
    return _WORD.findall(text.lower())


def _ngrams(words: list[str], n_max: int) -> Counter:
    return Counter(tuple(words[i : i + n]) for n in range(1, n_max + 1) for i in range(len(words) - n + 1))


def cider_d(hypotheses: Sequence[str], references: Sequence[Sequence[str]] | Sequence[str], *, n_max: int = 4,
            sigma: float = 6.0) -> float:
    """CIDEr-D (Vedantam et al. 2015, as coco-caption's ``CiderD``): TF-IDF n-gram cosine with clipping and
    a Gaussian length penalty, averaged over n = 1..4, times 10; document frequencies from the references.

    Written here because pycocoevalcap needs Java for its tokenizer; ``cider_tokenize`` stands in for it.
    """
    refs = [[r] if isinstance(r, str) else list(r) for r in references]
    if len(hypotheses) != len(refs):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(refs)} reference sets")
    if not refs:
        return 0.0
    ref_counts = [[_ngrams(cider_tokenize(r), n_max) for r in rs] for rs in refs]
    df: Counter = Counter()
    for counts in ref_counts:
        df.update({g for c in counts for g in c})
    log_docs = math.log(float(len(refs)))

    def vec(counts: Counter):
        v = [dict() for _ in range(n_max)]
        norms = [0.0] * n_max
        for gram, tf in counts.items():
            n = len(gram) - 1
            w = tf * (log_docs - math.log(max(1.0, df[gram])))
            v[n][gram] = w
            norms[n] += w * w
        return v, [math.sqrt(x) for x in norms]

    total = 0.0
    for hyp, counts in zip(hypotheses, ref_counts):
        words = cider_tokenize(hyp)
        hv, hn = vec(_ngrams(words, n_max))
        score = [0.0] * n_max
        for rc in counts:
            rv, rn = vec(rc)
            ref_len = sum(c for g, c in rc.items() if len(g) == 1)
            delta = float(len(words) - ref_len)
            for n in range(n_max):
                dot = sum(min(w, rv[n][g]) * rv[n][g] for g, w in hv[n].items() if g in rv[n])
                if hn[n] and rn[n]:
                    score[n] += dot / (hn[n] * rn[n]) * math.exp(-(delta * delta) / (2 * sigma * sigma))
        total += sum(s / len(counts) for s in score) / n_max * 10.0
    return total / len(refs)
