"""Reference jagged attention ops in plain PyTorch.

Shapes: ``q, k, v`` are (L, H, Dh) jagged tokens (``L = offsets[-1]``, ``H``
heads of width ``Dh``) unless stated; queries of cross attention are dense
(B, Q, H, Dh). Softmax scale is ``1 / sqrt(Dh)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from trainer.ops.pytorch.pt_jagged import (
    gather_rows,
    pytorch_dense_to_jagged,
    pytorch_jagged_softmax,
    pytorch_jagged_to_padded_dense,
    pytorch_segment_ids,
    pytorch_segment_sum,
)

SegmentSoftmax = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(scores (L, C), offsets) → weights (L, C)``, a softmax per sequence."""
ToPadded = Callable[[torch.Tensor, torch.Tensor, int, float], torch.Tensor]
"""``(values (L, D), offsets, max_len, padding_value) → (B, max_len, D)``."""
ToJagged = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
"""``(dense (B, N, D), offsets, total) → (L, D)``."""


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``allowed``, the dtype's lowest value elsewhere.

    Additive, not boolean: the CPU's fused attention is faster with it,
    forward and backward.
    """
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return bias.masked_fill(~allowed, torch.finfo(dtype).min)


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
    packed tokens are read as a grid of chunks of ``window`` positions, and
    each chunk's queries attend to that chunk and the one before it (every
    key a query can see is there) under a mask for the band and the sequence
    boundary. That is one ``scaled_dot_product_attention`` over
    (L / window, H, window, 2 window): twice the band's multiply-adds, but as
    batched matmuls instead of a gathered (L, window, H, Dh) copy of the keys
    and values, which is much slower on CPU (``benchmarks/README.md``).

    Written for torch.compile, where ``L`` is symbolic (unbacked after a
    pyramid level): the chunks are gathered from ``q, k, v`` topped up with a
    fixed number of zeros, never cut from tensors of data-dependent size, as
    data-dependent zero fills and slices each cost a guard (so a second
    graph for some ``L``), a graph break, or (torch 2.11's inductor) a failed
    lowering.
    """
    total, heads, dh = q.shape
    chunk = window
    # Positions past the last token (more than one chunk of them, at most
    # two) are a sequence of their own that no real query sees. At least two
    # chunks, so that CUDA's scaled_dot_product_attention can tell that its
    # batch (the chunk count) is not 1: it asks, and for an unbacked count
    # the question broke the graph.
    num_chunks = total // chunk + 2
    position = torch.arange(num_chunks * chunk, device=q.device).view(num_chunks, chunk)
    key_pos = position[:, :1] - chunk + torch.arange(2 * chunk, device=q.device)
    # First position of every position's sequence: offsets[b] inside
    # sequence b, ``total`` past the end (offsets[B] is the total).
    first = offsets[torch.searchsorted(offsets[1:], position, right=True)]
    query_at = position[:, :, None]  # (C, W, 1)
    key_at = key_pos[:, None, :]  # (C, 1, 2W)
    visible = (
        (key_at <= query_at)
        & (key_at > query_at - window)
        & (key_at >= first[:, :, None])
    )  # (C, W, 2W)

    def gather(t: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        # Rows ``at`` of ``t`` (-chunk <= at < total + 2 chunk), zeros outside.
        zeros = t.new_zeros(chunk, heads * dh)
        topped_up = torch.cat([zeros, t.reshape(total, heads * dh), zeros, zeros])
        rows = topped_up.index_select(0, (at + chunk).flatten())
        return rows.view(*at.shape, heads, dh).transpose(1, 2)  # (C, H, n, Dh)

    # Every query sees itself, so no row is masked whole.
    out = F.scaled_dot_product_attention(
        gather(q, position),
        gather(k, key_pos),
        gather(v, key_pos),
        attn_mask=additive_mask(visible, q.dtype).unsqueeze(1),
    )
    out = out.transpose(1, 2).reshape(num_chunks * chunk, heads, dh)
    return out.index_select(0, torch.arange(total, device=q.device))


def pytorch_jagged_cross_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    segment_softmax: SegmentSoftmax = pytorch_jagged_softmax,
) -> torch.Tensor:
    """Dense queries (B, Q, H, Dh) attend to their own sequence's tokens.

    Returns (B, Q, H, Dh); an empty sequence gives zeros. Jagged-native:
    scores are (L, Q, H), normalised with ``segment_softmax(scores,
    offsets)`` (a fast kernel's may replace this reference).
    """
    total = k.shape[0]
    batch, nq, heads, dh = q.shape
    seg = pytorch_segment_ids(offsets, total)
    # Broadcast products, not einsum: on CPU einsum runs these as L tiny
    # matmuls, slower forward and backward.
    scores = (k.unsqueeze(1) * gather_rows(q, seg)).sum(-1) / math.sqrt(dh)
    weights = segment_softmax(scores.reshape(total, nq * heads), offsets)
    weighted = weights.view(total, nq, heads, 1) * v.unsqueeze(1)
    out = pytorch_segment_sum(weighted.reshape(total, nq * heads * dh), offsets)
    return out.view(batch, nq, heads, dh)


def pytorch_jagged_self_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
    to_padded: ToPadded = pytorch_jagged_to_padded_dense,
    to_jagged: ToJagged = pytorch_dense_to_jagged,
) -> torch.Tensor:
    """Bidirectional attention inside each sequence.

    **This op pads**: it lays the batch out as (B, H, max_len, Dh) with a key
    mask, inside the op only, and returns jagged (L, H, Dh). It is used on
    short token sets (the pyramid's top level plus summary tokens), so the
    (B, H, max_len, max_len) scores stay small. ``max_len`` must be at least
    the longest sequence. ``to_padded`` / ``to_jagged`` lay the tokens out
    and back (a fast kernel's may replace these references).
    """
    total, heads, dh = q.shape
    batch = offsets.numel() - 1
    flat = (total, heads * dh)
    pad = [
        to_padded(t.reshape(flat), offsets, max_len, 0.0)
        .view(batch, max_len, heads, dh)
        .transpose(1, 2)
        for t in (q, k, v)
    ]
    lengths = offsets[1:] - offsets[:-1]
    key_ok = torch.arange(max_len, device=q.device) < lengths.unsqueeze(1)  # (B, N)
    # Fused, not written out: a CPU softmax over rows shorter than a vector
    # register takes a slow path (benchmarks/README.md, model speed). The
    # mask is additive, so a row with no key (padding queries of an empty
    # sequence) stays finite; it is dropped below.
    bias = additive_mask(key_ok, q.dtype)[:, None, None, :]
    out = F.scaled_dot_product_attention(pad[0], pad[1], pad[2], attn_mask=bias)
    out = out.transpose(1, 2).reshape(batch, max_len, heads * dh)
    return to_jagged(out, offsets, total).view(total, heads, dh)
