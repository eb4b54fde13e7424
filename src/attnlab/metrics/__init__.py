"""Metrics of the papers: sequence accuracies, perplexity (and, with the tasks issue, BLEU/ROUGE/GLUE)."""

from attnlab.metrics.sequence import Perplexity, SequenceAccuracy, strip_after_eos

__all__ = ["Perplexity", "SequenceAccuracy", "strip_after_eos"]
