"""Jagged tensor ops: one public dispatcher per op.

Layout (TorchRec's ``JaggedTensor`` values/offsets), with ``B`` sequences,
``L`` tokens in all and ``L[b]`` tokens in sequence ``b`` (may be 0)::

    #            0           1    2        <-- sequence b
    # values     [t0, t1]    []   [t2]     (L, D) = (3, D)
    # offsets    [0, 2, 2, 3]              (B + 1,) int64

Every dispatcher takes ``(values, offsets[, max_len])`` and ``kernel``:
``Kernel.PYTORCH`` (default) runs the reference in :mod:`trainer.ops.pytorch`,
``Kernel.FBGEMM`` runs ``torch.ops.fbgemm`` where it exists for the op and the
device (checked at call time) and the reference otherwise. ``max_len`` is a
static upper bound on ``L[b]`` that fbgemm kernels need; the references ignore
it except where they pad.

Example:
    >>> values = torch.arange(3.0).view(3, 1)
    >>> offsets = torch.tensor([0, 2, 2, 3])
    >>> jagged_to_padded_dense(values, offsets, max_len=2).squeeze(-1).tolist()
    [[0.0, 1.0], [0.0, 0.0], [2.0, 0.0]]
    >>> jagged_pool(values, offsets, ratio=2)[0].squeeze(-1).tolist()
    [0.5, 2.0]
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from trainer.ops.kernel import Kernel, fbgemm_op
from trainer.ops.pytorch import pt_jagged as pt


class JaggedTokens(NamedTuple):
    """Jagged tokens: ``values`` (L, D), ``offsets`` (B + 1,), bound ``max_len``."""

    values: torch.Tensor
    offsets: torch.Tensor
    max_len: int


def segment_ids(offsets: torch.Tensor, total: int) -> torch.Tensor:
    """Sequence index of every token, (L,) int64.

    Example:
        >>> segment_ids(torch.tensor([0, 2, 2, 3]), 3).tolist()
        [0, 0, 2]
    """
    return pt.pytorch_segment_ids(offsets, total)


def gather_rows(source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``source[index]`` along dim 0, with a fast backward on CPU.

    Example:
        >>> gather_rows(torch.tensor([[1.0], [2.0]]), torch.tensor([[1, 1], [0, 1]]))[1]
        tensor([[1.],
                [2.]])
    """
    return pt.gather_rows(source, index)


def positions(offsets: torch.Tensor, total: int) -> torch.Tensor:
    """Position of every token inside its sequence (0 = oldest), (L,) int64.

    Example:
        >>> positions(torch.tensor([0, 2, 2, 3]), 3).tolist()
        [0, 1, 0]
    """
    return pt.pytorch_positions(offsets, total)


def jagged_to_padded_dense(
    values: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
    padding_value: float = 0.0,
    kernel: Kernel = Kernel.PYTORCH,
) -> torch.Tensor:
    """(L, D) jagged → (B, max_len, D) padded with ``padding_value``.

    Tokens beyond ``max_len`` are dropped. Only for tests, oracles and the one
    op that pads internally (:func:`trainer.ops.attention.jagged_self_attention`).
    """
    if kernel == Kernel.FBGEMM and values.dim() == 2:
        op = fbgemm_op("jagged_to_padded_dense", values.device)
        if op is not None:
            return op(values, [offsets], [max_len], padding_value)
    return pt.pytorch_jagged_to_padded_dense(values, offsets, max_len, padding_value)


def dense_to_jagged(
    dense: torch.Tensor,
    offsets: torch.Tensor,
    total: int,
    kernel: Kernel = Kernel.PYTORCH,
) -> torch.Tensor:
    """(B, N, D) padded → (L, D) jagged (the inverse of the above)."""
    if kernel == Kernel.FBGEMM and dense.dim() == 3:
        op = fbgemm_op("dense_to_jagged", dense.device)
        if op is not None:
            return op(dense, [offsets], total)[0]
    return pt.pytorch_dense_to_jagged(dense, offsets, total)


