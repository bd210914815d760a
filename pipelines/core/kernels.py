"""Vectorized kernels shared by the Beam job and the single-process reference.

Pure numpy / pyarrow, no Beam import (``pipelines.core.reference`` uses them too,
and must not pay Beam's import): speeding one up speeds up both jobs, so the
Beam / reference ratio measures the runner, not two different kernels.

- :func:`timeline_order`: the permutation that sorts events by integer keys
  and then by ``event_id`` (byte-wise), without sorting 2M strings: integer
  ``lexsort`` first, then only the rows whose integer keys tie are ordered by
  their ids.
- :class:`WindowCounter`: "how many events of this entity and action in
  ``[t - w, t)``" for many queries and windows, from one sort of the events'
  distinct ``(entity, time)`` keys, prefix counts per action, and one binary
  search per window shared by every action.
- :func:`parquet_options`: the Parquet writer settings of every output file;
  :class:`BackgroundWrites` runs writes on a thread while the caller goes on.
- :func:`winning_copies`, :func:`copy_winners`,
  :func:`drop_losing_copies`, :func:`id_buckets`: the contract's choice
  of one copy per ``event_id`` (:mod:`features.duplicates`), whole or split
  into a small global step and a per-shard one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features.duplicates import copy_digests
from features.events import EVENT_COLUMNS

IntArray = npt.NDArray[np.int64]

_INT64_HEADROOM: Final = 2**62


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
    if math.prod(spans) >= _INT64_HEADROOM:
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


PLAIN_COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    "examples": ("event_time",),
    "timelines": ("event_time",),
    "user_sequence": ("seq_event_time_ms", "seq_item_id"),
}
"""Columns of each output written without dictionary encoding
(:func:`parquet_options`); outputs not named here use it for every column."""


def parquet_options(schema: pa.Schema, plain: Collection[str] = ()) -> dict[str, Any]:
    """``pyarrow.parquet.write_table`` settings for an output of ``schema``.

    Min / max statistics only for flat columns: readers filter on keys and
    times, never on the values inside a list, and the statistics of list
    columns (the timelines' and sequences' values) cost about a tenth of
    their write time. Dictionary encoding for every column but those named
    in ``plain``: values that seldom repeat (event times, the sequences' item
    keys) overflow the dictionary and fall back to plain pages after paying
    for it (``user_sequence``: 12% less write time and 15% fewer bytes
    without it for those two columns).

    Example:
        >>> parquet_options(pa.schema([("a", pa.int64()),
        ...                            ("b", pa.list_(pa.int64()))]), plain=["b"])
        {'write_statistics': ['a'], 'use_dictionary': ['a']}
    """
    flat = [f.name for f in schema if not pa.types.is_nested(f.type)]
    options: dict[str, Any] = {"write_statistics": flat}
    if plain:
        unknown = set(plain) - set(schema.names)
        if unknown:
            raise ValueError(f"no columns {sorted(unknown)} in the schema")
        nested = [f for f in schema if pa.types.is_nested(f.type)]
        if all(pa.types.is_list(f.type) for f in nested):
            options["use_dictionary"] = [
                _parquet_leaf(f) for f in schema if f.name not in plain
            ]
    return options


def _parquet_leaf(field: pa.Field) -> str:
    """The Parquet column path of a flat or list field's values."""
    return f"{field.name}.list.element" if pa.types.is_list(field.type) else field.name


def write_parquet_bytes(table: pa.Table, plain: Collection[str] = ()) -> pa.Buffer:
    """``table`` as the bytes of one Parquet file (:func:`parquet_options`).

    Written to an Arrow buffer, not a Python file object, so the whole write
    runs without the GIL: another thread can write while Python goes on.
    """
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **parquet_options(table.schema, plain))
    return sink.getvalue()


