"""Row orders and distinct values of integer and id columns, without string sorts.

Pure numpy / pyarrow (the batch job, the streaming job and the reference all
use them):

- :func:`int_order`: the stable order of rows by integer keys, from one
  argsort of a composite key where the keys' ranges allow it;
- :func:`timeline_order`: the same, then by ``event_id`` (byte-wise), where
  only the rows whose integer keys tie pay a string sort;
- :func:`distinct_sorted` and :func:`first_of_each`: distinct ints by one
  sort, first positions of distinct ids by one scatter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.core.columns import IntArray, dictionary_codes

INT64_HEADROOM: Final = 2**62
"""Composite int64 keys stay below this (room for the offsets added to them)."""


def int_order(keys: Sequence[IntArray]) -> IntArray:
    """Stable row order sorting by integer ``keys`` (most significant first).

    ``np.lexsort`` when the keys' ranges multiply past int64; otherwise one
    stable argsort of a composite key, several times faster: one pass instead
    of one per key, and numpy's stable sort (timsort) merges presorted runs,
    which is what concatenated sorted pieces are.

    Example:
        >>> int_order([np.array([2, 1, 1]), np.array([5, 7, 6])]).tolist()
        [2, 1, 0]
    """
    keys = [np.asarray(k, dtype=np.int64) for k in keys]
    if not keys or keys[0].size == 0:
        return np.zeros(0 if not keys else keys[0].size, dtype=np.int64)
    lows = [int(k.min()) for k in keys]
    spans = [int(k.max()) - low + 1 for k, low in zip(keys, lows, strict=True)]
    if math.prod(spans) >= INT64_HEADROOM:
        return np.lexsort(tuple(reversed(keys))).astype(np.int64)
    composite = keys[0] - lows[0]
    for key, low, span in zip(keys[1:], lows[1:], spans[1:], strict=True):
        composite = composite * span + (key - low)
    return np.argsort(composite, kind="stable").astype(np.int64)


def timeline_order(
    keys: Sequence[IntArray], ids: pa.Array | pa.ChunkedArray
) -> IntArray:
    """Row order sorting by ``keys`` (most significant first), then ``ids``.

    Equal to a stable sort on ``(*keys, ids)`` with ids compared byte-wise
    (Arrow's string order), but only tied rows pay a string sort.

    Example:
        >>> timeline_order([np.array([2, 1, 1]), np.array([5, 7, 7])],
        ...                pa.array(["a", "c", "b"])).tolist()
        [2, 1, 0]
    """
    n = len(ids)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = int_order(keys)
    same = np.ones(n - 1, dtype=bool)
    for key in keys:
        ordered = key[order]
        same &= ordered[1:] == ordered[:-1]
    if not same.any():
        return order
    # Runs of equal integer keys: order each run's rows by id.
    tied = np.zeros(n, dtype=bool)
    tied[1:] |= same
    tied[:-1] |= same
    positions = np.flatnonzero(tied)
    run = np.cumsum(np.concatenate([[True], ~same]))[positions]
    rows = order[positions]
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    within = pc.sort_indices(
        pa.table({"run": run, "id": ids.take(pa.array(rows))}),
        sort_keys=[("run", "ascending"), ("id", "ascending")],
    )
    order[positions] = rows[np.asarray(within.to_numpy(), dtype=np.int64)]
    return order


def distinct_sorted(values: IntArray) -> IntArray:
    """``np.unique`` of an int array by one sort (numpy 2.4's hash-based
    ``unique`` is several times slower on millions of ints here).

    Example:
        >>> distinct_sorted(np.array([3, 1, 3, 2])).tolist()
        [1, 2, 3]
    """
    return distinct_of_sorted(np.sort(values))


def distinct_of_sorted(ordered: IntArray) -> IntArray:
    """The distinct values of an ascending array (one pass, no sort)."""
    if ordered.size == 0:
        return ordered
    keep = np.empty(ordered.size, dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def first_positions(codes: IntArray) -> IntArray:
    """Position of the first row of each code ``0..max`` (``codes.size`` for a
    code no row has)."""
    first = np.full(int(codes.max()) + 1, codes.size, dtype=np.int64)
    # Reverse scatter: the smallest position of each code is written last.
    first[codes[::-1]] = np.arange(codes.size - 1, -1, -1)
    return first


def first_of_each(ids: pa.Array | pa.ChunkedArray) -> IntArray:
    """Sorted positions of the first occurrence of every distinct id.

    Example:
        >>> first_of_each(pa.array(["b", "a", "b", "c"])).tolist()
        [0, 1, 3]
    """
    codes = dictionary_codes(ids)
    if codes.size == 0:
        return codes
    return np.sort(first_positions(codes))
