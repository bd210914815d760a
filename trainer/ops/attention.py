"""Jagged attention ops: one public dispatcher per op.

``q, k, v`` are jagged (L, H, Dh) with ``offsets`` (B + 1,) as in
:mod:`trainer.ops.jagged`; the scale is ``1 / sqrt(Dh)``.

Example:
    >>> q = k = v = torch.ones(3, 1, 2)
    >>> offsets = torch.tensor([0, 2, 2, 3])
    >>> jagged_local_attention(q, k, v, offsets, window=2).shape
    torch.Size([3, 1, 2])
    >>> jagged_cross_attention(torch.ones(3, 1, 1, 2), k, v, offsets, 2)[1].tolist()
    [[[0.0, 0.0]]]
"""

from __future__ import annotations

import torch

from trainer.ops.jagged import dense_to_jagged, jagged_softmax, jagged_to_padded_dense
from trainer.ops.kernel import Kernel, fbgemm_op
from trainer.ops.pytorch import pt_attention as pt


def jagged_local_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    window: int,
    kernel: Kernel = Kernel.PYTORCH,
) -> torch.Tensor:
    """Causal sliding-window attention within each sequence, (L, H, Dh).

    Token ``i`` sees itself and the ``window - 1`` previous tokens of its
    sequence. No padding: cost O(L · window). fbgemm has no such kernel, so
    every ``kernel`` runs the reference.
    """
    del kernel
    return pt.pytorch_jagged_local_attention(q, k, v, offsets, window)


def jagged_cross_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
    kernel: Kernel = Kernel.PYTORCH,
) -> torch.Tensor:
    """Dense queries (B, Q, H, Dh) attend to their own sequence: → (B, Q, H, Dh).

    Used for target-aware attention (the candidate ad as query) and PMA (seed
    queries). Empty sequences give zeros. With ``Kernel.FBGEMM`` the segment
    softmax runs ``torch.ops.fbgemm.jagged_softmax``.
    """
    if kernel == Kernel.FBGEMM and fbgemm_op("jagged_softmax", q.device) is not None:

        def fbgemm_softmax(scores: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
            return jagged_softmax(scores, offsets, max_len, kernel)

        return pt.pytorch_jagged_cross_attention(q, k, v, offsets, fbgemm_softmax)
    return pt.pytorch_jagged_cross_attention(q, k, v, offsets)


def jagged_self_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
    kernel: Kernel = Kernel.PYTORCH,
) -> torch.Tensor:
    """Bidirectional attention within each sequence, (L, H, Dh).

    **Pads inside the op** to (B, H, max_len, Dh) (the only op that does); see
    :func:`trainer.ops.pytorch.pt_attention.pytorch_jagged_self_attention`.
    ``max_len`` must bound every ``L[b]``. The attention is
    ``F.scaled_dot_product_attention``; with ``Kernel.FBGEMM`` the pad and
    unpad run fbgemm.
    """
    if (
        kernel == Kernel.FBGEMM
        and q.shape[0] > 0
        and fbgemm_op("jagged_to_padded_dense", q.device) is not None
        and fbgemm_op("dense_to_jagged", q.device) is not None
    ):

        def to_padded(
            values: torch.Tensor, offsets: torch.Tensor, max_len: int, fill: float
        ) -> torch.Tensor:
            return jagged_to_padded_dense(values, offsets, max_len, fill, kernel)

        def to_jagged(
            dense: torch.Tensor, offsets: torch.Tensor, total: int
        ) -> torch.Tensor:
            return dense_to_jagged(dense, offsets, total, kernel)

        return pt.pytorch_jagged_self_attention(
            q, k, v, offsets, max_len, to_padded, to_jagged
        )
    return pt.pytorch_jagged_self_attention(q, k, v, offsets, max_len)