class BackgroundWrites:
    """Write jobs run on one thread, in submission order, while the caller
    goes on.

    A Parquet write (encoding, compression) runs in Arrow's C++ without the
    GIL, so on a machine with a second core it costs the caller almost
    nothing: the caller computes the next part while this thread writes the
    last. At most ``max_pending`` jobs wait (each holds its table); a
    further :meth:`submit` blocks until the oldest is done. Owners call
    :meth:`wait` where the writes must be complete (a DoFn: at the end of
    every bundle, so a committed bundle's files exist), and :meth:`close`
    when done (a DoFn: teardown).

    Example:
        >>> done = []
        >>> writes = BackgroundWrites()
        >>> writes.submit(done.append, 1)
        >>> writes.wait(); writes.close(); done
        [1]
    """

    def __init__(self, max_pending: int = 2) -> None:
        self._max_pending = max(1, max_pending)
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[Future[Any]] = deque()

    def submit(self, job: Callable[..., Any], *args: Any) -> None:
        """Queue ``job(*args)``; errors surface in :meth:`submit` or :meth:`wait`."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="writes")
        while len(self._pending) >= self._max_pending:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(job, *args))

    def wait(self) -> None:
        """Block until every queued job is done; re-raise the first error."""
        while self._pending:
            self._pending.popleft().result()

    def forget(self) -> None:
        """Let the queued jobs finish, dropping their errors (the jobs of a
        failed bundle, before the next one starts)."""
        while self._pending:
            self._pending.popleft().exception()

    def close(self) -> None:
        """Finish the queued jobs (re-raising the first error) and stop the
        thread."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


def distinct_sorted(values: IntArray) -> IntArray:
    """``np.unique`` of an int array by one sort (numpy 2.4's hash-based
    ``unique`` is several times slower on millions of ints here).

    Example:
        >>> distinct_sorted(np.array([3, 1, 3, 2])).tolist()
        [1, 2, 3]
    """
    return _distinct_of_sorted(np.sort(values))


