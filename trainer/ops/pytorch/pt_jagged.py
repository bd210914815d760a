"""Reference jagged tensor ops in plain PyTorch.

Layout, with ``B`` sequences, ``L = offsets[-1]`` tokens in all and ``D``
features per token::

    values   (L, D)    tokens of all sequences, packed, sequence b at
                       values[offsets[b] : offsets[b + 1]]
    offsets  (B + 1,)  int64, exclusive cumsum of the lengths, offsets[0] = 0

Sequences may be empty. The ops use gathers, ``index_add`` and
``scatter_reduce``, so their cost is linear in ``L``.
"""

from __future__ import annotations

import torch


def pytorch_segment_ids(offsets: torch.Tensor, total: int) -> torch.Tensor:
    """Sequence index of every token: (L,) int64."""
    lengths = offsets[1:] - offsets[:-1]
    batch = torch.arange(lengths.numel(), device=offsets.device)
    return torch.repeat_interleave(batch, lengths, output_size=total)


def pytorch_positions(offsets: torch.Tensor, total: int) -> torch.Tensor:
    """Position of every token inside its sequence (0 = oldest): (L,) int64."""
    seg = pytorch_segment_ids(offsets, total)
    return torch.arange(total, device=offsets.device) - offsets[seg]


def pytorch_jagged_to_padded_dense(
    values: torch.Tensor, offsets: torch.Tensor, max_len: int, padding_value: float
) -> torch.Tensor:
    """(L, D) jagged → (B, max_len, D) padded; tokens past ``max_len`` dropped."""
    total = values.shape[0]
    seg = pytorch_segment_ids(offsets, total)
    pos = torch.arange(total, device=values.device) - offsets[seg]
    keep = pos < max_len
    out = values.new_full(
        (offsets.numel() - 1, max_len, *values.shape[1:]), padding_value
    )
    return torch.index_put(out, (seg[keep], pos[keep]), values[keep])


def pytorch_dense_to_jagged(
    dense: torch.Tensor, offsets: torch.Tensor, total: int
) -> torch.Tensor:
    """(B, N, D) padded → (L, D) jagged; tokens at positions >= N become 0."""
    seg = pytorch_segment_ids(offsets, total)
    pos = torch.arange(total, device=dense.device) - offsets[seg]
    n = dense.shape[1]
    inside = (pos < n).view(-1, *([1] * (dense.dim() - 2)))
    return dense[seg, pos.clamp(max=max(n - 1, 0))] * inside


