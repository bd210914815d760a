"""Functional jagged ops with a pure-PyTorch reference and an fbgemm fast path."""

from trainer.ops.attention import (
    jagged_cross_attention,
    jagged_local_attention,
    jagged_self_attention,
)
from trainer.ops.jagged import (
    JaggedTokens,
    dense_to_jagged,
    gather_rows,
    jagged_concat,
    jagged_dense_bmm,
    jagged_first_k,
    jagged_last_k,
    jagged_pool,
    jagged_prepend,
    jagged_softmax,
    jagged_to_padded_dense,
    jagged_truncate_last,
    positions,
    segment_ids,
    segment_sum,
)
from trainer.ops.kernel import Kernel, capture_jagged_sizes, fbgemm_op

__all__ = [
    "JaggedTokens",
    "Kernel",
    "capture_jagged_sizes",
    "dense_to_jagged",
    "fbgemm_op",
    "gather_rows",
    "jagged_concat",
    "jagged_cross_attention",
    "jagged_dense_bmm",
    "jagged_first_k",
    "jagged_last_k",
    "jagged_local_attention",
    "jagged_pool",
    "jagged_prepend",
    "jagged_self_attention",
    "jagged_softmax",
    "jagged_to_padded_dense",
    "jagged_truncate_last",
    "positions",
    "segment_ids",
    "segment_sum",
]
