"""The window reader: each example's recent history, cut out of timelines.

An example stores only ``timeline_cut`` (see :mod:`features.examples`); its
**window** is the last ``max_seq_len`` events of ``timeline[:timeline_cut]``,
oldest first, plus ``seq_time_bucket`` (log2 of the seconds from each event to
the impression). This module computes the windows of a whole batch at once,
with offsets arithmetic on the flat Arrow list values, no per-example Python::

    example   user  cut    timeline of user      window (max_seq_len = 2)
    e0        u1    3      [a, b, c, d]          [b, c]
    e1        u2    0      [x]                   []
    e2        u1    1      [a, b, c, d]          [a]

    lengths  = min(cut, max_seq_len)             [2, 0, 1]
    offsets  = cumsum(lengths)                   [0, 2, 2, 3]
    gather   = row_start[user] + (cut - lengths) + position in window

Timelines may be full (:data:`~features.examples.TIMELINE_SCHEMA`) or
**segments** (:data:`~features.examples.TIMELINE_SEGMENT_SCHEMA`, made by
:func:`timeline_segments`): a segment holds events ``[segment_start, ...)`` of
the full timeline, so the reader subtracts ``segment_start`` from the cut; a
segment that does not cover a window is an error, never a silently shorter
window.

``seq_time_bucket`` is :func:`features.registry.time_bucket` of
``(t - event_time) / 1000`` seconds, as a float (milliseconds are not rounded
to whole seconds first).

numpy and pyarrow only: the trainer (:mod:`trainer.data.inputs`), the reference
pipeline and the Feast sequence table all read windows through this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from features.examples import (
    TIMELINE_SCHEMA,
    TIMELINE_SEGMENT_SCHEMA,
    training_example_schema,
)
from features.registry import SEQUENCE_FEATURES, time_bucket

Int64Array = npt.NDArray[np.int64]

TIME_BUCKET_FEATURE: Final = "seq_time_bucket"
# The per-event columns a timeline stores (every sequence feature except the
# time bucket, which depends on the impression time).
TIMELINE_SEQUENCE_COLUMNS: Final = tuple(
    f.name for f in SEQUENCE_FEATURES if f.name != TIME_BUCKET_FEATURE
)
SEQUENCE_COLUMNS: Final = tuple(f.name for f in SEQUENCE_FEATURES)


@dataclass(frozen=True)
class Windows:
    """The windows of ``B`` examples as one jagged block (``N`` events in all).

    Attributes:
        lengths: (B,) int64, events in each window (0 for an empty history).
        offsets: (B + 1,) int64, ``offsets[i]:offsets[i + 1]`` is example
            ``i``'s slice of every value array.
        values: sequence feature name -> (N,) flat values, oldest event first
            within each example; int64 for ``seq_item_id`` (the raw item key),
            int32 otherwise, in :data:`SEQUENCE_COLUMNS` order.
    """

    lengths: Int64Array
    offsets: Int64Array
    values: dict[str, npt.NDArray[np.int64] | npt.NDArray[np.int32]]

    @property
    def size(self) -> int:
        """Number of examples B."""
        return int(self.lengths.size)


@dataclass(frozen=True)
class _FlatTimelines:
    """Timelines as flat arrays: row ``r`` holds events
    ``row_start[r]:row_start[r] + row_length[r]`` of every flat column, which
    are events ``segment_start[r]:...`` of the user's full timeline."""

    user_id: Int64Array  # (U,) sorted ascending
    row_start: Int64Array  # (U,)
    row_length: Int64Array  # (U,)
    segment_start: Int64Array  # (U,)
    columns: dict[str, pa.Array]  # name -> flat values of the list column