def segment_sum(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Sum of each sequence's tokens, (L, D) → (B, D); empty gives 0.

    Reference only (fbgemm's ``segment_sum_csr`` has no autograd).
    """
    return pt.pytorch_segment_sum(values, offsets)


def jagged_softmax(
    values: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
    kernel: Kernel = Kernel.PYTORCH,
) -> torch.Tensor:
    """Softmax over each sequence's tokens, column by column: (L, H) → (L, H).

    Example:
        >>> x = torch.zeros(3, 1)
        >>> jagged_softmax(x, torch.tensor([0, 2, 2, 3]), 2).squeeze(-1).tolist()
        [0.5, 0.5, 1.0]
    """
    if kernel == Kernel.FBGEMM and values.dim() == 2:
        op = fbgemm_op("jagged_softmax", values.device)
        if op is not None:
            return op(values, offsets, max_len)[0]
    return pt.pytorch_jagged_softmax(values, offsets)


def jagged_dense_bmm(
    values: torch.Tensor,
    offsets: torch.Tensor,
    dense: torch.Tensor,
    max_len: int,
    kernel: Kernel = Kernel.PYTORCH,
) -> torch.Tensor:
    """Token ``i`` of sequence ``b`` times ``dense[b]``: (L, K) × (B, K, N) → (L, N).

    Example:
        >>> values = torch.ones(3, 2)
        >>> dense = torch.arange(12.0).view(3, 2, 2)
        >>> jagged_dense_bmm(values, torch.tensor([0, 2, 2, 3]), dense, 2).tolist()
        [[2.0, 4.0], [2.0, 4.0], [18.0, 20.0]]
    """
    if kernel == Kernel.FBGEMM:
        op = fbgemm_op("jagged_dense_bmm", values.device)
        if op is not None:
            return op(values, offsets, dense, max_len)[0]
    return pt.pytorch_jagged_dense_bmm(values, offsets, dense)


def jagged_pool(
    values: torch.Tensor, offsets: torch.Tensor, ratio: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Strided mean pooling aligned to the newest token: ``L[b] → ceil(L[b]/r)``.

    Returns ``(values', offsets')``. Reference only; the output size is data
    dependent: one host sync in eager mode, an unbacked SymInt under
    ``torch.compile`` after :func:`trainer.ops.capture_jagged_sizes`.
    """
    return pt.pytorch_jagged_pool(values, offsets, ratio)


def jagged_prepend(
    prefix: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Put dense tokens (B, P, D) in front of each sequence: ``L[b] → P + L[b]``.

    Example:
        >>> v, o = jagged_prepend(
        ...     torch.full((2, 1, 1), -1.0), torch.ones(1, 1), torch.tensor([0, 0, 1])
        ... )
        >>> v.squeeze(-1).tolist(), o.tolist()
        ([-1.0, -1.0, 1.0], [0, 1, 3])
    """
    return pt.pytorch_jagged_prepend(prefix, values, offsets)


def jagged_concat(
    first: torch.Tensor,
    first_offsets: torch.Tensor,
    second: torch.Tensor,
    second_offsets: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Join two jagged tensors example by example: ``L[b] = L1[b] + L2[b]``.

    Both must hold the same examples; the output size is known (no host sync).

    Example:
        >>> v, o = jagged_concat(
        ...     torch.tensor([[1.0], [2.0]]), torch.tensor([0, 1, 2]),
        ...     torch.tensor([[-1.0]]), torch.tensor([0, 1, 1]),
        ... )
        >>> v.squeeze(-1).tolist(), o.tolist()
        ([1.0, -1.0, 2.0], [0, 2, 3])
    """
    return pt.pytorch_jagged_concat(first, first_offsets, second, second_offsets)


def jagged_last_k(
    values: torch.Tensor, offsets: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` newest tokens (B, k, D), newest last, zero-filled; and a mask."""
    return pt.pytorch_jagged_last_k(values, offsets, k)


def jagged_first_k(values: torch.Tensor, offsets: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` oldest tokens (B, k, D); every ``L[b]`` must be >= k."""
    return pt.pytorch_jagged_first_k(values, offsets, k)


def jagged_truncate_last(
    values: torch.Tensor, offsets: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the ``k`` newest tokens of each sequence: ``(values', offsets')``.

    The output size is data dependent, as in :func:`jagged_pool`.
    """
    return pt.pytorch_jagged_truncate_last(values, offsets, k)
