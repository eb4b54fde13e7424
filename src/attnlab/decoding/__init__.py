"""Greedy and beam search over any encoder-decoder with incremental caches."""

from attnlab.decoding.search import (
    LENGTH_PENALTIES,
    beam_search,
    fairseq_length_penalty,
    gnmt_length_penalty,
    greedy_decode,
    length_penalty_fn,
)

__all__ = ["LENGTH_PENALTIES", "beam_search", "fairseq_length_penalty", "gnmt_length_penalty", "greedy_decode",
           "length_penalty_fn"]
