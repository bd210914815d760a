"""Distinct events per user shard, and the timelines built from them.

- ``DedupeEvents``: valid event batches -> ``(shard, events)``: every user's
  events in one shard (hash of ``user_id`` mod ``--shards``), each
  ``event_id`` once (its winning copy, :mod:`features.duplicates`), sorted by
  ``(user_id, event_time, event_id)``, the timeline order. Copies under one
  user meet in the user's shard; copies under several users do not, so a
  small projection of every event (id, user, time) is shuffled by id to find
  those ids and their winning user and time, which each shard applies before
  its own deduplication. The events themselves cross one shuffle only.
- ``BuildTimelines``: ``(shard, events)`` -> ``(shard, timelines)`` in
  :data:`~features.examples.TIMELINE_SCHEMA`, one row per user.
- ``WriteUserSequences``: ``(shard, timelines)`` -> the ``user_sequence``
  feature table file (hourly snapshots, see :mod:`features.feature_tables`),
  cut once from every shard's timelines.

Every step works on a whole shard with numpy / Arrow kernels (the sort and
dedupe kernels are shared with the reference: :mod:`pipelines.core.kernels`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from features import vocab
from features.events import EVENT_SCHEMA
from features.examples import TIMELINE_SCHEMA
from features.feature_tables import FEATURE_TABLES, USER_SEQUENCE_LENGTH
from features.registry import sequence_item_key
from features.windows import window_positions
from pipelines.batch.arrow import (
    IntArray,
    ShardedIpc,
    ShardedTable,
    asof_index,
    concat,
    ipc_to_table,
    per_table,
    shard_of,
    split_by_shard,
    table_to_ipc,
    to_int64,
    vocabulary_codes,
)
from pipelines.batch.io import BackgroundWriteFn, ParquetFileWriter
from pipelines.batch.parallel import PooledDoFn
from pipelines.batch.tuning import pipeline_tuning
from pipelines.batch.validate import METRICS_NAMESPACE
from pipelines.core.kernels import (
    ID_PROJECTION_SCHEMA,
    PLAIN_COLUMNS,
    copy_winners,
    drop_losing_copies,
    id_buckets,
    id_projection,
    timeline_order,
    winning_copies,
)

HOUR_MS = 3_600_000
SHARD_BATCH_ROWS = 262_144
TIMELINE_ORDER = [
    ("user_id", "ascending"),
    ("event_time", "ascending"),
    ("event_id", "ascending"),
]


def dedupe_events(events: pa.Table) -> pa.Table:
    """Each event_id once, sorted by ``(user_id, event_time, event_id)``.

    The copy kept is the contract's winner among ``events``
    (:func:`~pipelines.core.kernels.winning_copies`), so the result does not
    depend on the order batches arrived in.
    """
    keep = winning_copies(events)
    if not keep.all():
        events = events.filter(pa.array(keep))
    order = timeline_order(
        [to_int64(events.column("user_id")), to_int64(events.column("event_time"))],
        events.column("event_id"),
    )
    return events.take(pa.array(order))


ID_PROJECTIONS = "id_projections"
"""Tagged output of :class:`ShardEventsFn`: ``(id bucket, projection IPC)``."""


class ShardEventsFn(beam.DoFn):  # type: ignore[misc]
    """Split batches of valid events by user shard, and their
    :func:`~pipelines.core.kernels.id_projection` by id bucket (tagged
    :data:`ID_PROJECTIONS`).

    Small batches (many small files, say one per day) are gathered up to
    :data:`SHARD_BATCH_ROWS` rows within a bundle first, so the shuffle
    carries a few large IPC pieces per shard rather than many tiny ones.
    """

    def __init__(self, shards: int) -> None:
        self._shards = shards
        self._pending: list[pa.Table] = []
        self._rows = 0

    def start_bundle(self) -> None:
        """Nothing is pending at the start of a bundle."""
        self._pending, self._rows = [], 0

    def process(self, events: pa.Table) -> Iterator[ShardedIpc]:
        """Buffer the batch; split the buffer once it is large enough."""
        self._pending.append(events)
        self._rows += events.num_rows
        if self._rows >= SHARD_BATCH_ROWS:
            yield from self._split()

    def finish_bundle(self) -> Iterator[Any]:
        """Split what is left (the job runs in the global window)."""
        for element in self._split():
            if isinstance(element, beam.pvalue.TaggedOutput):
                yield beam.pvalue.TaggedOutput(element.tag, _global(element.value))
            else:
                yield _global(element)

    def _split(self) -> Iterator[Any]:
        if not self._pending:
            return
        events = concat(self._pending, EVENT_SCHEMA)
        self._pending, self._rows = [], 0
        shards = shard_of(to_int64(events.column("user_id")), self._shards)
        for shard, part in split_by_shard(events, shards):
            yield shard, table_to_ipc(part)
        ids = id_projection(events)
        buckets = id_buckets(ids.column("event_id"), self._shards)
        for bucket, part in split_by_shard(ids, buckets):
            yield beam.pvalue.TaggedOutput(ID_PROJECTIONS, (bucket, _plain_ipc(part)))


def _global(value: Any) -> WindowedValue:
    return WindowedValue(value, MIN_TIMESTAMP, [GlobalWindow()])


_PLAIN_IPC = pa.ipc.IpcWriteOptions(compression=None)


def _plain_ipc(table: pa.Table) -> bytes:
    """Uncompressed IPC: ids and times hardly compress (LZ4 would cost four
    times the write, and the read, for half the bytes)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_PLAIN_IPC) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


