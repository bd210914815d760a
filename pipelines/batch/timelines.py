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
- ``WriteUserSequences``: ``(shard, timelines)`` -> the shard's part of the
  ``user_sequence`` feature table (hourly snapshots, see
  :mod:`features.feature_tables`).

Every step works on a whole shard with the numpy / Arrow kernels of
:mod:`pipelines.core.timelines` and :mod:`pipelines.core.event_copies`
(shared with the streaming job and the reference).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics

from features.arrow_ipc import ipc_to_table, table_to_ipc
from features.events import EVENT_SCHEMA
from features.feature_tables import FEATURE_TABLES
from pipelines.batch.arrow import ShardedIpc, ShardedTable
from pipelines.batch.outputs import (
    BackgroundWriteFn,
    ParquetFileWriter,
    feature_table_part,
    in_user_order,
)
from pipelines.batch.parallel import PooledDoFn
from pipelines.batch.tuning import pipeline_tuning
from pipelines.batch.validate import METRICS_NAMESPACE
from pipelines.core.columns import concat, to_int64
from pipelines.core.event_copies import (
    ID_PROJECTION_SCHEMA,
    copy_winners,
    drop_losing_copies,
    id_buckets,
    id_projection,
)
from pipelines.core.output_files import PLAIN_COLUMNS
from pipelines.core.shards import shard_of, split_by_shard
from pipelines.core.timelines import build_timelines, dedupe_events, user_sequence_parts

SHARD_BATCH_ROWS = 262_144


ID_PROJECTIONS = "id_projections"
"""Tagged output of :class:`ShardEventsFn`: ``(id bucket, projection IPC)``."""


class ShardEventsFn(PooledDoFn):
    """Split batches of valid events by user shard, and their
    :func:`~pipelines.core.event_copies.id_projection` by id bucket (tagged
    :data:`ID_PROJECTIONS`), on a worker thread
    (:class:`~pipelines.batch.parallel.PooledDoFn`) while the bundle's thread
    reads and validates the next batches.

    Small batches (many small files, say one per day) are gathered up to
    :data:`SHARD_BATCH_ROWS` rows within a bundle first, so the shuffle
    carries a few large IPC pieces per shard rather than many tiny ones.
    """

    def __init__(self, shards: int) -> None:
        self._shards = shards
        self._batches: list[pa.Table] = []
        self._rows = 0

    def start_bundle(self) -> None:
        """Nothing is pending at the start of a bundle."""
        super().start_bundle()
        self._batches, self._rows = [], 0

    def process(
        self, events: pa.Table, window: Any = beam.DoFn.WindowParam
    ) -> Iterator[Any]:
        """Buffer the batch; split the buffer once it is large enough."""
        self._batches.append(events)
        self._rows += events.num_rows
        if self._rows >= SHARD_BATCH_ROWS:
            yield from self.submit(self._take_batches(), window)

    def finish_bundle(self) -> Iterator[Any]:
        """Split what is left, then emit every split."""
        if self._batches:
            self.enqueue(self._take_batches())
        yield from super().finish_bundle()

    def _take_batches(self) -> list[pa.Table]:
        batches, self._batches, self._rows = self._batches, [], 0
        return batches

    def compute(self, batches: list[pa.Table]) -> list[Any]:
        """The pieces of the gathered batches: by user shard, and their id
        projections by id bucket."""
        events = concat(batches, EVENT_SCHEMA)
        shards = shard_of(to_int64(events.column("user_id")), self._shards)
        pieces: list[Any] = [
            (shard, table_to_ipc(part))
            for shard, part in split_by_shard(events, shards)
        ]
        ids = id_projection(events)
        buckets = id_buckets(ids.column("event_id"), self._shards)
        for bucket, part in split_by_shard(ids, buckets):
            # Uncompressed: ids and times hardly compress, and LZ4 would cost
            # more in the write and the read than the bytes it saves.
            piece = table_to_ipc(part, compression=None)
            pieces.append(beam.pvalue.TaggedOutput(ID_PROJECTIONS, (bucket, piece)))
        return pieces


class CopyWinnersFn(PooledDoFn):
    """An id bucket's projections -> the winners of its ids whose copies
    differ in user or time (:func:`~pipelines.core.event_copies.copy_winners`), as
    IPC; nothing when there are none (almost always).

    Buckets are counted on worker threads, one more than the tuning's
    (:attr:`~pipelines.batch.parallel.PooledDoFn.emits_little`): what is fused
    after this DoFn only collects the few winners.
    """

    emits_little = True

    def prepare(self, element: tuple[int, Iterable[bytes]]) -> list[bytes]:
        """The bucket's IPC pieces, as a list."""
        _, pieces = element
        return list(pieces)

    def compute(self, pieces: list[bytes]) -> list[bytes]:
        """Gather the bucket's projections and find its conflicting ids."""
        projection = concat([ipc_to_table(p) for p in pieces], ID_PROJECTION_SCHEMA)
        winners = copy_winners(projection)
        return [table_to_ipc(winners)] if winners.num_rows else []


