"""``ReadEventStream``: an unbounded Kafka read as a splittable DoFn (kafka-python).

One element per reader (:class:`TopicRead`), read by one consumer assigned to
the reader's partitions. Its restriction is the next offset of each of them
(:class:`TopicPositions`), with no end. Each ``process`` call polls for up to
``CALL_SECONDS``, claims the offsets it read, and defers the rest
(``defer_remainder``): the runner checkpoints the positions between calls,
which is how an unbounded source runs on Prism, Flink and Dataflow alike. A
bounded run (``idle_seconds``) ends a reader once its partitions have been idle.

How many readers: one per partition at the start, each with its own
watermark, where the runner combines the readers' watermarks (Flink,
Dataflow); one for the whole topic on Prism (:func:`one_reader`). A
partition added to the topic while the job runs joins reader
``partition % readers`` within :data:`~.reader_consumer.PARTITION_REFRESH_MS`.
A reader's watermark is the minimum over its partitions of ``max event time
seen - out_of_orderness`` (:mod:`.topic_positions`).

Each poll is decoded and validated (:func:`features.events.decode_event`)
right here, because the watermark is event time. An event is judged against
its own partition's mark (or the reader's watermark where that is later:
:meth:`~.topic_positions.PartitionWatermarks.lateness_reference_ms`), never
against another partition's clock. It is

- *on time* when its time is at or after that mark;
- *late but allowed* when it is less than ``allowed_lateness`` behind it: it
  goes on with the others and is incorporated (the stateful stages keep
  their results open that long; see :mod:`.user_state`);
- *too late* when it is ``allowed_lateness`` or more behind: a dead letter
  with reason ``late: ...`` (never silently dropped).

Records that retention deleted before the reader got to them are skipped
and reported: a warning naming the partition, the offset expected, the
earliest retained one and the count, and the ``events_lost_to_retention``
counter.

Output: per call, one :class:`EventBatch` (the valid events of all its polls
and partitions, in EVENT_SCHEMA plus the Kafka record time ``published_ms``),
timestamped with its earliest event time, so it holds the downstream
watermark until it is processed; dead letters (tagged ``dead_letters``) as
:meth:`features.deadletter.DeadLetter.to_json` lines (topic, partition,
offset, reason, the message's bytes, their length and hash); progress marks
(tagged ``marks``), one per partition read, for the offset committer.

Offsets: the consumer never auto-commits. What is committed, and when, is the
job's durability rule (:mod:`.offsets`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import apache_beam as beam
import pyarrow as pa
from apache_beam import pvalue
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.utils.timestamp import Duration, Timestamp

from features.deadletter import DeadLetter
from features.events import EVENT_SCHEMA, decode_event, now_ms
from features.kafka import KafkaSettings
from features.kafka.topics import topic_partitions
from pipelines.beam.runner import runner_name
from pipelines.streaming.config import METRICS_NAMESPACE
from pipelines.streaming.event_timers import ms_to_timestamp
from pipelines.streaming.reader_consumer import ReaderConsumer, RetentionGap
from pipelines.streaming.tables import STREAM_EVENT_SCHEMA
from pipelines.streaming.topic_positions import (
    END,
    PartitionWatermarks,
    ReadFrom,
    TopicPositionsTracker,
    TopicRead,
    TopicRestrictions,
    WatermarksProvider,
)

DEAD_LETTERS: Final = "dead_letters"
MARKS: Final = "marks"
EVENTS: Final = "events"
CALL_SECONDS: Final = 0.5
"""A call's outputs reach the next stages when its bundle ends: this bounds
what the reader adds to an event's freshness."""
ONE_READER_RUNNERS: Final = frozenset({"PrismRunner", "DirectRunner"})
"""Runners that keep a splittable DoFn's watermark from the bundle finished
last instead of combining the restrictions': one reader makes it the minimum."""
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EventBatch:
    """Valid events read from a topic.

    Attributes:
        source: ``topic/partition`` (one partition's poll) or ``topic``.
        events: STREAM_EVENT_SCHEMA rows (EVENT_SCHEMA + ``published_ms``).
    """

    source: str
    events: pa.Table


