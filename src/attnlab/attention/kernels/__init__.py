"""Attention kernels. ``blocksparse_reference`` is the pure-PyTorch block-sparse path; faster kernels
are added beside it and held equal to it by the tests."""

from attnlab.attention.kernels.blocksparse_reference import (
    BlockSparsePlan,
    blocksparse_attention,
    blocksparse_attention_at,
)

__all__ = ["BlockSparsePlan", "blocksparse_attention", "blocksparse_attention_at"]
