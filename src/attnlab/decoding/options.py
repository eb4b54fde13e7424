"""How a seq2seq task's outputs are decoded (``task.decoding`` of a run's config), with the only defaults there are.

The config check types ``task.decoding`` against ``DecodingOptions``; training fills the keys a task leaves out
from it; the seq2seq module decodes by it; tasks size their sequences and describe their decoding by it. Plain
Python: the config check imports it before torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class DecodingOptions:
    strategy: str = "greedy"            # greedy | beam
    beam_size: int = 4
    length_penalty_alpha: float = 0.6
    max_len_a: float = 1.0              # a hypothesis stops after max_len_a * source length + max_len_b tokens
    max_len_b: int = 10
    decode_in_validation: bool = True   # validation decodes (dev accuracy, BLEU), not only the teacher-forced loss
    length_penalty: str = "gnmt"        # gnmt: ((5+L)/6)^alpha (the papers) | fairseq: L^alpha (--lenpen)

    @classmethod
    def of(cls, decoding: Mapping[str, Any] | None) -> DecodingOptions:
        """The options a ``task.decoding`` section (or a checkpoint's copy of it, which may predate a key) gives,
        with the defaults for the keys it leaves out."""
        return cls(**(decoding or {}))

    def max_length(self, source_length: int) -> int:
        """The most tokens a hypothesis of a source of ``source_length`` tokens may take."""
        return int(self.max_len_a * source_length + self.max_len_b)

    def describe(self) -> str:
        """How hypotheses are decoded, for ``metric_flavours.decoding`` (names the length penalty used)."""
        limit = f"max length {self.max_len_a}*src+{self.max_len_b}"
        if self.strategy != "beam":
            return f"greedy, {limit}"
        alpha = self.length_penalty_alpha
        if self.length_penalty == "fairseq":
            penalty = f"fairseq length penalty L^{alpha} (--lenpen {alpha}; L counts EOS)"
        elif self.length_penalty == "gnmt":
            penalty = f"GNMT length penalty ((5+L)/6)^{alpha}"
        else:
            raise ValueError(f"task.decoding.length_penalty={self.length_penalty!r} is not valid; valid: gnmt, fairseq")
        return f"beam {self.beam_size}, {penalty}, {limit}"