_RESTRICTION = beam.DoFn.RestrictionParam(TopicRestrictions())
_WATERMARK = beam.DoFn.WatermarkEstimatorParam(WatermarksProvider())


class ReadTopicFn(beam.DoFn):  # type: ignore[misc]
    """The splittable DoFn: poll, validate, classify lateness, set the watermark.

    Args:
        settings: the cluster.
        group_id: consumer group (offsets are committed by :mod:`.offsets`).
        out_of_orderness_ms: how far behind the newest event time the
            watermark trails (events may arrive this much out of order and
            still be on time).
        allowed_lateness_ms: how far behind the watermark an event may still
            be incorporated.
        idle_seconds: bounded runs: stop after this long without a message
            on any partition while the broker answered (None: read forever).
        now_ms: validation clock (None: the wall clock at each poll).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        group_id: str,
        *,
        out_of_orderness_ms: int,
        allowed_lateness_ms: int,
        idle_seconds: float | None,
        now_ms: int | None = None,
    ) -> None:
        self._settings = settings
        self._group_id = group_id
        self._slack = out_of_orderness_ms
        self._lateness = allowed_lateness_ms
        self._idle_seconds = idle_seconds
        self._now = now_ms
        self._consumers: dict[tuple[str, int], ReaderConsumer] = {}
        self.read = Metrics.counter(METRICS_NAMESPACE, "events_read")
        self.valid = Metrics.counter(METRICS_NAMESPACE, "events_valid")
        self.invalid = Metrics.counter(METRICS_NAMESPACE, "events_dead_lettered")
        self.late_allowed = Metrics.counter(METRICS_NAMESPACE, "events_late_allowed")
        self.too_late = Metrics.counter(METRICS_NAMESPACE, "events_too_late")
        self.broker_quiet = Metrics.counter(METRICS_NAMESPACE, "broker_quiet_probes")
        self.lost = Metrics.counter(METRICS_NAMESPACE, "events_lost_to_retention")
        self.joined = Metrics.counter(METRICS_NAMESPACE, "partitions_joined")
        self.delay = Metrics.distribution(METRICS_NAMESPACE, "watermark_delay_ms")

    def teardown(self) -> None:
        """Close the consumers."""
        for consumer in self._consumers.values():
            consumer.close()
        self._consumers.clear()

    def _consumer_for(self, element: TopicRead) -> ReaderConsumer:
        """The reader's consumer (kept across calls)."""
        key = (element.topic, element.reader)
        if key not in self._consumers:
            self._consumers[key] = ReaderConsumer(
                self._settings, self._group_id, element
            )
            log.info(
                "reader %d of %d of topic %s reads partitions %s",
                element.reader + 1,
                element.readers,
                element.topic,
                [p for p, _ in element.starts],
            )
        return self._consumers[key]

    @beam.DoFn.unbounded_per_element()
    def process(
        self,
        element: TopicRead,
        tracker: TopicPositionsTracker = _RESTRICTION,
        watermark: Any = _WATERMARK,
    ) -> Iterator[Any]:
        """Poll for up to ``CALL_SECONDS``, then hand the rest back."""
        outputs = self._read_for_a_call(element, tracker, watermark)
        yield from one_batch_per_call(outputs)

    def _read_for_a_call(
        self,
        element: TopicRead,
        tracker: TopicPositionsTracker,
        watermark: PartitionWatermarks,
    ) -> list[Any]:
        """Poll until ``CALL_SECONDS`` have passed, a claim fails or a bounded
        run is finished; the outputs of every poll, in order."""
        started = time.monotonic()
        consumer = self._consumer_for(element)
        moved = consumer.at(tracker.current_restriction())
        if not (
            self._skip_lost(consumer, consumer.gaps(moved), tracker)
            and self._join_added(consumer, tracker, watermark)
        ):
            return []
        outputs: list[Any] = []
        try:
            while True:
                if tracker.current_restriction().finished:
                    return outputs  # checkpointed by the runner: resumed later
                polled, claimed_all = self._poll(element, consumer, tracker, watermark)
                outputs += polled
                if not claimed_all:
                    return outputs
                if self._idle_seconds is not None and (
                    consumer.quiet_for > self._idle_seconds
                ):
                    confirmed, quiet = consumer.idle_confirmed_now()
                    self.broker_quiet.inc(int(quiet))
                    if not confirmed:
                        # Idle time counts only from a moment the broker answered.
                        consumer.quiet_for = 0.0
                        continue
                    # Bounded run: the topic is finished. The watermark then
                    # goes to the end of time and every timer downstream fires.
                    tracker.try_claim(END)
                    return outputs
                if time.monotonic() - started > CALL_SECONDS:
                    tracker.defer_remainder(Duration.of(0))
                    return outputs
        finally:
            self._report(element, consumer, watermark)

    def _skip_lost(
        self,
        consumer: ReaderConsumer,
        gaps: list[RetentionGap],
        tracker: TopicPositionsTracker,
    ) -> bool:
        """Claim past what retention deleted before it was read, and say so
        (a counter and a warning); False when a claim failed."""
        for gap in gaps:
            if not tracker.try_claim(ReadFrom(gap.partition, gap.earliest)):
                return False
            consumer.seek(gap.partition, gap.earliest)
            self.lost.inc(gap.skipped)
            log.warning(
                "partition %s/%d: offsets %d to %d were deleted by retention "
                "before they were read; reading from %d (%d records skipped)",
                consumer.read.topic,
                gap.partition,
                gap.expected,
                gap.earliest - 1,
                gap.earliest,
                gap.skipped,
            )
        return True

    def _join_added(
        self,
        consumer: ReaderConsumer,
        tracker: TopicPositionsTracker,
        watermark: PartitionWatermarks,
    ) -> bool:
        """Read the reader's partitions added to the topic, from their start;
        False when a claim failed."""
        for partition in consumer.joined():
            if not tracker.try_claim(ReadFrom(partition, 0)):
                return False
            consumer.add(partition, 0)
            watermark.add(partition)
            self.joined.inc()
            log.info(
                "partition %s/%d joined reader %d of %d",
                consumer.read.topic,
                partition,
                consumer.read.reader + 1,
                consumer.read.readers,
            )
            if not self._skip_lost(consumer, consumer.gaps([partition]), tracker):
                return False
        return True

    def _report(
        self,
        element: TopicRead,
        consumer: ReaderConsumer,
        watermark: PartitionWatermarks,
    ) -> None:
        """The gauges an operator alerts on: each partition's lag behind its
        log end and each partition's mark behind the wall clock; the
        reader's watermark delay as a distribution."""
        wall = now_ms()
        for partition, lag in consumer.lag().items():
            Metrics.gauge(METRICS_NAMESPACE, f"consumer_lag_records.{partition}").set(
                lag
            )
        for partition in consumer.next:
            mark = watermark.partition_mark_ms(partition)
            if mark is not None:
                name = f"partition_watermark_delay_ms.{partition}"
                Metrics.gauge(METRICS_NAMESPACE, name).set(wall - mark)
        mark = watermark.mark_ms()
        if mark is not None:
            self.delay.update(wall - mark)

    def _poll(
        self,
        element: TopicRead,
        consumer: ReaderConsumer,
        tracker: TopicPositionsTracker,
        watermark: PartitionWatermarks,
    ) -> tuple[list[Any], bool]:
        """One poll: claim, validate, classify lateness, set the watermark.

        Returns:
            The outputs, and False when a claim failed (the call must end).
        """
        polled = time.monotonic()
        records, gaps = consumer.poll()
        if gaps:
            return [], self._skip_lost(consumer, gaps, tracker)
        outputs: list[Any] = []
        claimed_all = True
        for tp in sorted(records, key=lambda tp: tp.partition):
            batch_outputs, claimed_all = self._read_partition(
                element.topic, tp.partition, records[tp], tracker, watermark
            )
            outputs += batch_outputs
            if not claimed_all:
                break
            consumer.next[tp.partition] = records[tp][-1].offset + 1
        consumer.heard(any(records.values()), time.monotonic() - polled)
        return outputs, claimed_all

    def _read_partition(
        self,
        topic: str,
        partition: int,
        messages: list[Any],
        tracker: TopicPositionsTracker,
        watermark: PartitionWatermarks,
    ) -> tuple[list[Any], bool]:
        """The messages of one partition in one poll."""
        outputs: list[Any] = []
        records_ok: list[dict[str, Any]] = []
        published: list[int] = []
        clock = self._now if self._now is not None else now_ms()
        source = f"{topic}/{partition}"
        newest = None
        late_allowed = too_late = invalid = read = 0
        claimed_all = True
        next_offset = messages[0].offset
        for message in messages:
            if not tracker.try_claim((partition, message.offset)):
                claimed_all = False
                break
            read += 1
            next_offset = message.offset + 1
            payload = message.value or b""
            decoded = decode_event(payload, now=clock)
            if decoded.event is None:
                invalid += 1
                reason = decoded.reason or "invalid"
                outputs.append(
                    (
                        DEAD_LETTERS,
                        _dead_letter(payload, reason, topic, partition, message.offset),
                    )
                )
                continue
            event_time = int(decoded.event["event_time"])
            # Lateness is judged against the partition's own mark (or what
            # this reader has passed on, if later), moved message by message.
            mark = watermark.lateness_reference_ms(partition)
            if mark is not None and event_time <= mark - self._lateness:
                too_late += 1
                reason = (
                    f"late: event time {event_time} is {mark - event_time} ms behind "
                    f"the watermark {mark} (allowed lateness {self._lateness} ms)"
                )
                outputs.append(
                    (
                        DEAD_LETTERS,
                        _dead_letter(payload, reason, topic, partition, message.offset),
                    )
                )
                continue
            if mark is not None and event_time < mark:
                late_allowed += 1
            records_ok.append(decoded.event)
            published.append(int(message.timestamp))
            newest = event_time if newest is None else max(newest, event_time)
            watermark.advance(partition, event_time - self._slack)
        self.read.inc(read)
        self.invalid.inc(invalid + too_late)
        self.too_late.inc(too_late)
        self.late_allowed.inc(late_allowed)
        self.valid.inc(len(records_ok))
        if records_ok:
            table = pa.Table.from_pylist(records_ok, schema=EVENT_SCHEMA)
            table = table.append_column(
                STREAM_EVENT_SCHEMA.field("published_ms"),
                pa.array(published, pa.int64()),
            )
            earliest = min(int(r["event_time"]) for r in records_ok)
            batch = EventBatch(source, table.cast(STREAM_EVENT_SCHEMA))
            outputs.append(
                beam.window.TimestampedValue((EVENTS, batch), ms_to_timestamp(earliest))
            )
        # Progress mark for the offset committer (.offsets): what was read
        # up to where, and how new it was.
        progress = newest if newest is not None else watermark.mark_ms()
        if read and progress is not None:
            outputs.append((MARKS, (source, (next_offset, int(progress)))))
        return outputs, claimed_all