def _one_array(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A column as one array: its only chunk as it is (``combine_chunks``
    copies even a single chunk), else the chunks concatenated."""
    if not isinstance(column, pa.ChunkedArray):
        return column
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _int64(column: pa.ChunkedArray | pa.Array) -> Int64Array:
    """An int64 (or timestamp) column as a numpy int64 array."""
    array = _one_array(column)
    if pa.types.is_timestamp(array.type):
        array = array.cast(pa.int64())
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.int64)


def _flatten(timelines: pa.Table) -> _FlatTimelines:
    """Index a timelines (or segments) table by user (see :class:`_FlatTimelines`)."""
    names = ("event_time", *TIMELINE_SEQUENCE_COLUMNS)
    missing = [n for n in ("user_id", *names) if n not in timelines.column_names]
    if missing:
        raise ValueError(f"timelines lack columns {missing}")
    user_id = _int64(timelines.column("user_id"))
    if "segment_start" in timelines.column_names:
        segment_start = _int64(timelines.column("segment_start"))
    else:
        segment_start = np.zeros(user_id.size, dtype=np.int64)
    row_start: Int64Array | None = None
    row_length: Int64Array | None = None
    columns: dict[str, pa.Array] = {}
    for name in names:
        lists = _one_array(timelines.column(name))
        offsets = np.asarray(lists.offsets.to_numpy(), dtype=np.int64)
        # Each column has its own offsets buffer; rows must agree in length.
        length = np.diff(offsets)
        if row_length is None:
            row_length = length
        elif not np.array_equal(row_length, length):
            raise ValueError(f"timeline column {name!r} disagrees in row lengths")
        # ``lists.values`` is the whole child array, even for a sliced list
        # array; positions are then relative to its first offset.
        first, last = int(offsets[0]), int(offsets[-1])
        columns[name] = lists.values.slice(first, last - first)
        if row_start is None:
            row_start = offsets[:-1] - offsets[0]
    assert row_start is not None
    assert row_length is not None
    order = np.argsort(user_id, kind="stable")
    if np.any(np.diff(user_id[order]) == 0):
        raise ValueError("timelines hold more than one row for a user")
    return _FlatTimelines(
        user_id=user_id[order],
        row_start=row_start[order],
        row_length=row_length[order],
        segment_start=segment_start[order],
        columns=columns,
    )


def _range_positions(
    flat: _FlatTimelines, users: Int64Array, first: Int64Array, stop: Int64Array
) -> tuple[Int64Array, Int64Array]:
    """Flat positions of events ``[first[i], stop[i])`` of user ``users[i]``'s
    full timeline, for all ``i`` at once.

    Returns:
        ``(positions, offsets)``: (N,) int64 and (B + 1,) int64.

    Raises:
        ValueError: a non-empty range is not held by the timelines.
    """
    lengths = stop - first
    # Row of each user; a user without a row may only ask for an empty range.
    # (Appending a sentinel row keeps the lookups valid when none is found.)
    row = np.searchsorted(flat.user_id, users)
    found = np.zeros(users.size, dtype=bool)
    inside = row < flat.user_id.size
    found[inside] = flat.user_id[row[inside]] == users[inside]
    row = np.where(found, row, 0)
    if flat.user_id.size == 0:
        row_start = seg_start = seg_len = np.zeros(users.size, dtype=np.int64)
    else:
        row_start = flat.row_start[row]
        seg_start = np.where(found, flat.segment_start[row], 0)
        seg_len = np.where(found, flat.row_length[row], 0)
    local = first - seg_start
    uncovered = (lengths > 0) & ((local < 0) | (local + lengths > seg_len))
    if np.any(uncovered):
        i = int(np.flatnonzero(uncovered)[0])
        held = (
            "no timeline"
            if not found[i]
            else (f"events {seg_start[i]}..{seg_start[i] + seg_len[i]}")
        )
        raise ValueError(
            f"timelines hold {held} of user {users[i]}, not its events "
            f"{first[i]}..{stop[i]}"
        )
    offsets = np.zeros(users.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    # Element k of range i -> flat index row_start[i] + local[i] + k, for all
    # (i, k) at once: output position offsets[i] + k, shifted by range i's
    # start minus offsets[i] (one repeat, added in place to a running index).
    positions = np.repeat(row_start + local - offsets[:-1], lengths)
    positions += np.arange(offsets[-1], dtype=np.int64)
    return positions, offsets


def window_positions(
    user_id: npt.ArrayLike,
    timeline_cut: npt.ArrayLike,
    timelines: pa.Table,
    max_seq_len: int,
) -> tuple[Int64Array, Int64Array, dict[str, pa.Array]]:
    """Where each example's window lies in the flat timeline values.

    Args:
        user_id: (B,) the examples' users.
        timeline_cut: (B,) events of the user's full timeline before each example.
        timelines: full timelines or segments (one row per user).
        max_seq_len: longest window L (>= 1).

    Returns:
        ``(positions, offsets, columns)``: (N,) int64 positions into every flat
        column of ``columns`` (``event_time`` and the timeline's ``seq_*``
        values), example ``i`` owning ``positions[offsets[i]:offsets[i + 1]]``,
        oldest event first; (B + 1,) int64 offsets.

    Raises:
        ValueError: a cut reaches events the timelines do not hold (a user
            without a row, or a segment that does not cover the window).
    """
    if max_seq_len < 1:
        raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
    users = np.asarray(user_id, dtype=np.int64)
    cuts = np.asarray(timeline_cut, dtype=np.int64)
    if np.any(cuts < 0):
        raise ValueError("negative timeline_cut")
    flat = _flatten(timelines)
    first = cuts - np.minimum(cuts, max_seq_len)
    positions, offsets = _range_positions(flat, users, first, cuts)
    return positions, offsets, flat.columns


def read_windows(
    user_id: npt.ArrayLike,
    event_time_ms: npt.ArrayLike,
    timeline_cut: npt.ArrayLike,
    timelines: pa.Table,
    max_seq_len: int,
) -> Windows:
    """The windows of a batch of examples (see the module docstring).

    Args:
        user_id: (B,) the examples' users.
        event_time_ms: (B,) impression times, epoch milliseconds.
        timeline_cut: (B,) the examples' cuts into their full timelines.
        timelines: full timelines or segments covering the windows.
        max_seq_len: longest window L.

    Returns:
        The windows: every :data:`SEQUENCE_COLUMNS` feature, lengths
        ``min(cut, L)``.
    """
    positions, offsets, columns = window_positions(
        user_id, timeline_cut, timelines, max_seq_len
    )
    take = pa.array(positions, pa.int64())
    lengths = np.diff(offsets)
    values: dict[str, npt.NDArray[np.int64] | npt.NDArray[np.int32]] = {}
    for name in SEQUENCE_COLUMNS:
        if name == TIME_BUCKET_FEATURE:
            times = _int64(columns["event_time"].take(take))
            now = np.repeat(np.asarray(event_time_ms, dtype=np.int64), lengths)
            seconds = (now - times).astype(np.float64) / 1000.0
            values[name] = time_bucket(seconds).astype(np.int32)
        else:
            flat = columns[name].take(take).to_numpy(zero_copy_only=False)
            if name == "seq_item_id":
                values[name] = np.asarray(flat, dtype=np.int64)
            else:
                values[name] = np.asarray(flat, dtype=np.int32)
    return Windows(lengths=lengths, offsets=offsets, values=values)


def example_windows(
    examples: pa.Table, timelines: pa.Table, max_seq_len: int
) -> Windows:
    """:func:`read_windows` for a table of examples (training example schema)."""
    return read_windows(
        _int64(examples.column("user_id")),
        _int64(examples.column("event_time")),
        _int64(examples.column("timeline_cut")),
        timelines,
        max_seq_len,
    )


def attach_windows(
    examples: pa.Table, timelines: pa.Table, max_seq_len: int
) -> pa.Table:
    """Examples with their windows materialized as ``seq_*`` list columns.

    Args:
        examples: training examples (``training_example_schema()``).
        timelines: full timelines or segments covering their windows.
        max_seq_len: longest window L.

    Returns:
        The examples in ``training_example_schema(with_sequences=True)``.
    """
    windows = example_windows(examples, timelines, max_seq_len)
    schema = training_example_schema(with_sequences=True)
    offsets = pa.array(windows.offsets.astype(np.int32), pa.int32())
    table = examples.select(
        [f.name for f in training_example_schema()]
    ).combine_chunks()
    for name in SEQUENCE_COLUMNS:
        field = schema.field(name)
        values = pa.array(windows.values[name], field.type.value_type)
        table = table.append_column(field, pa.ListArray.from_arrays(offsets, values))
    return table.cast(schema)


def timeline_segments(
    examples: pa.Table, timelines: pa.Table, max_seq_len: int
) -> pa.Table:
    """The part of each needed timeline that a set of examples' windows reach.

    For every user of ``examples`` that has a timeline row, the events
    ``[max(0, min_cut - L), max_cut)`` of the full timeline (min and max over
    that user's examples), once, with ``segment_start`` = the first one's
    index. Reading the examples' windows from the segments gives the same
    windows as from the full timelines, for any ``max_seq_len <= L``.

    Args:
        examples: examples with ``user_id`` and ``timeline_cut``.
        timelines: full timelines or segments covering the examples' windows.
        max_seq_len: the L the segments must serve.

    Returns:
        :data:`~features.examples.TIMELINE_SEGMENT_SCHEMA`, sorted by user_id.
    """
    users = _int64(examples.column("user_id"))
    cuts = _int64(examples.column("timeline_cut"))
    if users.size == 0:
        return TIMELINE_SEGMENT_SCHEMA.empty_table()
    needed, inverse = np.unique(users, return_inverse=True)
    max_cut = np.zeros(needed.size, dtype=np.int64)
    np.maximum.at(max_cut, inverse, cuts)
    min_cut = np.full(needed.size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(min_cut, inverse, cuts)
    first = np.maximum(min_cut - max_seq_len, 0)
    flat = _flatten(timelines)
    has_row = np.isin(needed, flat.user_id)
    needed, first, max_cut = needed[has_row], first[has_row], max_cut[has_row]
    positions, new_offsets = _range_positions(flat, needed, first, max_cut)
    columns = flat.columns
    take = pa.array(positions, pa.int64())
    list_offsets = pa.array(new_offsets.astype(np.int32), pa.int32())
    arrays: list[pa.Array] = [pa.array(needed, pa.int64())]
    for field in TIMELINE_SCHEMA:
        if field.name == "user_id":
            continue
        values = columns[field.name].take(take).cast(field.type.value_type)
        arrays.append(pa.ListArray.from_arrays(list_offsets, values))
    arrays.append(pa.array(first, pa.int64()))
    return pa.Table.from_arrays(arrays, schema=TIMELINE_SEGMENT_SCHEMA)