def _distinct_of_sorted(ordered: IntArray) -> IntArray:
    if ordered.size == 0:
        return ordered
    keep = np.empty(ordered.size, dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def first_of_each(ids: pa.Array | pa.ChunkedArray) -> IntArray:
    """Sorted positions of the first occurrence of every distinct id."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    codes = np.asarray(pc.dictionary_encode(ids).indices.to_numpy(), dtype=np.int64)
    if codes.size == 0:
        return codes
    first = np.full(int(codes.max()) + 1, codes.size, dtype=np.int64)
    # Reverse scatter: the smallest position of each code is written last.
    first[codes[::-1]] = np.arange(codes.size - 1, -1, -1)
    return np.sort(first)


class WindowCounter:
    """Counts of an entity's events per action in ``[t - w, t)`` windows.

    Built once from events ``(entity id, time, action code)``; then
    :meth:`count` answers any queries ``(entity id, t)``. Every ``(entity,
    time)`` becomes one int64 key ``rank(entity) * span + time - base``, so
    one sorted array of the distinct event keys holds every entity's times in
    order; for each action a prefix count over those keys gives "events of
    the action before key k" at ``searchsorted(k)``. A window count is then
    two lookups, and the binary searches (one per window bound) are shared by
    all actions.

    Args:
        ids: (E,) entity of each (distinct) event.
        times: (E,) its time, epoch ms.
        actions: (E,) action code in ``1..num_actions`` (others are ignored).
        num_actions: number of action codes.
        windows_ms: the window lengths the queries will use.

    Example:
        >>> c = WindowCounter(np.array([1, 1, 1, 2]), np.array([0, 5, 10, 9]),
        ...                   np.array([1, 1, 2, 1]), 2, (6, 100))
        >>> [[x.tolist() for x in per_window] for per_window in
        ...  c.count(np.array([1, 2]), np.array([10, 10]))]
        [[[1, 1], [2, 1]], [[0, 0], [0, 0]]]
    """

    def __init__(
        self,
        ids: IntArray,
        times: IntArray,
        actions: IntArray,
        num_actions: int,
        windows_ms: tuple[int, ...],
    ) -> None:
        self._windows = windows_ms
        self._num_actions = num_actions
        self._entities = distinct_sorted(ids)
        widest = max(windows_ms, default=0)
        self._base = int(times.min()) - widest if times.size else 0
        top = int(times.max()) + 1 if times.size else 1
        self._span = top - self._base + 1
        if (self._entities.size + 1) * float(self._span) >= _INT64_HEADROOM:
            raise ValueError("too many entities over too long a period for int64 keys")
        keys = self._keys(np.searchsorted(self._entities, ids), times)
        # Distinct keys (the points at which counts can change) and, for each
        # action, how many of its events lie before each of them.
        # (Plain sorts and sorted-needle searches: cheaper than np.unique's
        # inverse, an argsort, at millions of events.)
        ordered = np.sort(keys)
        self.points = _distinct_of_sorted(ordered)
        self._before = np.zeros((num_actions, self.points.size + 1), dtype=np.int64)
        for code in range(1, num_actions + 1):
            mine = ordered if num_actions == 1 and np.all(actions == 1) else None
            if mine is None:
                mine = np.sort(keys[actions == code])
            self._before[code - 1, :-1] = np.searchsorted(mine, self.points)
            self._before[code - 1, -1] = mine.size

    def _keys(self, ranks: IntArray, times: IntArray) -> IntArray:
        return ranks * self._span + (times - self._base)

    def point_entities(self) -> tuple[IntArray, IntArray]:
        """Entity id and time of each distinct event key (sorted by both)."""
        ranks = self.points // self._span
        return self._entities[ranks], self.points - ranks * self._span + self._base

    def count(self, query_ids: IntArray, query_times: IntArray) -> list[list[IntArray]]:
        """``counts[action - 1][window]``: (Q,) int64 counts per query.

        Entities never seen count 0; times outside the events' range are fine.
        """
        if self._entities.size == 0:
            zeros = np.zeros(query_ids.size, dtype=np.int64)
            return [
                [zeros.copy() for _ in self._windows] for _ in range(self._num_actions)
            ]
        ranks = np.searchsorted(self._entities, query_ids)
        clipped = np.minimum(ranks, self._entities.size - 1)
        known = self._entities[clipped] == query_ids

        # Clamp each bound into the key range of its entity: any bound before
        # every event finds none before it, any after every event finds all.
        def search(bound: IntArray) -> IntArray:
            clamped = np.clip(bound, self._base, self._base + self._span - 1)
            return np.searchsorted(self.points, self._keys(clipped, clamped)[order])

        # Sorted needles make numpy's binary search much faster.
        order = np.argsort(self._keys(clipped, query_times), kind="stable")
        high = np.empty(query_ids.size, dtype=np.int64)
        high[order] = search(query_times)
        lows = []
        for window in self._windows:
            low = np.empty(query_ids.size, dtype=np.int64)
            low[order] = search(query_times - window)
            lows.append(low)
        return [
            [
                np.where(known, self._before[a, high] - self._before[a, low], 0)
                for low in lows
            ]
            for a in range(self._num_actions)
        ]

    def before(self, query_ids: IntArray, query_times: IntArray) -> list[IntArray]:
        """Per action, (Q,) events of the query's entity with time ``< t``."""
        if self._entities.size == 0:
            zeros = np.zeros(query_ids.size, dtype=np.int64)
            return [zeros.copy() for _ in range(self._num_actions)]
        ranks = np.searchsorted(self._entities, query_ids)
        clipped = np.minimum(ranks, self._entities.size - 1)
        known = self._entities[clipped] == query_ids
        clamped = np.clip(query_times, self._base, self._base + self._span - 1)
        keys = self._keys(clipped, clamped)
        # Sorted needles make numpy's binary search much faster.
        order = np.argsort(keys, kind="stable")
        high = np.empty(keys.size, dtype=np.int64)
        high[order] = np.searchsorted(self.points, keys[order])
        # Minus the events of entities ranked before (keys below rank * span).
        low = np.empty(keys.size, dtype=np.int64)
        low[order] = np.searchsorted(self.points, clipped[order] * self._span)
        return [
            np.where(known, self._before[a, high] - self._before[a, low], 0)
            for a in range(self._num_actions)
        ]

    def count_at_points(self) -> list[list[IntArray]]:
        """:meth:`count` at every distinct event key (in key order)."""
        high = np.arange(self.points.size)
        out = []
        lows = [
            np.searchsorted(self.points, self.points - window, side="left")
            for window in self._windows
        ]
        for a in range(self._num_actions):
            before = self._before[a]
            out.append([before[high] - before[low] for low in lows])
        return out


def _int64_column(table: pa.Table, name: str) -> IntArray:
    column = table.column(name)
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    return np.asarray(column.to_numpy(), dtype=np.int64)


def _id_codes(ids: pa.Array | pa.ChunkedArray) -> IntArray:
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    return np.asarray(pc.dictionary_encode(ids).indices.to_numpy(), dtype=np.int64)


def _same_events(table: pa.Table, left: IntArray, right: IntArray) -> npt.NDArray:
    """Whether rows ``left[i]`` and ``right[i]`` hold the same event (every
    event column equal, nulls equal to nulls; other columns ignored)."""
    same = np.ones(left.size, dtype=bool)
    if left.size == 0:
        return same
    take_left, take_right = pa.array(left), pa.array(right)
    for name in EVENT_COLUMNS:
        a = table.column(name).take(take_left)
        b = table.column(name).take(take_right)
        equal = pc.fill_null(pc.equal(a, b), False)
        both_null = pc.and_(pc.is_null(a), pc.is_null(b))
        same &= np.asarray(pc.or_(equal, both_null).to_numpy(zero_copy_only=False))
    return same


def winning_copies(events: pa.Table) -> npt.NDArray[np.bool_]:
    """Mask of the winning copy of each ``event_id`` among ``events``.

    The winner is the first copy in ``(event_time, user_id, digest)`` order
    (:mod:`features.duplicates`), so the mask does not depend on the rows'
    order. Only ids with several copies are ordered, and digests are taken
    only of copies that tie on time and user without being identical: almost
    never.

    Example:
        >>> from features.events import EVENT_SCHEMA
        >>> base = {name: None for name in EVENT_SCHEMA.names}
        >>> base |= {"schema_version": 1, "domain": "d", "surface": "s",
        ...          "action": "a"}
        >>> rows = [base | {"event_id": i, "event_time": t, "user_id": u}
        ...         for i, t, u in [("x", 9, 1), ("y", 5, 1), ("x", 7, 2)]]
        >>> winning_copies(pa.Table.from_pylist(rows, EVENT_SCHEMA)).tolist()
        [False, True, True]
    """
    codes = _id_codes(events.column("event_id"))
    n = codes.size
    if n == 0:
        return np.zeros(0, dtype=bool)
    copies = np.bincount(codes)[codes]
    keep = copies == 1
    if keep.all():
        return keep
    rows = np.flatnonzero(~keep)
    code = codes[rows]
    time = _int64_column(events, "event_time")[rows]
    user = _int64_column(events, "user_id")[rows]
    order = np.lexsort((user, time, code))
    rows, code, time, user = rows[order], code[order], time[order], user[order]
    # Each id's leading run: its copies tied with its first on (time, user).
    group_start = np.r_[True, code[1:] != code[:-1]]
    tied = ~group_start[1:] & (time[1:] == time[:-1]) & (user[1:] == user[:-1])
    run = np.cumsum(np.r_[True, ~tied])
    leading = run == run[group_start][np.cumsum(group_start) - 1]
    winner = rows[group_start].copy()
    # Leading runs of copies that are not all identical: digests decide.
    pair = np.flatnonzero(leading[1:] & ~group_start[1:]) + 1
    differs = ~_same_events(events, rows[pair - 1], rows[pair])
    if differs.any():
        group = np.cumsum(group_start) - 1
        for g in np.unique(group[pair[differs]]).tolist():
            members = rows[leading & (group == g)]
            digests = copy_digests(events.take(pa.array(members)))
            winner[g] = members[min(range(members.size), key=digests.__getitem__)]
    keep[winner] = True
    return keep


def id_buckets(ids: pa.Array | pa.ChunkedArray, buckets: int) -> IntArray:
    """A bucket in ``[0, buckets)`` of each id string, stable everywhere.

    Every copy of an id lands in the same bucket: a hash of the string's
    length and last eight bytes (ids differ most at their end: counters,
    random suffixes), which is all the spread a shuffle key needs, for one
    eight-byte gather per id instead of a pass per byte.

    Example:
        >>> id_buckets(pa.array(["ev-1", "ev-7", "ev-1"]), 4).tolist()
        [2, 3, 2]
    """
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    ids = ids.cast(pa.string())
    n = len(ids)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.frombuffer(ids.buffers()[1], dtype=np.int32)[
        ids.offset : ids.offset + n + 1
    ].astype(np.int64)
    data_buffer = ids.buffers()[2]
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)
        if data_buffer is not None
        else np.zeros(0, dtype=np.uint8)
    )
    ends = offsets[1:]
    lengths = ends - offsets[:-1]
    # The eight bytes before each string's end as one little-endian word (a
    # strided view, no copy of the data); the few strings ending within the
    # first eight bytes of the buffer read zeros in front of it.
    inside = ends >= 8
    first_inside = int(np.argmax(inside)) if inside.any() else n
    words = np.zeros(n, dtype=np.uint64)
    if first_inside < n:
        windows = np.lib.stride_tricks.as_strided(
            data, shape=(data.size - 7, 8), strides=(1, 1)
        )
        gathered = np.ascontiguousarray(windows[ends[first_inside:] - 8])
        words[first_inside:] = gathered.view("<u8").ravel()
    for row in range(first_inside):
        head = bytes(data[max(0, ends[row] - 8) : ends[row]])
        words[row] = int.from_bytes(head.rjust(8, b"\0"), "little")
    # A short string's window starts in the string before it: shift that out.
    short = lengths < 8
    spare = (8 * (8 - lengths[short])).astype(np.uint64)
    words[short] = np.where(spare < 64, words[short] >> np.minimum(spare, 63), 0)
    key = words ^ (lengths.astype(np.uint64) << np.uint64(56))
    # A 64-bit finalizer (splitmix64's), so every input bit moves the bucket.
    with np.errstate(over="ignore"):
        key ^= key >> np.uint64(30)
        key *= np.uint64(0xBF58476D1CE4E5B9)
        key ^= key >> np.uint64(27)
        key *= np.uint64(0x94D049BB133111EB)
        key ^= key >> np.uint64(31)
    return (key % np.uint64(buckets)).astype(np.int64)