def one_batch_per_call(outputs: list[Any]) -> list[Any]:
    """A call's outputs with its event batches merged into one, and one
    progress mark per partition (its last).

    Nothing of a call leaves before its bundle ends, so merging costs no
    freshness, while every stage after the reader pays per element (a state
    read, a bundle of Arrow work), not per event.
    """
    batches: list[EventBatch] = []
    earliest: Timestamp | None = None
    marks: dict[str, tuple[int, int]] = {}
    rest: list[Any] = []
    for output in outputs:
        if isinstance(output, beam.window.TimestampedValue):
            batches.append(output.value[1])
            if earliest is None or output.timestamp < earliest:
                earliest = output.timestamp
        elif output[0] == MARKS:
            source, (offset, newest) = output[1]
            _, seen = marks.get(source, (offset, newest))
            marks[source] = (offset, max(seen, newest))
        else:
            rest.append(output)
    if batches:
        sources = {b.source for b in batches}
        merged = EventBatch(
            source=(
                sources.pop()
                if len(sources) == 1
                else batches[0].source.rsplit("/", 1)[0]
            ),
            events=pa.concat_tables([b.events for b in batches]).combine_chunks(),
        )
        rest.append(beam.window.TimestampedValue((EVENTS, merged), earliest))
    rest += [(MARKS, (source, mark)) for source, mark in marks.items()]
    return rest