class CopyWinnersFn(beam.DoFn):  # type: ignore[misc]
    """An id bucket's projections -> the winners of its ids whose copies
    differ in user or time (:func:`~pipelines.core.kernels.copy_winners`), as
    IPC; nothing when there are none (almost always)."""

    def process(self, element: tuple[int, Iterable[bytes]]) -> Iterator[bytes]:
        """Gather the bucket's projections and find its conflicting ids."""
        _, pieces = element
        projection = concat([ipc_to_table(p) for p in pieces], ID_PROJECTION_SCHEMA)
        winners = copy_winners(projection)
        if winners.num_rows:
            yield table_to_ipc(winners)


class DedupeEventsFn(PooledDoFn):
    """A user shard's batches -> its distinct events in timeline order (on a
    worker thread, :class:`~pipelines.batch.parallel.PooledDoFn`), without the
    copies that lose to a copy of another user or time (the ``winners`` side
    input, :class:`CopyWinnersFn`)."""

    def __init__(self) -> None:
        self.duplicates = Metrics.counter(METRICS_NAMESPACE, "duplicates_removed")
        self.distinct = Metrics.counter(METRICS_NAMESPACE, "events_distinct")

    def process(
        self,
        element: tuple[int, Iterable[bytes]],
        winners: list[bytes],
        window: Any = beam.DoFn.WindowParam,
    ) -> Iterator[Any]:
        """Queue the shard's work with the winners of conflicting ids."""
        shard, batches = element
        yield from self.submit((shard, list(batches), list(winners)), window)

    def compute(
        self, element: tuple[int, list[bytes], list[bytes]]
    ) -> tuple[int, pa.Table, int]:
        """Concatenate, drop the copies that lose to another shard's, dedupe,
        sort; with the number of rows dropped."""
        shard, batches, winner_pieces = element
        events = concat([ipc_to_table(b) for b in batches], EVENT_SCHEMA)
        if winner_pieces:
            winners = concat(
                [ipc_to_table(p) for p in winner_pieces], ID_PROJECTION_SCHEMA
            )
            kept = drop_losing_copies(events, winners)
        else:
            kept = events
        distinct = dedupe_events(kept)
        return shard, distinct, events.num_rows - distinct.num_rows

    def emit(self, result: tuple[int, pa.Table, int]) -> Iterator[ShardedTable]:
        """Count what was dropped and kept; the shard's distinct events."""
        shard, distinct, dropped = result
        self.duplicates.inc(dropped)
        self.distinct.inc(distinct.num_rows)
        yield shard, distinct