def pytorch_segment_sum(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Sum of each sequence's tokens: (L, D) → (B, D); empty sequences give 0."""
    seg = pytorch_segment_ids(offsets, values.shape[0])
    out = values.new_zeros((offsets.numel() - 1, *values.shape[1:]))
    return out.index_add(0, seg, values)


def pytorch_jagged_softmax(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Softmax over each sequence's tokens, per column: (L, H) → (L, H).

    Computed in float32 and returned in the input's dtype, as
    ``torch.softmax`` is under autocast: ``exp`` runs in float32 there anyway,
    and a bf16 sum of many exponentials drops the small ones.
    """
    dtype = values.dtype
    values = values.float()
    total = values.shape[0]
    seg = pytorch_segment_ids(offsets, total)
    num = offsets.numel() - 1
    index = seg.view(-1, *([1] * (values.dim() - 1))).expand_as(values)
    # The max only stabilises the exponent; softmax does not depend on it.
    peak = values.new_full((num, *values.shape[1:]), float("-inf"))
    peak = peak.scatter_reduce(0, index, values.detach(), "amax", include_self=True)
    exp = torch.exp(values - peak[seg])
    denom = values.new_zeros((num, *values.shape[1:])).index_add(0, seg, exp)
    return (exp / denom[seg]).to(dtype)


def pytorch_jagged_dense_bmm(
    values: torch.Tensor, offsets: torch.Tensor, dense: torch.Tensor
) -> torch.Tensor:
    """Per-sequence matmul: token i of sequence b times ``dense[b]``.

    (L, K) × (B, K, N) → (L, N). Gathers ``dense`` per token, (L, K, N), so it
    is meant for small ``K`` (the PFFN's ``n_sum``).
    """
    seg = pytorch_segment_ids(offsets, values.shape[0])
    return torch.bmm(values.unsqueeze(1), dense[seg]).squeeze(1)


def pytorch_jagged_pool(
    values: torch.Tensor, offsets: torch.Tensor, ratio: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Strided mean pooling, aligned to the newest token.

    A sequence of ``n`` tokens becomes ``ceil(n / ratio)`` tokens; output token
    ``j`` from the end averages input tokens ``[n - (j+1)·ratio, n - j·ratio)``
    (the oldest group may be short). Returns ``(values', offsets')``.
    """
    total = values.shape[0]
    lengths = offsets[1:] - offsets[:-1]
    new_lengths = torch.div(lengths + ratio - 1, ratio, rounding_mode="floor")
    new_offsets = torch.nn.functional.pad(torch.cumsum(new_lengths, 0), (1, 0))
    seg = pytorch_segment_ids(offsets, total)
    from_end = offsets[seg + 1] - 1 - torch.arange(total, device=values.device)
    target = (
        new_offsets[seg + 1] - 1 - torch.div(from_end, ratio, rounding_mode="floor")
    )
    new_total = int(new_offsets[-1])  # data-dependent size: one host sync
    summed = values.new_zeros((new_total, *values.shape[1:])).index_add(
        0, target, values
    )
    count = values.new_zeros(new_total).index_add(0, target, values.new_ones(total))
    return summed / count.view(-1, *([1] * (values.dim() - 1))), new_offsets


def pytorch_jagged_prepend(
    prefix: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Put ``P`` dense tokens (B, P, D) in front of every sequence."""
    batch, p = prefix.shape[0], prefix.shape[1]
    total = values.shape[0]
    seg = pytorch_segment_ids(offsets, total)
    arange_b = torch.arange(batch + 1, device=offsets.device)
    new_offsets = offsets + p * arange_b
    out = values.new_empty((total + batch * p, *values.shape[1:]))
    seq_dest = torch.arange(total, device=values.device) + p * (seg + 1)
    prefix_dest = (
        new_offsets[:-1].unsqueeze(1) + torch.arange(p, device=values.device)
    ).reshape(-1)
    out = torch.index_put(out, (seq_dest,), values)
    out = torch.index_put(
        out, (prefix_dest,), prefix.reshape(batch * p, *values.shape[1:])
    )
    return out, new_offsets


def pytorch_jagged_last_k(
    values: torch.Tensor, offsets: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` newest tokens of each sequence, (B, k, D), newest last.

    Sequences shorter than ``k`` are left-filled with zeros; the second output
    (B, k) bool marks the real tokens.
    """
    ends = offsets[1:].unsqueeze(1)
    starts = offsets[:-1].unsqueeze(1)
    idx = ends - k + torch.arange(k, device=values.device)
    valid = idx >= starts
    if values.shape[0] == 0:
        gathered = values.new_zeros((*idx.shape, *values.shape[1:]))
    else:
        gathered = values[idx.clamp(min=0)]
    mask = valid.view(*valid.shape, *([1] * (values.dim() - 1)))
    return gathered * mask, valid


def pytorch_jagged_first_k(
    values: torch.Tensor, offsets: torch.Tensor, k: int
) -> torch.Tensor:
    """The ``k`` oldest tokens of each sequence, (B, k, D); needs lengths >= k."""
    idx = offsets[:-1].unsqueeze(1) + torch.arange(k, device=values.device)
    return values[idx]


def pytorch_jagged_truncate_last(
    values: torch.Tensor, offsets: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the ``k`` newest tokens of each sequence: ``(values', offsets')``."""
    total = values.shape[0]
    lengths = offsets[1:] - offsets[:-1]
    new_lengths = lengths.clamp(max=k)
    new_offsets = torch.nn.functional.pad(torch.cumsum(new_lengths, 0), (1, 0))
    seg = pytorch_segment_ids(offsets, total)
    keep = torch.arange(total, device=values.device) >= offsets[seg + 1] - k
    return values[keep], new_offsets