def _dead_letter(
    payload: bytes, reason: str, topic: str, partition: int, offset: int
) -> str:
    """The dead-letter line of a message, whole (the publisher fits it to
    its topic: :class:`pipelines.streaming.publish.PublishDeadLettersFn`)."""
    letter = DeadLetter(
        source=topic,
        partition=partition,
        offset=int(offset),
        reason=reason,
        payload=payload,
    )
    return letter.to_json()


class StartOf(beam.DoFn):  # type: ignore[misc]
    """A topic -> its readers (:class:`TopicRead`): every partition from the
    beginning (replay: the state is rebuilt from the events) or from the
    group's committed offsets (runners whose checkpoints restore the state);
    one reader per partition, or one for them all."""

    def __init__(
        self,
        settings: KafkaSettings,
        group_id: str,
        from_committed: bool,
        one_reader: bool,
    ) -> None:
        self._settings = settings
        self._group_id = group_id
        self._from_committed = from_committed
        self._one_reader = one_reader

    def process(self, topic: str) -> Iterator[TopicRead]:
        """Ask the cluster for the partitions and the group's offsets."""
        from kafka import TopicPartition

        with self._settings.consumer(
            group_id=self._group_id, enable_auto_commit=False
        ) as consumer:
            starts = []
            for partition in topic_partitions(consumer, topic):
                committed = None
                if self._from_committed:
                    committed = consumer.committed(TopicPartition(topic, partition))
                starts.append((partition, committed or 0))
        if self._one_reader:
            yield TopicRead(topic, tuple(starts))
            return
        # Partitions are numbered 0..n-1: reader p reads partition p, and a
        # partition added later joins reader (partition % n).
        for partition, start in starts:
            yield TopicRead(topic, ((partition, start),), len(starts), partition)


