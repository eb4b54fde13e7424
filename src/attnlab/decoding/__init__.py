"""Greedy and beam search over any encoder-decoder with incremental caches."""

from attnlab.decoding.search import beam_search, gnmt_length_penalty, greedy_decode

__all__ = ["beam_search", "gnmt_length_penalty", "greedy_decode"]