class DedupeEvents(beam.PTransform):  # type: ignore[misc]
    """Valid event batches -> ``(user shard, distinct events in timeline order)``."""

    def __init__(self, shards: int) -> None:
        super().__init__()
        self._shards = shards

    def expand(self, events: beam.PCollection) -> beam.PCollection:
        """Shard by user and id bucket, shuffle both (Arrow IPC), find the
        winners of conflicting ids, dedupe each shard."""
        sharded = events | "ShardByUser" >> beam.ParDo(
            ShardEventsFn(self._shards)
        ).with_outputs(ID_PROJECTIONS, main="events")
        winners = (
            sharded[ID_PROJECTIONS]
            | "TypeProjections" >> beam.Map(_same).with_output_types(ShardedIpc)
            | "GroupIdBuckets" >> beam.GroupByKey()
            | "CopyWinners" >> beam.ParDo(CopyWinnersFn()).with_output_types(bytes)
        )
        return (
            sharded.events
            | "TypeShards" >> beam.Map(_same).with_output_types(ShardedIpc)
            | "GroupShards" >> beam.GroupByKey()
            # The side input by position: the DoFn's process also takes the window.
            | "Dedupe"
            >> beam.ParDo(
                DedupeEventsFn().tuned(pipeline_tuning(events.pipeline)),
                beam.pvalue.AsList(winners),
            ).with_output_types(ShardedTable)
        )


def _same(element: Any) -> Any:
    """Identity, applied with a type hint (a tagged output has none)."""
    return element


def event_categories(events: pa.Table, ads: pa.Table, contents: pa.Table) -> IntArray:
    """``seq_category`` of each event: the ad's declared creative category as
    of the event (ads table) or the content's category; 0 when unknown."""
    is_ad = np.asarray(
        pc.is_in(events.column("action"), value_set=pa.array(vocab.AD_ACTIONS))
    )
    # Each lookup only for the events it applies to (ad vs organic).
    ad_events = np.flatnonzero(is_ad)
    organic = np.flatnonzero(~is_ad)
    ad_rows = asof_index(ads, "ad_id", "updated_at").rows(
        to_int64(events.column("ad_id"), -1)[ad_events],
        to_int64(events.column("event_time"))[ad_events],
    )
    ad_codes = per_table(ads, "ad_categories", _category_codes("creative_category"))
    content_rows = asof_index(contents, "content_id", None).rows(
        to_int64(events.column("content_id"), -1)[organic],
        np.zeros(organic.size, np.int64),
    )
    content_codes = per_table(
        contents, "content_categories", _category_codes("content_category")
    )
    category = np.zeros(events.num_rows, dtype=np.int64)
    ad_hit = ad_rows >= 0
    category[ad_events[ad_hit]] = ad_codes[ad_rows[ad_hit]]
    content_hit = content_rows >= 0
    category[organic[content_hit]] = content_codes[content_rows[content_hit]]
    return category


def _category_codes(column: str) -> Callable[[pa.Table], IntArray]:
    def codes(table: pa.Table) -> IntArray:
        return vocabulary_codes(table.column(column), vocab.CATEGORIES)

    return codes


def user_offsets(users: IntArray) -> IntArray:
    """Offsets (U + 1) of the runs of equal users in a user-sorted array."""
    if users.size == 0:
        return np.zeros(1, dtype=np.int64)
    starts = np.flatnonzero(np.diff(users)) + 1
    return np.concatenate([[0], starts, [users.size]]).astype(np.int64)


