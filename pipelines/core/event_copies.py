"""Which copy of an ``event_id`` wins: the contract of :mod:`features.duplicates`.

Whole (:func:`winning_copies`, every copy at hand) or split into a small
global step and a per-shard one, for jobs whose shards do not see every copy:

- :func:`id_projection` and :func:`id_buckets`: what of each copy the global
  step needs, and where it goes (a stable hash of the id);
- :func:`copy_winners`: of the ids whose copies differ in user or time, the
  winning copy's key;
- :func:`losing_copies` / :func:`drop_losing_copies`: what a shard drops once
  it knows those winners.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.duplicates import copy_digests
from features.events import EVENT_COLUMNS
from pipelines.core.columns import IntArray, dictionary_codes, to_int64
from pipelines.core.ordering import first_positions


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
    codes = dictionary_codes(events.column("event_id"))
    n = codes.size
    if n == 0:
        return np.zeros(0, dtype=bool)
    copies = np.bincount(codes)[codes]
    keep = copies == 1
    if keep.all():
        return keep
    rows = np.flatnonzero(~keep)
    code = codes[rows]
    time = to_int64(events.column("event_time"))[rows]
    user = to_int64(events.column("user_id"))[rows]
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
        pa.array(to_int64(events.column("user_id")), pa.int64()),
        pa.array(to_int64(events.column("event_time")), pa.int64()),
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
    codes = dictionary_codes(projection.column("event_id"))
    if codes.size == 0:
        return schema.empty_table()
    users = to_int64(projection.column("user_id"))
    times = to_int64(projection.column("event_time"))
    digests = (
        dictionary_codes(projection.column("digest"))
        if schema != ID_PROJECTION_SCHEMA
        else None
    )
    if every_id:
        rows = np.arange(codes.size)
    else:
        # An id whose copies differ somewhere differs from its first copy.
        first = first_positions(codes)
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
    users = to_int64(events.column("user_id"))
    times = to_int64(events.column(time_column))
    winner_users = to_int64(winners.column("user_id"))
    winner_times = to_int64(winners.column("event_time"))
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