ID_PROJECTION_SCHEMA: Final = pa.schema(
    [
        pa.field("event_id", pa.string(), False),
        pa.field("user_id", pa.int64(), False),
        pa.field("event_time", pa.int64(), False),
    ]
)
"""What the global step of the deduplication needs of an event: its id and
the two keys that order its copies (the digests only break ties
within one user, where the per-shard step sees every copy)."""


DIGEST_PROJECTION_SCHEMA: Final = ID_PROJECTION_SCHEMA.append(
    pa.field("digest", pa.string(), False)
)
"""The projection with each copy's digest (:func:`features.duplicates.copy_digests`),
for a step that sees no whole events (the streaming job's id stage)."""


def id_projection(events: pa.Table, *, with_digest: bool = False) -> pa.Table:
    """The :data:`ID_PROJECTION_SCHEMA` rows of some events (or
    :data:`DIGEST_PROJECTION_SCHEMA` ``with_digest``)."""
    arrays = [
        events.column("event_id").combine_chunks(),
        pa.array(_int64_column(events, "user_id"), pa.int64()),
        pa.array(_int64_column(events, "event_time"), pa.int64()),
    ]
    if not with_digest:
        return pa.Table.from_arrays(arrays, schema=ID_PROJECTION_SCHEMA)
    arrays.append(pa.array(copy_digests(events), pa.string()))
    return pa.Table.from_arrays(arrays, schema=DIGEST_PROJECTION_SCHEMA)


