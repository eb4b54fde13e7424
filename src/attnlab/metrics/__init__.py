"""Metrics of the papers: sequence accuracies, perplexity, BLEU/chrF/ROUGE/CIDEr-D, GLUE/SuperGLUE, bAbI."""

from attnlab.metrics.sequence import Perplexity, Ratio, SequenceAccuracy, strip_after_eos

__all__ = ["Perplexity", "Ratio", "SequenceAccuracy", "strip_after_eos"]