def one_reader(options: PipelineOptions) -> bool:
    """Whether the runner needs the whole topic in one reader
    (:data:`ONE_READER_RUNNERS`)."""
    return runner_name(options) in ONE_READER_RUNNERS


class _SplitByKind(beam.DoFn):  # type: ignore[misc]
    """``(kind, value)`` -> the output named by kind.

    The splittable DoFn keeps a single output, so its watermark estimate
    describes one PCollection.
    """

    def process(self, element: tuple[str, Any]) -> Iterator[Any]:
        kind, value = element
        yield value if kind == EVENTS else pvalue.TaggedOutput(kind, value)


class ReadEventStream(beam.PTransform):  # type: ignore[misc]
    """Event batches (main), dead-letter lines (``dead_letters``) and progress
    marks (``marks``, see :mod:`.offsets`) from a topic.

    ``one_reader``: read every partition in one restriction (None: as the
    pipeline's runner needs, :func:`one_reader`).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        *,
        group_id: str,
        out_of_orderness_ms: int,
        allowed_lateness_ms: int,
        idle_seconds: float | None = None,
        now_ms: int | None = None,
        from_committed: bool = False,
        one_reader: bool | None = None,
    ) -> None:
        super().__init__()
        self._topic = topic
        self._settings = settings
        self._group_id = group_id
        self._from_committed = from_committed
        self._one_reader = one_reader
        self._reader = ReadTopicFn(
            settings,
            group_id,
            out_of_orderness_ms=out_of_orderness_ms,
            allowed_lateness_ms=allowed_lateness_ms,
            idle_seconds=idle_seconds,
            now_ms=now_ms,
        )

    def expand(self, pbegin: beam.pvalue.PBegin) -> Any:
        """The topic's readers and their start offsets, then the splittable read."""
        single = self._one_reader
        if single is None:
            single = one_reader(pbegin.pipeline.options)
        start = StartOf(self._settings, self._group_id, self._from_committed, single)
        return (
            pbegin
            | "Topic" >> beam.Create([self._topic])
            | "Start" >> beam.ParDo(start)
            | "Read" >> beam.ParDo(self._reader)
            | "ByKind"
            >> beam.ParDo(_SplitByKind()).with_outputs(DEAD_LETTERS, MARKS, main=EVENTS)
        )
