"""Jagged ops vs per-sequence padded-and-masked oracles, forward and backward.

Each op runs with both kernels (the pure-PyTorch reference and the fbgemm path,
which falls back to the reference where fbgemm has no kernel) and is compared
with an oracle that handles one sequence at a time as a dense tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.ops import (
    Kernel,
    dense_to_jagged,
    fbgemm_op,
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

KERNELS = [Kernel.PYTORCH, Kernel.FBGEMM]
LENGTHS = st.lists(st.integers(0, 12), min_size=1, max_size=6)
LONG = [0, 4096, 3]  # the long-history case: few, small dims
SETTINGS = settings(max_examples=20, deadline=None)


def offsets_of(lengths: Sequence[int]) -> torch.Tensor:
    return torch.tensor(
        [0, *torch.tensor(lengths).cumsum(0).tolist()][: len(lengths) + 1]
    )


def random_jagged(
    lengths: Sequence[int], width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random jagged values of ``width`` columns for ``lengths``, and their offsets."""
    return torch.randn(sum(lengths), width), offsets_of(lengths)


def split(values: torch.Tensor, lengths: Sequence[int]) -> list[torch.Tensor]:
    return list(values.split(list(lengths)))


def assert_same_with_grads(
    fast: Callable[..., torch.Tensor],
    oracle: Callable[..., torch.Tensor],
    *inputs: torch.Tensor,
) -> None:
    """Same outputs, and same gradients for a random cotangent."""
    a = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    b = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out_a, out_b = fast(*a), oracle(*b)
    torch.testing.assert_close(out_a, out_b, atol=1e-5, rtol=1e-4)
    cot = torch.randn_like(out_a)
    diff = [x for x in a if x.requires_grad]
    if out_a.numel() == 0 or not diff or all(x.numel() == 0 for x in diff):
        return

    def grads(out: torch.Tensor, xs: list[torch.Tensor]) -> list[torch.Tensor | None]:
        if not out.requires_grad:  # e.g. every sequence empty: a constant output
            return [None] * len(xs)
        return list(torch.autograd.grad(out, xs, cot, allow_unused=True))

    grads_a = grads(out_a, diff)
    grads_b = grads(out_b, [x for x in b if x.requires_grad])
    for ga, gb in zip(grads_a, grads_b, strict=True):
        if ga is None or gb is None:
            assert ga is None or not ga.any()
            assert gb is None or not gb.any()
        else:
            torch.testing.assert_close(ga, gb, atol=1e-5, rtol=1e-4)


def test_segment_ids_and_positions() -> None:
    offsets = offsets_of([2, 0, 3])
    assert segment_ids(offsets, 5).tolist() == [0, 0, 2, 2, 2]
    assert positions(offsets, 5).tolist() == [0, 1, 0, 1, 2]


@pytest.mark.parametrize("index", [[2, 0, 2, 2], [[1, 1], [0, 2]]])
def test_gather_rows_is_indexing(index: list[int] | list[list[int]]) -> None:
    source = torch.randn(3, 2, 4)
    rows = torch.tensor(index)
    assert_same_with_grads(lambda s: gather_rows(s, rows), lambda s: s[rows], source)


def test_fbgemm_lookup_is_lazy_and_device_aware() -> None:
    assert fbgemm_op("no_such_op", torch.device("cpu")) is None
    assert fbgemm_op("jagged_softmax", torch.device("meta")) is None


@pytest.mark.parametrize("kernel", KERNELS)
@SETTINGS
@given(lengths=LENGTHS, pad=st.floats(-5, 5))
def test_padded_round_trip(kernel: Kernel, lengths: list[int], pad: float) -> None:
    values, offsets = random_jagged(lengths, 3)
    max_len = max(lengths) + 1

    def oracle(v: torch.Tensor) -> torch.Tensor:
        rows = [
            torch.cat([s, s.new_full((max_len - s.shape[0], 3), pad)])
            for s in split(v, lengths)
        ]
        return torch.stack(rows)

    assert_same_with_grads(
        lambda v: jagged_to_padded_dense(v, offsets, max_len, pad, kernel),
        oracle,
        values,
    )
    padded = jagged_to_padded_dense(values, offsets, max_len, pad, kernel)
    back = dense_to_jagged(padded, offsets, values.shape[0], kernel)
    torch.testing.assert_close(back, values)  # the padding value never leaks


