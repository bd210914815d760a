"""Reference jagged attention ops in plain PyTorch.

Shapes: ``q, k, v`` are (L, H, Dh) jagged tokens (``L = offsets[-1]``, ``H``
heads of width ``Dh``) unless stated; queries of cross attention are dense
(B, Q, H, Dh). Softmax scale is ``1 / sqrt(Dh)``.
"""

from __future__ import annotations

import math

import torch

from trainer.ops.pytorch.pt_jagged import (
    pytorch_dense_to_jagged,
    pytorch_jagged_softmax,
    pytorch_jagged_to_padded_dense,
    pytorch_segment_ids,
    pytorch_segment_sum,
)


def pytorch_jagged_local_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    window: int,
) -> torch.Tensor:
    """Causal sliding-window attention inside each sequence.

    Token ``i`` attends to itself and the ``window - 1`` tokens before it in
    its own sequence. Jagged-native: gathers a (L, window, H, Dh) band, no
    padding to the longest sequence.
    """
    total = q.shape[0]
    seg = pytorch_segment_ids(offsets, total)
    idx = torch.arange(total, device=q.device).unsqueeze(1) - torch.arange(
        window, device=q.device
    )
    valid = idx >= offsets[seg].unsqueeze(1)  # (L, W); column 0 always valid
    idx = idx.clamp(min=0)
    scores = torch.einsum("lhd,lwhd->lwh", q, k[idx]) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~valid.unsqueeze(-1), float("-inf"))
    weights = torch.softmax(scores, dim=1)
    return torch.einsum("lwh,lwhd->lhd", weights, v[idx])


def pytorch_jagged_cross_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
) -> torch.Tensor:
    """Dense queries (B, Q, H, Dh) attend to their own sequence's tokens.

    Returns (B, Q, H, Dh); an empty sequence gives zeros. Jagged-native:
    scores are (L, Q, H), normalised with a segment softmax.
    """
    total = k.shape[0]
    batch, nq, heads, dh = q.shape
    seg = pytorch_segment_ids(offsets, total)
    scores = torch.einsum("lhd,lqhd->lqh", k, q[seg]) / math.sqrt(dh)
    weights = pytorch_jagged_softmax(scores.reshape(total, nq * heads), offsets)
    weighted = torch.einsum("lqh,lhd->lqhd", weights.view(total, nq, heads), v)
    out = pytorch_segment_sum(weighted.reshape(total, nq * heads * dh), offsets)
    return out.view(batch, nq, heads, dh)


def pytorch_jagged_self_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
) -> torch.Tensor:
    """Bidirectional attention inside each sequence.

    **This op pads**: it lays the batch out as (B, H, max_len, Dh) with a key
    mask, inside the op only, and returns jagged (L, H, Dh). It is used on
    short token sets (the pyramid's top level plus summary tokens), so the
    (B, H, max_len, max_len) scores stay small. ``max_len`` must be at least
    the longest sequence.
    """
    total, heads, dh = q.shape
    batch = offsets.numel() - 1
    flat = (total, heads * dh)
    pad = [
        pytorch_jagged_to_padded_dense(t.reshape(flat), offsets, max_len, 0.0)
        .view(batch, max_len, heads, dh)
        .transpose(1, 2)
        for t in (q, k, v)
    ]
    lengths = offsets[1:] - offsets[:-1]
    key_ok = torch.arange(max_len, device=q.device) < lengths.unsqueeze(1)  # (B, N)
    scores = pad[0] @ pad[1].transpose(-1, -2) / math.sqrt(dh)  # (B, H, N, N)
    # A finite fill keeps rows of padding queries finite (they are dropped).
    fill = torch.finfo(scores.dtype).min
    scores = scores.masked_fill(~key_ok[:, None, None, :], fill)
    out = torch.softmax(scores, dim=-1) @ pad[2]  # (B, H, N, Dh)
    out = out.transpose(1, 2).reshape(batch, max_len, heads * dh)
    return pytorch_dense_to_jagged(out, offsets, total).view(total, heads, dh)
