"""Jagged attention ops vs per-sequence padded-and-masked dense attention."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_ops_jagged import (
    KERNELS,
    LONG,
    assert_same_with_grads,
    offsets_of,
    split,
)
from trainer.ops import (
    Kernel,
    jagged_cross_attention,
    jagged_local_attention,
    jagged_self_attention,
)

LENGTHS = st.lists(st.integers(0, 10), min_size=1, max_size=5)
SETTINGS = settings(max_examples=15, deadline=None)


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """(T, H, Dh) attention of one sequence with an optional (Tq, Tk) mask."""
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v)


def causal_band(n: int, window: int) -> torch.Tensor:
    """(n, n) mask: each position sees itself and the ``window - 1`` before it."""
    i = torch.arange(n)
    return (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)


def per_sequence_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: list[int],
    mask: Callable[[int], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Jagged (T, H, Dh) attention one sequence at a time, dense, each with
    ``mask(n)`` for its length ``n`` (None: unmasked); empty ones stay empty."""
    outs = [
        dense_attention(qs, ks, vs, mask(qs.shape[0]) if mask else None)
        if qs.shape[0]
        else qs
        for qs, ks, vs in zip(*(split(t, lengths) for t in (q, k, v)), strict=True)
    ]
    return torch.cat(outs)


def qkv(total: int, heads: int = 2, dh: int = 4) -> list[torch.Tensor]:
    return [torch.randn(total, heads, dh) for _ in range(3)]


@SETTINGS
@given(lengths=LENGTHS, window=st.integers(1, 6))
def test_local_attention(lengths: list[int], window: int) -> None:
    offsets = offsets_of(lengths)
    assert_same_with_grads(
        lambda q, k, v: jagged_local_attention(q, k, v, offsets, window),
        lambda q, k, v: per_sequence_attention(
            q, k, v, lengths, lambda n: causal_band(n, window)
        ),
        *qkv(sum(lengths)),
    )


@pytest.mark.parametrize("kernel", KERNELS)
@SETTINGS
@given(lengths=LENGTHS, nq=st.integers(1, 3))
def test_cross_attention(kernel: Kernel, lengths: list[int], nq: int) -> None:
    offsets = offsets_of(lengths)
    query = torch.randn(len(lengths), nq, 2, 4)

    def oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        outs = []
        for b, (ks, vs) in enumerate(
            zip(split(k, lengths), split(v, lengths), strict=True)
        ):
            if ks.shape[0] == 0:
                outs.append(
                    torch.zeros_like(q[b])
                )  # an empty history attends to nothing
            else:
                outs.append(dense_attention(q[b], ks, vs, None))
        return torch.stack(outs)

    _, k, v = qkv(sum(lengths))
    assert_same_with_grads(
        lambda q, k, v: jagged_cross_attention(
            q, k, v, offsets, max(max(lengths), 1), kernel
        ),
        oracle,
        query,
        k,
        v,
    )


@pytest.mark.parametrize("kernel", KERNELS)
@SETTINGS
@given(lengths=LENGTHS, extra=st.integers(0, 4))
def test_self_attention(kernel: Kernel, lengths: list[int], extra: int) -> None:
    offsets = offsets_of(lengths)
    max_len = max(lengths) + extra  # extra padding inside the op must not matter
    assert_same_with_grads(
        lambda q, k, v: jagged_self_attention(q, k, v, offsets, max_len, kernel),
        lambda q, k, v: per_sequence_attention(q, k, v, lengths),
        *qkv(sum(lengths)),
    )


def test_long_history_attention() -> None:
    offsets = offsets_of(LONG)
    q, k, v = qkv(sum(LONG), heads=1, dh=2)
    local = jagged_local_attention(q, k, v, offsets, window=4)
    expected = dense_attention(q[:4096], k[:4096], v[:4096], causal_band(4096, 4))
    torch.testing.assert_close(local[:4096], expected, atol=1e-5, rtol=1e-4)
    query = torch.randn(3, 2, 1, 2)
    cross = jagged_cross_attention(query, k, v, offsets, 4096)
    torch.testing.assert_close(
        cross[1], dense_attention(query[1], k[:4096], v[:4096], None)
    )
    assert not cross[0].any()
