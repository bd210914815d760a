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

# torch 2.13 deprecates ``_check_is_size`` for ``_check(i >= 0)``; older
# releases (the GPU machine runs 2.11) use it to treat an unbacked size as a
# size (size-oblivious guards).
_SIZE_CHECK_DEPRECATED = hasattr(torch._check_is_size, "__deprecated__")


def check_size(n: int) -> None:
    """Tell ``torch.compile`` that a computed (maybe data-dependent) int is a
    size, >= 0; a no-op check in eager mode."""
    if _SIZE_CHECK_DEPRECATED:
        torch._check(n >= 0)  # type: ignore[no-untyped-call]
    else:
        torch._check_is_size(n)  # type: ignore[no-untyped-call]


def _total(offsets: torch.Tensor) -> int:
    """``offsets[-1]`` as a size: a host sync in eager mode, an unbacked
    SymInt under ``torch.compile`` (needs ``capture_scalar_outputs``)."""
    total = offsets[-1].item()
    check_size(total)
    return total


def gather_rows(source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``source[index]`` for an integer ``index`` of any shape along dim 0.

    Gathers with ``index_select``, whose backward is an ``index_add``: the
    backward of ``source[index]`` is an accumulating ``index_put``, several
    times slower on CPU (``benchmarks/README.md``, model speed).
    """
    rows = source.index_select(0, index.reshape(-1))
    return rows.view(*index.shape, *source.shape[1:])


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
    batch = offsets.numel() - 1
    # Tokens past max_len land in one spare row, dropped below: a boolean
    # mask would give a data-dependent shape (a graph break under compile).
    row = torch.where(pos < max_len, seg * max_len + pos, batch * max_len)
    out = values.new_full((batch * max_len + 1, *values.shape[1:]), padding_value)
    out = torch.index_put(out, (row,), values)
    return out[:-1].view(batch, max_len, *values.shape[1:])


def pytorch_dense_to_jagged(
    dense: torch.Tensor, offsets: torch.Tensor, total: int
) -> torch.Tensor:
    """(B, N, D) padded → (L, D) jagged; tokens at positions >= N become 0."""
    seg = pytorch_segment_ids(offsets, total)
    pos = torch.arange(total, device=dense.device) - offsets[seg]
    n = dense.shape[1]
    inside = (pos < n).view(-1, *([1] * (dense.dim() - 2)))
    flat = dense.reshape(-1, *dense.shape[2:])
    rows = gather_rows(flat, seg * n + pos.clamp(max=max(n - 1, 0)))
    return rows * inside


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
    exp = torch.exp(values - gather_rows(peak, seg))
    denom = values.new_zeros((num, *values.shape[1:])).index_add(0, seg, exp)
    return (exp / gather_rows(denom, seg)).to(dtype)


def pytorch_jagged_dense_bmm(
    values: torch.Tensor, offsets: torch.Tensor, dense: torch.Tensor
) -> torch.Tensor:
    """Per-sequence matmul: token i of sequence b times ``dense[b]``.

    (L, K) × (B, K, N) → (L, N). Gathers ``dense`` per token, (L, K, N), so it
    is meant for small ``K`` (the PFFN's ``n_sum``). A broadcast product summed
    over ``K``: a bmm of L tiny matrices is slower on CPU.
    """
    seg = pytorch_segment_ids(offsets, values.shape[0])
    return (values.unsqueeze(-1) * gather_rows(dense, seg)).sum(1)


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
    new_total = _total(new_offsets)
    summed = values.new_zeros((new_total, *values.shape[1:])).index_add(
        0, target, values
    )
    count = values.new_zeros(new_total).index_add(0, target, values.new_ones(total))
    return summed / count.view(-1, *([1] * (values.dim() - 1))), new_offsets


def pytorch_jagged_concat(
    first: torch.Tensor,
    first_offsets: torch.Tensor,
    second: torch.Tensor,
    second_offsets: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each example's ``first`` tokens followed by its ``second`` tokens.

    Mixed dtypes promote as ``torch.cat`` promotes them: under autocast one
    part can come out of a matmul in bf16 and the other out of an fp32 op
    (which ops run in which dtype differs between CPU and CUDA autocast).
    """
    dtype = torch.promote_types(first.dtype, second.dtype)
    first, second = first.to(dtype), second.to(dtype)
    n_first, n_second = first.shape[0], second.shape[0]
    new_offsets = first_offsets + second_offsets
    # Token j of example b's first part lands after example b's earlier
    # second parts; token j of its second part, after its whole first part:
    # two scatters of known size, no mask.
    seg_first = pytorch_segment_ids(first_offsets, n_first)
    seg_second = pytorch_segment_ids(second_offsets, n_second)
    first_dest = torch.arange(n_first, device=first.device) + second_offsets[seg_first]
    second_dest = (
        torch.arange(n_second, device=first.device) + first_offsets[seg_second + 1]
    )
    out = first.new_empty((n_first + n_second, *first.shape[1:]))
    out = torch.index_put(out, (first_dest,), first)
    out = torch.index_put(out, (second_dest,), second)
    return out, new_offsets


def pytorch_jagged_prepend(
    prefix: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Put ``P`` dense tokens (B, P, D) in front of every sequence."""
    batch, p = prefix.shape[0], prefix.shape[1]
    # A dense prefix is a jagged tensor whose every length is P.
    prefix_offsets = p * torch.arange(batch + 1, device=offsets.device)
    return pytorch_jagged_concat(
        prefix.reshape(batch * p, *values.shape[1:]), prefix_offsets, values, offsets
    )


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
    mask = valid.view(*valid.shape, *([1] * (values.dim() - 1)))
    if not torch.compiler.is_compiling():
        if values.shape[0] == 0:
            return values.new_zeros((*idx.shape, *values.shape[1:])), valid
        return gather_rows(values, idx.clamp(min=0)) * mask, valid
    # Compiled, L may be a data-dependent size that cannot be tested for 0
    # without a graph break: gather from [zero row ∥ values] instead.
    source = torch.cat([values.new_zeros((1, *values.shape[1:])), values])
    return gather_rows(source, torch.where(valid, idx + 1, 0)), valid


def pytorch_jagged_first_k(
    values: torch.Tensor, offsets: torch.Tensor, k: int
) -> torch.Tensor:
    """The ``k`` oldest tokens of each sequence, (B, k, D); needs lengths >= k."""
    idx = offsets[:-1].unsqueeze(1) + torch.arange(k, device=values.device)
    return gather_rows(values, idx)


def pytorch_jagged_truncate_last(
    values: torch.Tensor, offsets: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the ``k`` newest tokens of each sequence: ``(values', offsets')``."""
    lengths = offsets[1:] - offsets[:-1]
    new_lengths = lengths.clamp(max=k)
    new_offsets = torch.nn.functional.pad(torch.cumsum(new_lengths, 0), (1, 0))
    new_total = _total(new_offsets)
    # Nothing to drop: no gather. Not when compiled, where testing the
    # data-dependent size would break the graph.
    if not torch.compiler.is_compiling() and new_total == values.shape[0]:
        return values, offsets
    # Output token j of sequence b is input token j + (dropped tokens of
    # sequences 0..b): a gather with a known size (a boolean mask would not be).
    shift = offsets[1:] - new_offsets[1:]
    seg = pytorch_segment_ids(new_offsets, new_total)
    src = torch.arange(new_total, device=values.device) + shift[seg]
    return gather_rows(values, src), new_offsets