def build_timelines(events: pa.Table, ads: pa.Table, contents: pa.Table) -> pa.Table:
    """One timeline row per user from distinct events in timeline order.

    Args:
        events: distinct valid events sorted by (user_id, event_time, event_id).
        ads: the ads table (for the as-of creative category).
        contents: the contents table.

    Returns:
        TIMELINE_SCHEMA, one row per user, in user order.
    """
    users = to_int64(events.column("user_id"))
    offsets = user_offsets(users)
    is_ad = np.asarray(
        pc.is_in(events.column("action"), value_set=pa.array(vocab.AD_ACTIONS))
    )
    values: dict[str, Any] = {
        "event_time": events.column("event_time").combine_chunks(),
        "seq_item_id": sequence_item_key(
            to_int64(events.column("ad_id")),
            to_int64(events.column("content_id")),
            is_ad,
        ),
        "seq_action": vocabulary_codes(events.column("action"), vocab.ACTIONS),
        "seq_domain": vocabulary_codes(events.column("domain"), vocab.DOMAINS),
        "seq_surface": vocabulary_codes(events.column("surface"), vocab.SURFACES),
        "seq_category": event_categories(events, ads, contents),
    }
    list_offsets = pa.array(offsets.astype(np.int32), pa.int32())
    arrays = [pa.array(users[offsets[:-1]], pa.int64())]
    for field in TIMELINE_SCHEMA:
        if field.name == "user_id":
            continue
        flat = pa.array(values[field.name], field.type.value_type)
        arrays.append(pa.ListArray.from_arrays(list_offsets, flat))
    return pa.Table.from_arrays(arrays, schema=TIMELINE_SCHEMA)


class BuildTimelinesFn(beam.DoFn):  # type: ignore[misc]
    """``(shard, distinct events)`` -> ``(shard, timelines)``."""

    def __init__(self) -> None:
        self.timelines = Metrics.counter(METRICS_NAMESPACE, "timelines")
        self.events = Metrics.counter(METRICS_NAMESPACE, "timeline_events")

    def process(
        self, element: ShardedTable, ads: pa.Table, contents: pa.Table
    ) -> Iterator[ShardedTable]:
        """Build and count the shard's timelines."""
        shard, events = element
        timelines = build_timelines(events, ads, contents)
        self.timelines.inc(timelines.num_rows)
        self.events.inc(events.num_rows)
        yield shard, timelines


class BuildTimelines(beam.PTransform):  # type: ignore[misc]
    """``(shard, distinct events)`` -> ``(shard, timelines)`` (TIMELINE_SCHEMA)."""

    def __init__(self, ads: Any, contents: Any) -> None:
        super().__init__()
        self._ads = ads
        self._contents = contents

    def expand(self, events: beam.PCollection) -> beam.PCollection:
        """One DoFn over each shard, the dimension tables as side inputs."""
        return events | "Timelines" >> beam.ParDo(
            BuildTimelinesFn(),
            ads=beam.pvalue.AsSingleton(self._ads),
            contents=beam.pvalue.AsSingleton(self._contents),
        ).with_output_types(ShardedTable)


USER_SEQUENCE_PART_ROWS = 65_536


def user_sequences(timelines: pa.Table) -> pa.Table:
    """The ``user_sequence`` feature table rows of some users' timelines.

    One row per (user, UTC hour with an event of the user), at the end of the
    hour, with the last :data:`USER_SEQUENCE_LENGTH` events strictly before it,
    in (user, hour) order.
    """
    spec = FEATURE_TABLES["user_sequence"]
    parts = list(user_sequence_parts(timelines))
    return pa.concat_tables(parts) if parts else spec.schema.empty_table()