def copy_winners(projection: pa.Table, *, every_id: bool = False) -> pa.Table:
    """Of the ids whose copies differ in user or time (or digest, where the
    projection has them), the winning copy's key: the first in
    ``(event_time, user_id, digest)`` order.

    Args:
        projection: :data:`ID_PROJECTION_SCHEMA` or
            :data:`DIGEST_PROJECTION_SCHEMA` rows of every copy of the ids
            they name (all copies of an id, or the answer is wrong).
        every_id: answer for every id, also those whose copies agree.

    Returns:
        One row per such id (usually none), in the projection's schema.

    Example:
        >>> rows = pa.table({"event_id": ["x", "y", "x", "y"],
        ...                  "user_id": [2, 1, 1, 1], "event_time": [5, 3, 5, 3]})
        >>> copy_winners(rows.cast(ID_PROJECTION_SCHEMA)).to_pylist()
        [{'event_id': 'x', 'user_id': 1, 'event_time': 5}]
    """
    schema = (
        DIGEST_PROJECTION_SCHEMA
        if "digest" in projection.column_names
        else ID_PROJECTION_SCHEMA
    )
    codes = _id_codes(projection.column("event_id"))
    if codes.size == 0:
        return schema.empty_table()
    users = _int64_column(projection, "user_id")
    times = _int64_column(projection, "event_time")
    digests = (
        _id_codes(projection.column("digest"))
        if schema != ID_PROJECTION_SCHEMA
        else None
    )
    if every_id:
        rows = np.arange(codes.size)
    else:
        # An id whose copies differ somewhere differs from its first copy.
        first = np.full(int(codes.max()) + 1, codes.size, dtype=np.int64)
        first[codes[::-1]] = np.arange(codes.size - 1, -1, -1)
        lead = first[codes]
        differs = (users != users[lead]) | (times != times[lead])
        if digests is not None:
            differs |= digests != digests[lead]
        conflicting = np.zeros(first.size, dtype=bool)
        conflicting[codes[differs]] = True
        rows = np.flatnonzero(conflicting[codes])
        if rows.size == 0:
            return schema.empty_table()
    order = np.lexsort((users[rows], times[rows], codes[rows]))
    rows = rows[order]
    if digests is not None:
        # Ties on (id, time, user): the smallest digest, byte-wise.
        rows = rows[_digest_order(projection, rows, codes, times, users)]
    leads = np.r_[True, codes[rows][1:] != codes[rows][:-1]]
    return projection.take(pa.array(rows[leads])).cast(schema)


