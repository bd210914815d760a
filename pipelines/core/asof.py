"""As-of lookups into dimension tables: "the row of this id with the latest
time <= t", for whole shards of queries at once.

:class:`AsOfIndex` is prepared once per table (:func:`asof_index`, through
:func:`per_table`: dimension tables arrive as side inputs, the same object
for every shard a worker processes) and then answers any number of queries.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, Final, TypeVar, cast

import numpy as np
import pyarrow as pa

from pipelines.core.columns import IntArray, to_int64
from pipelines.core.ordering import INT64_HEADROOM, distinct_sorted

T = TypeVar("T")


class AsOfIndex:
    """As-of lookups into one dimension table, prepared once for any number
    of queries: "the row of this id with the latest time <= t".

    Rows are ordered by (id, time) once; an id's rank comes from a dense
    ``id -> rank`` array when ids are small non-negative integers (the usual
    case: one gather instead of a binary search per query), else from a
    binary search. When no id has two versions, the only candidate is the
    id's one row; otherwise one binary search over composite ``rank * span +
    time`` keys finds the latest version.

    Args:
        dim_ids: entity id of each dimension row.
        dim_times: ``updated_at`` of each row (epoch ms).

    Example:
        >>> index = AsOfIndex(np.array([7, 7]), np.array([10, 20]))
        >>> index.rows(np.array([7, 7, 7, 8]), np.array([5, 15, 20, 30])).tolist()
        [-1, 0, 1, -1]
    """

    def __init__(self, dim_ids: IntArray, dim_times: IntArray) -> None:
        order = np.lexsort((dim_times, dim_ids))
        ids, times = dim_ids[order], dim_times[order]
        self._order, self._times = order, times
        self._distinct = distinct_sorted(ids)
        self._first = np.searchsorted(ids, self._distinct, side="left")
        count = np.diff(np.append(self._first, ids.size))
        self._dense: IntArray | None = None
        if self._distinct.size and 0 <= self._distinct[0]:
            top = int(self._distinct[-1])
            if top < 4 * self._distinct.size + 65_536:
                self._dense = np.full(top + 1, -1, dtype=np.int64)
                self._dense[self._distinct] = np.arange(self._distinct.size)
        self._versioned = bool(np.any(count > 1))
        self._time_values: IntArray | None = None
        if self._versioned:
            # Query times are clamped into [base, top]: before every version
            # finds none, after every version finds the latest.
            self._base = int(times.min()) - 1
            self._top = int(times.max()) + 1
            self._span = self._top - self._base + 1
            if (self._distinct.size + 1) * float(self._span) >= INT64_HEADROOM:
                # Too long a period for int64 keys: times by rank instead.
                self._time_values = distinct_sorted(times)
                self._span = self._time_values.size + 1
            ranks = np.repeat(np.arange(self._distinct.size), count)
            self._keys = ranks * self._span + self._time_key(times)

    def _time_key(self, times: IntArray) -> IntArray:
        """A monotone map of times into ``[0, span)``; dimension times map to
        ``>= 1``, so a time before every version stays below all of them."""
        if self._time_values is not None:
            return np.searchsorted(self._time_values, times, side="right")
        return np.clip(times, self._base, self._top) - self._base

    def _ranks(self, query_ids: IntArray) -> IntArray:
        """Rank of each query id among the distinct ids, -1 when unknown."""
        if self._dense is not None:
            inside = (query_ids >= 0) & (query_ids < self._dense.size)
            return np.where(inside, self._dense[np.where(inside, query_ids, 0)], -1)
        ranks = np.searchsorted(self._distinct, query_ids)
        clipped = np.minimum(ranks, self._distinct.size - 1)
        return np.where(self._distinct[clipped] == query_ids, clipped, -1)

    def rows(self, query_ids: IntArray, query_times: IntArray) -> IntArray:
        """Row index (into the arrays given at construction) for each query,
        or -1 where no row applies. Of rows with equal id and time the later
        one in the table wins."""
        if self._distinct.size == 0 or query_ids.size == 0:
            return np.full(query_ids.size, -1, dtype=np.int64)
        ranks = self._ranks(query_ids)
        known = ranks >= 0
        safe_ranks = np.maximum(ranks, 0)
        if not self._versioned:
            row = self._first[safe_ranks]
            found = known & (self._times[row] <= query_times)
        else:
            keys = safe_ranks * self._span + self._time_key(query_times)
            position = np.searchsorted(self._keys, keys, side="right") - 1
            # Keys of rank r lie below (r + 1) * span: the position is at or
            # before the entity's last row; at or after its first row or none.
            found = known & (position >= self._first[safe_ranks])
            row = np.maximum(position, 0)
        return np.where(found, self._order[row], -1)


def asof_rows(
    dim_ids: IntArray, dim_times: IntArray, query_ids: IntArray, query_times: IntArray
) -> IntArray:
    """For each query, the dimension row with its id and the latest time <= its time.

    One-off use of :class:`AsOfIndex` (keep the index to query a table often).

    Args:
        dim_ids: entity id of each dimension row.
        dim_times: ``updated_at`` of each row (epoch ms).
        query_ids: entity id of each query.
        query_times: time of each query (epoch ms).

    Returns:
        Row index into the dimension arrays, or -1 where no row applies. Of rows
        with equal id and time the later one in the table wins.

    Example:
        >>> asof_rows(np.array([7, 7]), np.array([10, 20]),
        ...           np.array([7, 7, 7, 8]), np.array([5, 15, 20, 30])).tolist()
        [-1, 0, 1, -1]
    """
    return AsOfIndex(dim_ids, dim_times).rows(query_ids, query_times)


def asof_index(table: pa.Table, id_column: str, time_column: str | None) -> AsOfIndex:
    """The :class:`AsOfIndex` of a dimension table (built once per table
    object, :func:`per_table`); without ``time_column`` every row holds from
    time 0 on (tables without versions)."""

    def build(table: pa.Table) -> AsOfIndex:
        ids = to_int64(table.column(id_column))
        if time_column is None:
            return AsOfIndex(ids, np.zeros(ids.size, np.int64))
        return AsOfIndex(ids, to_int64(table.column(time_column)))

    return per_table(table, f"asof:{id_column}:{time_column}", build)


_MEMO_LOCK: Final = threading.Lock()


_MEMO: dict[tuple[int, str], tuple[weakref.ref[pa.Table], Any]] = {}


def per_table(table: pa.Table, name: str, build: Callable[[pa.Table], T]) -> T:
    """``build(table)``, computed once per table object (and ``name``).

    Dimension tables arrive as side inputs: the same object for every shard a
    worker processes, so what is derived from them alone (as-of indexes,
    attribute codes) is derived once. Entries go with their table.
    """
    key = (id(table), name)
    with _MEMO_LOCK:
        hit = _MEMO.get(key)
        if hit is not None and hit[0]() is table:
            return cast(T, hit[1])
    value = build(table)

    def forget(_: object, key: tuple[int, str] = key) -> None:
        with _MEMO_LOCK:
            _MEMO.pop(key, None)

    with _MEMO_LOCK:
        _MEMO[key] = (weakref.ref(table, forget), value)
    return value