def user_sequence_parts(
    timelines: pa.Table, rows_per_part: int = USER_SEQUENCE_PART_ROWS
) -> Iterator[pa.Table]:
    """:func:`user_sequences` in consecutive parts of at most ``rows_per_part``
    rows (the whole table when concatenated), so a writer can write one part
    while the next is cut."""
    spec = FEATURE_TABLES["user_sequence"]
    # One copy of the (chunked) timelines; each part's windows are then cut
    # from it without another, so the first part is ready (and its write
    # can start) before the later ones are cut.
    timelines = timelines.combine_chunks()
    times = timelines.column("event_time")
    times = times.chunk(0) if times.num_chunks == 1 else times.combine_chunks()
    flat_times = to_int64(times.values)
    lengths = np.diff(np.asarray(times.offsets.to_numpy(), dtype=np.int64))
    owner = np.repeat(np.arange(timelines.num_rows), lengths)
    hour_end = (flat_times // HOUR_MS + 1) * HOUR_MS
    # Distinct (user, hour) pairs; both arrays are sorted within each user.
    pair = np.ones(flat_times.size, dtype=bool)
    pair[1:] = (owner[1:] != owner[:-1]) | (hour_end[1:] != hour_end[:-1])
    rows, ends = owner[pair], hour_end[pair]
    users = to_int64(timelines.column("user_id"))[rows]
    # Events strictly before the hour's end: every event of the user up to the
    # last one of that hour (times ascend), i.e. the index of the next pair.
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    following = np.append(np.flatnonzero(pair)[1:], flat_times.size)
    cuts = following - starts[rows]
    # Rows in (user, hour) order whatever the timelines' row order (several
    # shards' timelines concatenated): ordering these few integer arrays
    # here is much cheaper than reordering the snapshots' list columns.
    by_user = np.argsort(users, kind="stable")
    users, ends, cuts = users[by_user], ends[by_user], cuts[by_user]
    time_type = spec.schema.field("event_timestamp").type
    for lo in range(0, users.size, max(1, rows_per_part)):
        hi = min(lo + rows_per_part, users.size)
        positions, offsets, columns = window_positions(
            users[lo:hi], cuts[lo:hi], timelines, USER_SEQUENCE_LENGTH
        )
        take = pa.array(positions, pa.int64())
        list_offsets = pa.array(offsets.astype(np.int32))
        arrays: list[pa.Array] = [
            pa.array(users[lo:hi], pa.int64()),
            pa.array(ends[lo:hi], pa.int64()).cast(time_type),
        ]
        for field in spec.schema:
            if field.name in ("user_id", "event_timestamp"):
                continue
            source = "event_time" if field.name == "seq_event_time_ms" else field.name
            values = columns[source].take(take)
            if source == "event_time":
                values = values.cast(pa.int64())
            flat = values.cast(field.type.value_type)
            arrays.append(pa.ListArray.from_arrays(list_offsets, flat))
        yield pa.Table.from_arrays(arrays, schema=spec.schema)


class WriteUserSequencesFn(BackgroundWriteFn):
    """All shards' timelines -> ``feature_tables/user_sequence.parquet``.

    Snapshots are cut in parts and each part is written (one Parquet row
    group) on the writer thread while the next is cut: the file never exists
    whole in memory, and the write overlaps the cutting.
    """

    def __init__(self, output: str) -> None:
        self._output = output

    def process(self, element: tuple[int, Iterable[bytes]]) -> Iterator[str]:
        """Cut and write the table; yield its path."""
        _, pieces = element
        timelines = concat([ipc_to_table(p) for p in pieces], TIMELINE_SCHEMA)
        path = f"{self._output}/feature_tables/user_sequence.parquet"
        schema = FEATURE_TABLES["user_sequence"].schema
        file = ParquetFileWriter(schema, PLAIN_COLUMNS["user_sequence"])
        for part in user_sequence_parts(timelines):
            self.submit(file.write, part)
        self.submit(file.close, path)
        yield path


class WriteUserSequences(beam.PTransform):  # type: ignore[misc]
    """``(shard, timelines)`` -> ``feature_tables/user_sequence.parquet``.

    One file sorted by (user, snapshot time), so the shards' timelines (about
    a fifth of the snapshots' bytes) are gathered under one key and the
    snapshots cut once, already in that order; gathering per-shard snapshots
    instead would ship and reorder ~5x the bytes.
    """

    def __init__(self, output: str) -> None:
        super().__init__()
        self._output = output

    def expand(self, timelines: beam.PCollection) -> beam.PCollection:
        """Gather every shard's timelines (IPC) under one key, then snapshot."""
        pipeline = timelines.pipeline
        # An empty piece, so that the table is written when no user has events.
        none = pipeline | "NoTimelines" >> beam.Create(
            [(0, table_to_ipc(TIMELINE_SCHEMA.empty_table()))], reshuffle=False
        ).with_output_types(ShardedIpc)
        pieces = timelines | "TimelineIpc" >> beam.Map(
            lambda element: (0, table_to_ipc(element[1]))
        ).with_output_types(ShardedIpc)
        return (
            (pieces, none)
            | "AllTimelines" >> beam.Flatten().with_output_types(ShardedIpc)
            | "GatherTimelines" >> beam.GroupByKey()
            | "Snapshots"
            >> beam.ParDo(
                WriteUserSequencesFn(self._output).tuned(pipeline_tuning(pipeline))
            )
        )