class DedupeEventsFn(PooledDoFn):
    """A user shard's batches -> its distinct events in timeline order (on
    worker threads, :class:`~pipelines.batch.parallel.PooledDoFn`), without the
    copies that lose to a copy of another user or time (the ``winners`` side
    input, :class:`CopyWinnersFn`).

    The DoFns fused after it (timelines, counters, example bases) queue their
    work on pools of their own, so this one takes the bundle thread's core
    too (:attr:`~pipelines.batch.parallel.PooledDoFn.emits_little`).
    """

    emits_little = True

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
        tuning = pipeline_tuning(events.pipeline)
        sharded = events | "ShardByUser" >> beam.ParDo(
            ShardEventsFn(self._shards).tuned(tuning)
        ).with_outputs(ID_PROJECTIONS, main="events")
        winners = (
            sharded[ID_PROJECTIONS]
            | "TypeProjections" >> beam.Map(_same).with_output_types(ShardedIpc)
            | "GroupIdBuckets" >> beam.GroupByKey()
            | "CopyWinners"
            >> beam.ParDo(CopyWinnersFn().tuned(tuning)).with_output_types(bytes)
        )
        return (
            sharded.events
            | "TypeShards" >> beam.Map(_same).with_output_types(ShardedIpc)
            | "GroupShards" >> beam.GroupByKey()
            # The side input by position: the DoFn's process also takes the window.
            | "Dedupe"
            >> beam.ParDo(
                DedupeEventsFn().tuned(tuning),
                beam.pvalue.AsList(winners),
            ).with_output_types(ShardedTable)
        )


def _same(element: Any) -> Any:
    """Identity, applied with a type hint (a tagged output has none)."""
    return element


class BuildTimelinesFn(PooledDoFn):
    """``(shard, distinct events)`` -> ``(shard, timelines)``, on a worker
    thread (:class:`~pipelines.batch.parallel.PooledDoFn`)."""

    def __init__(self) -> None:
        self.timelines = Metrics.counter(METRICS_NAMESPACE, "timelines")
        self.events = Metrics.counter(METRICS_NAMESPACE, "timeline_events")

    def process(
        self,
        element: ShardedTable,
        ads: pa.Table,
        contents: pa.Table,
        window: Any = beam.DoFn.WindowParam,
    ) -> Iterator[ShardedTable]:
        """Queue the shard's timelines (the dimension tables go along)."""
        yield from self.submit((element, ads, contents), window)

    def compute(
        self, work: tuple[ShardedTable, pa.Table, pa.Table]
    ) -> tuple[int, pa.Table, int]:
        """Build the shard's timelines; with its number of events."""
        (shard, events), ads, contents = work
        return shard, build_timelines(events, ads, contents), events.num_rows

    def emit(self, result: tuple[int, pa.Table, int]) -> Iterator[ShardedTable]:
        """Count the shard's timelines and events; its timelines."""
        shard, timelines, events = result
        self.timelines.inc(timelines.num_rows)
        self.events.inc(events)
        yield shard, timelines


class BuildTimelines(beam.PTransform):  # type: ignore[misc]
    """``(shard, distinct events)`` -> ``(shard, timelines)`` (TIMELINE_SCHEMA)."""

    def __init__(self, ads: Any, contents: Any) -> None:
        super().__init__()
        self._ads = ads
        self._contents = contents

    def expand(self, events: beam.PCollection) -> beam.PCollection:
        """One DoFn over each shard, the dimension tables as side inputs."""
        # Side inputs by position: the DoFn's process also takes the window.
        return events | "Timelines" >> beam.ParDo(
            BuildTimelinesFn().tuned(pipeline_tuning(events.pipeline)),
            beam.pvalue.AsSingleton(self._ads),
            beam.pvalue.AsSingleton(self._contents),
        ).with_output_types(ShardedTable)


class WriteUserSequencesFn(BackgroundWriteFn):
    """``(shard, timelines)`` -> the shard's ``user_sequence`` part.

    Snapshots are cut in pieces and each piece is written (one Parquet row
    group) on the writer thread while the next is cut: the part never exists
    whole in memory, and the write overlaps the cutting.
    """

    ordered_writes = True

    def __init__(self, output: str) -> None:
        self._output = output

    def process(self, element: ShardedTable) -> Iterator[tuple[str, str]]:
        """Cut and write the shard's snapshots; yield ``(name, path)``."""
        shard, timelines = element
        path = feature_table_part(self._output, "user_sequence", shard)
        schema = FEATURE_TABLES["user_sequence"].schema
        file = ParquetFileWriter(schema, PLAIN_COLUMNS["user_sequence"])
        for part in user_sequence_parts(in_user_order(timelines)):
            self.submit(file.write, part)
        self.submit(file.close, path)
        yield "user_sequence", path


class WriteUserSequences(beam.PTransform):  # type: ignore[misc]
    """``(shard, timelines)`` ->
    ``feature_tables/user_sequence/part-SSSSS.parquet``, by (user, time).

    Each shard's snapshots are cut where its timelines are (a user's
    snapshots come from its timeline alone), never gathered: the snapshots
    are several times the timelines' bytes. The output is ``(name, path)``
    for every part written.
    """

    def __init__(self, output: str) -> None:
        super().__init__()
        self._output = output

    def expand(self, timelines: beam.PCollection) -> beam.PCollection:
        """One part per shard."""
        write = WriteUserSequencesFn(self._output)
        return timelines | "Snapshots" >> beam.ParDo(
            write.tuned(pipeline_tuning(timelines.pipeline))
        )