def _digest_order(
    projection: pa.Table,
    rows: IntArray,
    codes: IntArray,
    times: IntArray,
    users: IntArray,
) -> IntArray:
    """The permutation of ``rows`` (sorted by id, time, user) that also
    orders the rows tied on all three by digest."""
    key = pa.table(
        {
            "code": codes[rows],
            "time": times[rows],
            "user": users[rows],
            "digest": projection.column("digest").take(pa.array(rows)),
        }
    )
    order = pc.sort_indices(
        key,
        sort_keys=[(name, "ascending") for name in ("code", "time", "user", "digest")],
    )
    return np.asarray(order.to_numpy(), dtype=np.int64)


def drop_losing_copies(
    events: pa.Table, winners: pa.Table, *, time_column: str = "event_time"
) -> pa.Table:
    """``events`` without the copies that lose to a copy of another user or
    time (:func:`losing_copies`)."""
    loses = losing_copies(events, winners, time_column=time_column)
    return events.filter(pa.array(~loses)) if loses.any() else events


def losing_copies(
    events: pa.Table, winners: pa.Table, *, time_column: str = "event_time"
) -> npt.NDArray[np.bool_]:
    """Mask of the rows of ``events`` that lose to a copy of another user or
    time, or (where ``winners`` has digests) another digest.

    Args:
        events: rows with ``event_id``, ``user_id`` and ``time_column``, and
            either a ``digest`` column or every event column (the digest is
            then taken of the rows that need it).
        winners: :func:`copy_winners` of every copy of the ids (of all
            shards); ids not in it are left alone.
        time_column: the events' time column (epoch ms or timestamp).
    """
    loses = np.zeros(events.num_rows, dtype=bool)
    if winners.num_rows == 0 or events.num_rows == 0:
        return loses
    where = pc.index_in(events.column("event_id"), value_set=winners.column("event_id"))
    at = np.asarray(pc.fill_null(where, -1).to_numpy(), dtype=np.int64)
    named = at >= 0
    if not named.any():
        return loses
    users = _int64_column(events, "user_id")
    times = _int64_column(events, time_column)
    winner_users = _int64_column(winners, "user_id")
    winner_times = _int64_column(winners, "event_time")
    loses[named] = (users[named] != winner_users[at[named]]) | (
        times[named] != winner_times[at[named]]
    )
    if "digest" in winners.column_names:
        # Copies at the winning user and time: the winning digest only.
        tied = np.flatnonzero(named & ~loses)
        if tied.size:
            rows = events.take(pa.array(tied))
            if "digest" in events.column_names:
                digests = rows.column("digest").to_pylist()
            else:
                digests = copy_digests(rows)
            wanted = winners.column("digest").take(pa.array(at[tied])).to_pylist()
            loses[tied] = [d != w for d, w in zip(digests, wanted, strict=True)]
    return loses