@pytest.mark.parametrize("kernel", KERNELS)
@SETTINGS
@given(lengths=LENGTHS, heads=st.integers(1, 3))
def test_jagged_softmax(kernel: Kernel, lengths: list[int], heads: int) -> None:
    values = torch.randn(sum(lengths), heads) * 3
    offsets = offsets_of(lengths)
    max_len = max(lengths)

    def oracle(v: torch.Tensor) -> torch.Tensor:
        parts = [torch.softmax(s, dim=0) for s in split(v, lengths)]
        return torch.cat(parts) if parts else v

    assert_same_with_grads(
        lambda v: jagged_softmax(v, offsets, max_len, kernel), oracle, values
    )


@SETTINGS
@given(lengths=LENGTHS)
def test_segment_sum(lengths: list[int]) -> None:
    values, offsets = random_jagged(lengths, 2)
    assert_same_with_grads(
        lambda v: segment_sum(v, offsets),
        lambda v: torch.stack([s.sum(0) for s in split(v, lengths)]),
        values,
    )


@pytest.mark.parametrize("kernel", KERNELS)
@SETTINGS
@given(lengths=LENGTHS, k=st.integers(1, 4))
def test_jagged_dense_bmm(kernel: Kernel, lengths: list[int], k: int) -> None:
    values, offsets = random_jagged(lengths, k)
    dense = torch.randn(len(lengths), k, 3)

    def oracle(v: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return torch.cat([s @ d[b] for b, s in enumerate(split(v, lengths))])

    assert_same_with_grads(
        lambda v, d: jagged_dense_bmm(v, offsets, d, max(max(lengths), 1), kernel),
        oracle,
        values,
        dense,
    )


@SETTINGS
@given(lengths=LENGTHS, ratio=st.integers(1, 5))
def test_jagged_pool(lengths: list[int], ratio: int) -> None:
    values, offsets = random_jagged(lengths, 2)

    def oracle_one(s: torch.Tensor) -> torch.Tensor:
        # Groups of `ratio` counted from the newest token; the oldest may be short.
        groups = []
        end = s.shape[0]
        while end > 0:
            groups.append(s[max(0, end - ratio) : end].mean(0))
            end -= ratio
        return torch.stack(groups[::-1]) if groups else s

    _pooled, new_offsets = jagged_pool(values, offsets, ratio)
    expected_lengths = [-(-n // ratio) for n in lengths]
    assert new_offsets.tolist() == offsets_of(expected_lengths).tolist()
    assert_same_with_grads(
        lambda v: jagged_pool(v, offsets, ratio)[0],
        lambda v: torch.cat([oracle_one(s) for s in split(v, lengths)]),
        values,
    )


@SETTINGS
@given(lengths=LENGTHS, p=st.integers(1, 3))
def test_jagged_prepend(lengths: list[int], p: int) -> None:
    values, offsets = random_jagged(lengths, 2)
    prefix = torch.randn(len(lengths), p, 2)
    _, new_offsets = jagged_prepend(prefix, values, offsets)
    assert new_offsets.tolist() == offsets_of([n + p for n in lengths]).tolist()
    assert_same_with_grads(
        lambda x, v: jagged_prepend(x, v, offsets)[0],
        lambda x, v: torch.cat(
            [torch.cat([x[b], s]) for b, s in enumerate(split(v, lengths))]
        ),
        prefix,
        values,
    )


def test_jagged_concat_promotes_mixed_dtypes_as_cat_does() -> None:
    # Under CPU bf16 autocast the CLS tokens (a matmul: bf16) met fp32 event
    # tokens here, and the scatter into a bf16 buffer failed.
    first = torch.randn(5, 3).bfloat16()
    second = torch.randn(4, 3)
    first_offsets, second_offsets = offsets_of([2, 3]), offsets_of([1, 3])
    out, _ = jagged_concat(first, first_offsets, second, second_offsets)
    assert out.dtype == torch.cat([first, second]).dtype == torch.float32
    expected = torch.cat([first[:2].float(), second[:1], first[2:].float(), second[1:]])
    torch.testing.assert_close(out, expected)


@SETTINGS
@given(lengths=LENGTHS, data=st.data())
def test_jagged_concat(lengths: list[int], data: st.DataObject) -> None:
    second_lengths = data.draw(
        st.lists(st.integers(0, 12), min_size=len(lengths), max_size=len(lengths))
    )
    first, second = torch.randn(sum(lengths), 2), torch.randn(sum(second_lengths), 2)
    first_offsets, second_offsets = offsets_of(lengths), offsets_of(second_lengths)
    _, new_offsets = jagged_concat(first, first_offsets, second, second_offsets)
    assert (
        new_offsets.tolist()
        == offsets_of(
            [a + b for a, b in zip(lengths, second_lengths, strict=True)]
        ).tolist()
    )
    assert_same_with_grads(
        lambda a, b: jagged_concat(a, first_offsets, b, second_offsets)[0],
        lambda a, b: torch.cat(
            [
                torch.cat([x, y])
                for x, y in zip(
                    split(a, lengths), split(b, second_lengths), strict=True
                )
            ]
        ),
        first,
        second,
    )


@SETTINGS
@given(lengths=LENGTHS, k=st.integers(1, 5))
def test_last_first_and_truncate(lengths: list[int], k: int) -> None:
    values, offsets = random_jagged(lengths, 2)

    def last_oracle(v: torch.Tensor) -> torch.Tensor:
        rows = []
        for s in split(v, lengths):
            tail = s[-k:] if s.shape[0] else s
            rows.append(torch.cat([s.new_zeros(k - tail.shape[0], 2), tail]))
        return torch.stack(rows)

    assert_same_with_grads(
        lambda v: jagged_last_k(v, offsets, k)[0], last_oracle, values
    )
    mask = jagged_last_k(values, offsets, k)[1]
    assert mask.sum(1).tolist() == [min(n, k) for n in lengths]

    truncated, new_offsets = jagged_truncate_last(values, offsets, k)
    assert new_offsets.tolist() == offsets_of([min(n, k) for n in lengths]).tolist()
    expected = [s[max(0, s.shape[0] - k) :] for s in split(values, lengths)]
    torch.testing.assert_close(truncated, torch.cat(expected))

    long_enough = [n + k for n in lengths]
    values = torch.randn(sum(long_enough), 2)
    first = jagged_first_k(values, offsets_of(long_enough), k)
    torch.testing.assert_close(
        first, torch.stack([s[:k] for s in split(values, long_enough)])
    )


@pytest.mark.parametrize("kernel", KERNELS)
def test_long_history_of_4096(kernel: Kernel) -> None:
    values = torch.randn(sum(LONG), 1)
    offsets = offsets_of(LONG)
    soft = jagged_softmax(values, offsets, 4096, kernel)
    torch.testing.assert_close(soft[:4096], torch.softmax(values[:4096], 0))
    pooled, new_offsets = jagged_pool(values, offsets, 4)
    assert new_offsets.tolist() == [0, 0, 1024, 1025]
    torch.testing.assert_close(pooled[:1024], values[:4096].view(1024, 4, 1).mean(1))
    dense = torch.randn(3, 1, 2)
    out = jagged_dense_bmm(values, offsets, dense, 4096, kernel)
    torch.testing.assert_close(out[:4096], values[:4096] @ dense[1])
    padded = jagged_to_padded_dense(values, offsets, 4096, 0.0, kernel)
    assert padded.shape == (3, 4096, 1)
    assert not padded[0].any()


def test_jagged_softmax_in_bf16_is_computed_in_float32() -> None:
    """A bf16 input (what autocast hands the op) gives bf16 out, summing to 1."""
    torch.manual_seed(0)
    offsets = torch.tensor([0, 3, 3, 700])
    scores = torch.randn(700, 2) * 4
    out = jagged_softmax(scores.bfloat16(), offsets, 697)
    assert out.dtype == torch.bfloat16
    expected = jagged_softmax(scores.bfloat16().float(), offsets, 697)
    torch.testing.assert_close(out.float(), expected, atol=4e-3, rtol=1e-2)
    segment = torch.tensor([0] * 3 + [2] * 697)
    sums = torch.zeros(3, 2).index_add(0, segment, out.float())
    torch.testing.assert_close(sums[[0, 2]], torch.ones(2, 2), atol=2e-2, rtol=0)
