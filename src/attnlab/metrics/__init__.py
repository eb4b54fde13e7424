"""Metrics of the papers: sequence accuracies, perplexity, BLEU/chrF/ROUGE/CIDEr-D, GLUE/SuperGLUE, bAbI."""

from attnlab.metrics.sequence import (
    GroupedAnswerScore,
    MaskedLMScore,
    Perplexity,
    Ratio,
    SequenceAccuracy,
    strip_after_eos,
)

__all__ = ["GroupedAnswerScore", "MaskedLMScore", "Perplexity", "Ratio", "SequenceAccuracy", "strip_after_eos"]
