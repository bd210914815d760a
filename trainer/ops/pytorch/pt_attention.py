"""Reference jagged attention ops in plain PyTorch.

Shapes: ``q, k, v`` are (L, H, Dh) jagged tokens (``L = offsets[-1]``, ``H``
heads of width ``Dh``) unless stated; queries of cross attention are dense
(B, Q, H, Dh). Softmax scale is ``1 / sqrt(Dh)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from trainer.ops.pytorch.pt_jagged import (
    check_size,
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
    its own sequence. Jagged-native, no padding to the longest sequence: the
    packed tokens are cut into chunks of ``window`` (the last one topped up
    with fewer than ``window`` zeros), and each chunk's queries attend to
    that chunk and the one before it (every key a query can see is there)
    under a mask for the band and the sequence boundary. That is one
    ``scaled_dot_product_attention`` over (L / window, H, window, 2 window):
    twice the band's multiply-adds, but as batched matmuls instead of a
    gathered (L, window, H, Dh) copy of the keys and values, which made the
    op 9-15x slower on CPU at window 16.
    """
    total, heads, dh = q.shape
    chunk = window
    num_chunks = (total + chunk - 1) // chunk
    pad = num_chunks * chunk - total
    check_size(pad)
    seg = pytorch_segment_ids(offsets, total)
    # First token of every token's sequence; the top-up tokens are a
    # sequence of their own (they start at ``total``), so no real query sees
    # them.
    first = torch.cat([offsets[seg], offsets.new_full((pad,), total)])
    first = first.view(num_chunks, chunk, 1)

    def with_previous_chunk(t: torch.Tensor) -> torch.Tensor:
        # A zero chunk in front, then chunk i's keys are chunks i-1 and i.
        # (torch.cat, not F.pad: under torch.compile ``pad`` is a
        # data-dependent size, which F.pad cannot take.)
        chunks = torch.cat(
            [t.new_zeros(chunk, heads, dh), t, t.new_zeros(pad, heads, dh)]
        ).view(num_chunks + 1, chunk, heads, dh)
        return torch.cat([chunks[:-1], chunks[1:]], dim=1).transpose(1, 2)

    position = torch.arange(num_chunks * chunk, device=q.device).view(num_chunks, chunk)
    query_pos = position.unsqueeze(2)  # (C, W, 1)
    key_pos = (position[:, :1] - chunk + torch.arange(2 * chunk, device=q.device))[
        :, None, :
    ]  # (C, 1, 2W)
    visible = (
        (key_pos <= query_pos) & (key_pos > query_pos - window) & (key_pos >= first)
    )
    queries = torch.cat([q, q.new_zeros(pad, heads, dh)])
    queries = queries.view(num_chunks, chunk, heads, dh)
    out = F.scaled_dot_product_attention(
        queries.transpose(1, 2),
        with_previous_chunk(k),
        with_previous_chunk(v),
        attn_mask=visible.unsqueeze(1),
    )
    return out.transpose(1, 2).reshape(num_chunks * chunk, heads, dh)[:total]


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
