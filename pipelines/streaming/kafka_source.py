"""``ReadEventStream``: an unbounded Kafka read as a splittable DoFn (kafka-python).

One restriction per partition, an :class:`OffsetRange` ``[start, end)`` whose
end is "never" (or, in bounded runs, the offset reached when the partition has
been idle for ``idle_seconds``). Each ``process`` call polls once, claims the
offsets it read, and defers the rest of the range (``defer_remainder``): the
runner checkpoints the restriction between calls, which is how an unbounded
source runs on the DirectRunner, Flink and Dataflow alike.

Each poll is decoded and validated (:func:`features.events.decode_event`)
right here, because the watermark is event time: the partition's watermark is
``max event time seen - out_of_orderness`` (a manual watermark estimator),
never moving back. An event is

- *on time* when its time is at or after the watermark;
- *late but allowed* when it is less than ``allowed_lateness`` behind the
  watermark: it goes on with the others and is incorporated (the stateful
  stages keep their results open that long; see :mod:`.user_state`);
- *too late* when it is ``allowed_lateness`` or more behind: a dead letter
  with reason ``late: ...`` (never silently dropped).

Output: per poll, one :class:`EventBatch` (valid events, in EVENT_SCHEMA plus
the Kafka record time ``published_ms``), timestamped with its earliest event
time, so it holds the downstream watermark until it is processed; and dead
letters (tagged ``dead_letters``) as JSON lines.

Offsets: the consumer never auto-commits. What is committed, and when, is the
job's durability rule (:mod:`.offsets`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import apache_beam as beam
import pyarrow as pa
from apache_beam import pvalue
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.metrics import Metrics
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.utils.timestamp import Duration, Timestamp

from features.events import EVENT_SCHEMA, decode_event, now_ms
from features.kafka import KafkaSettings
from pipelines.beam.validate import dead_letter_line
from pipelines.streaming.tables import STREAM_EVENT_SCHEMA

METRICS_NAMESPACE: Final = "gem.stream"
DEAD_LETTERS: Final = "dead_letters"
MARKS: Final = "marks"
EVENTS: Final = "events"
NEVER: Final = sys.maxsize
POLL_MS: Final = 100
MAX_RECORDS: Final = 20_000
CALL_SECONDS: Final = 2.0
PROBE_TIMEOUT_MS: Final = 3_000
PROBE_SLOW_SECONDS: Final = 1.5
"""Bounded runs: a broker round trip slower than this (a fetch long-poll ahead
of it on the connection takes up to 0.5 s) counts as the broker being quiet
(see :meth:`ReadPartitionFn._idle_confirmed_now`) ..."""
MAX_SLOW_PROBES: Final = 3
"""... up to this many times in a row: a broker that is always that slow (an
overloaded machine) must not keep a bounded run from ever finishing."""
MIN_TIMESTAMP_MS: Final = -(2**62) // 1000


@dataclass(frozen=True)
class PartitionRead:
    """What to read: a topic partition from an offset (the element of the SDF)."""

    topic: str
    partition: int
    start: int


@dataclass(frozen=True)
class EventBatch:
    """Valid events of one poll of one partition.

    Attributes:
        source: ``topic/partition``.
        first_offset: Kafka offset of the first message of the poll.
        next_offset: offset after the last message of the poll.
        events: STREAM_EVENT_SCHEMA rows (EVENT_SCHEMA + ``published_ms``).
    """

    source: str
    first_offset: int
    next_offset: int
    events: pa.Table


class _PartitionRestrictions(RestrictionProvider):  # type: ignore[misc]
    """``[start, NEVER)`` per partition; never split (one reader per partition)."""

    def initial_restriction(self, element: PartitionRead) -> OffsetRange:
        return OffsetRange(element.start, NEVER)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element: PartitionRead, restriction: OffsetRange) -> int:
        return 1  # unknown; every partition weighs the same

    def split(self, element: PartitionRead, restriction: OffsetRange) -> Iterator[Any]:
        yield restriction


_RESTRICTION = beam.DoFn.RestrictionParam(_PartitionRestrictions())
_WATERMARK = beam.DoFn.WatermarkEstimatorParam(
    ManualWatermarkEstimator.default_provider()
)


class _Consumers:
    """One kafka-python consumer per (topic, partition), kept across calls."""

    def __init__(self, settings: KafkaSettings, group_id: str) -> None:
        self._settings = settings
        self._group_id = group_id
        self._open: dict[tuple[str, int], Any] = {}

    def at(self, topic: str, partition: int, offset: int) -> Any:
        """The partition's consumer, positioned at ``offset``."""
        from kafka import KafkaConsumer, TopicPartition

        tp = TopicPartition(topic, partition)
        consumer = self._open.get((topic, partition))
        if consumer is None:
            consumer = KafkaConsumer(
                **self._settings.consumer_config(
                    group_id=self._group_id,
                    enable_auto_commit=False,
                    max_partition_fetch_bytes=8 * 1024 * 1024,
                )
            )
            consumer.assign([tp])
            consumer.seek(tp, offset)
            self._open[(topic, partition)] = consumer
        elif consumer.position(tp) != offset:
            consumer.seek(tp, offset)
        return consumer

    def close(self) -> None:
        for consumer in self._open.values():
            consumer.close()
        self._open.clear()


class ReadPartitionFn(beam.DoFn):  # type: ignore[misc]
    """The splittable DoFn: poll, validate, classify lateness, set the watermark.

    Args:
        settings: the cluster.
        group_id: consumer group (offsets are committed by :mod:`.offsets`).
        out_of_orderness_ms: how far behind the newest event time the
            watermark trails (events may arrive this much out of order and
            still be on time).
        allowed_lateness_ms: how far behind the watermark an event may still
            be incorporated.
        idle_seconds: bounded runs: stop a partition after this long without
            a message while the broker answered (None: read forever).
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
        self._consumers: _Consumers | None = None
        # Bounded runs: seconds spent polling a partition since its last
        # message. Only polling time counts: between two calls of a partition
        # the runner runs the others (and the stages after), which says
        # nothing about whether the topic is idle.
        self._quiet_for: dict[tuple[str, int], float] = {}
        self._idle_confirmed: set[tuple[str, int]] = set()
        self._slow_probes: dict[tuple[str, int], int] = {}
        self.read = Metrics.counter(METRICS_NAMESPACE, "events_read")
        self.valid = Metrics.counter(METRICS_NAMESPACE, "events_valid")
        self.invalid = Metrics.counter(METRICS_NAMESPACE, "events_dead_lettered")
        self.late_allowed = Metrics.counter(METRICS_NAMESPACE, "events_late_allowed")
        self.too_late = Metrics.counter(METRICS_NAMESPACE, "events_too_late")
        self.broker_quiet = Metrics.counter(METRICS_NAMESPACE, "broker_quiet_probes")

    def setup(self) -> None:
        """Consumers are opened lazily, one per partition."""
        self._consumers = _Consumers(self._settings, self._group_id)

    def teardown(self) -> None:
        """Close the consumers."""
        if self._consumers is not None:
            self._consumers.close()

    @beam.DoFn.unbounded_per_element()
    def process(
        self,
        element: PartitionRead,
        tracker: OffsetRestrictionTracker = _RESTRICTION,
        watermark: ManualWatermarkEstimator = _WATERMARK,
    ) -> Iterator[Any]:
        """Poll for up to ``CALL_SECONDS``, then hand the rest back.

        Two runner protocols end a call: portable runners (FnApiRunner,
        Flink, Dataflow) take ``defer_remainder``; the DirectRunner's
        streaming mode splits the restriction from outside after a second,
        which shows as a finite range end (or a failed claim).
        """
        assert self._consumers is not None
        key = (element.topic, element.partition)
        started = time.monotonic()
        consumer = self._consumers.at(
            element.topic, element.partition, tracker.current_restriction().start
        )
        while True:
            if tracker.current_restriction().stop != NEVER:
                return  # checkpointed by the runner: resumed later
            outputs, claimed_all = self._poll(element, consumer, tracker, watermark)
            yield from outputs
            if not claimed_all:
                return
            quiet = self._quiet_for.get(key, 0.0)
            if self._idle_seconds is not None and quiet > self._idle_seconds:
                if not self._idle_confirmed_now(consumer, key):
                    # Idle time counts only from a moment the broker answered.
                    self._quiet_for[key] = 0.0
                    continue
                # Bounded run: the partition is finished. Claiming the last
                # offset of the range completes it; the watermark then goes
                # to the end of time and every timer downstream fires.
                tracker.try_claim(NEVER - 1)
                return
            if time.monotonic() - started > CALL_SECONDS:
                tracker.defer_remainder(Duration.of(0))
                return

    def _idle_confirmed_now(self, consumer: Any, key: tuple[str, int]) -> bool:
        """Bounded runs: is the partition's idleness the topic's, not the broker's?

        An empty poll looks the same whether the topic is quiet or the broker
        is down (paused, restarting, unreachable). So a partition is finished
        only after a full idle period that *began* with a broker round trip
        (ListOffsets) coming back and ends with another: the first probe of
        an idle partition only starts that period, counted from its answer.
        A broker that does not answer (or answers late, as a paused one does
        once resumed) restarts it, so producers that were blocked by the
        outage get a full idle period to deliver what they buffered.
        """
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        started = time.monotonic()
        try:
            consumer.end_offsets([TopicPartition(*key)], timeout_ms=PROBE_TIMEOUT_MS)
        except KafkaError:
            self.broker_quiet.inc()
            self._idle_confirmed.discard(key)
            return False
        slow = time.monotonic() - started > PROBE_SLOW_SECONDS
        if slow and self._slow_probes.get(key, 0) < MAX_SLOW_PROBES:
            self._slow_probes[key] = self._slow_probes.get(key, 0) + 1
            self.broker_quiet.inc()
            self._idle_confirmed.discard(key)
            return False
        if not slow:
            self._slow_probes.pop(key, None)
        if key not in self._idle_confirmed:
            self._idle_confirmed.add(key)
            return False
        return True

    def _poll(
        self,
        element: PartitionRead,
        consumer: Any,
        tracker: OffsetRestrictionTracker,
        watermark: ManualWatermarkEstimator,
    ) -> tuple[list[Any], bool]:
        """One poll: claim, validate, classify lateness, set the watermark.

        Returns:
            The outputs, and False when a claim failed (the call must end).
        """
        from kafka import TopicPartition

        key = (element.topic, element.partition)
        polled = time.monotonic()
        records = consumer.poll(timeout_ms=POLL_MS, max_records=MAX_RECORDS)
        messages = records.get(TopicPartition(*key), [])
        if not messages:
            self._quiet_for[key] = (
                self._quiet_for.get(key, 0.0) + time.monotonic() - polled
            )
            return [], True
        self._quiet_for[key] = 0.0
        self._idle_confirmed.discard(key)
        current = watermark.current_watermark()
        mark = None if current is None else current.micros // 1000
        if mark is not None and mark < MIN_TIMESTAMP_MS:
            mark = None
        previous = mark
        outputs: list[Any] = []
        records_ok: list[dict[str, Any]] = []
        published: list[int] = []
        clock = self._now if self._now is not None else now_ms()
        source = f"{element.topic}/{element.partition}"
        newest = None
        late_allowed = too_late = invalid = read = 0
        claimed_all = True
        next_offset = messages[0].offset
        for message in messages:
            if not tracker.try_claim(message.offset):
                claimed_all = False
                break
            read += 1
            next_offset = message.offset + 1
            payload = message.value or b""
            decoded = decode_event(payload, now=clock)
            if decoded.event is None:
                invalid += 1
                outputs.append(
                    (
                        DEAD_LETTERS,
                        _dead_letter(
                            payload, decoded.reason or "invalid", source, message
                        ),
                    )
                )
                continue
            event_time = int(decoded.event["event_time"])
            if mark is not None and event_time <= mark - self._lateness:
                too_late += 1
                reason = (
                    f"late: event time {event_time} is {mark - event_time} ms behind "
                    f"the watermark {mark} (allowed lateness {self._lateness} ms)"
                )
                outputs.append(
                    (DEAD_LETTERS, _dead_letter(payload, reason, source, message))
                )
                continue
            if mark is not None and event_time < mark:
                late_allowed += 1
            records_ok.append(decoded.event)
            published.append(int(message.timestamp))
            newest = event_time if newest is None else max(newest, event_time)
            # The watermark moves message by message: lateness is judged
            # against everything read before, not per poll.
            if mark is None or event_time - self._slack > mark:
                mark = event_time - self._slack
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
            batch = EventBatch(
                source, messages[0].offset, next_offset, table.cast(STREAM_EVENT_SCHEMA)
            )
            outputs.append(
                beam.window.TimestampedValue(
                    (EVENTS, batch), Timestamp(micros=earliest * 1000)
                )
            )
        # Progress mark for the offset committer (.offsets): what was read
        # up to where, and how new it was.
        progress = newest if newest is not None else mark
        if read and progress is not None:
            outputs.append((MARKS, (source, (next_offset, int(progress)))))
        if mark is not None and (previous is None or mark > previous):
            watermark.set_watermark(Timestamp(micros=mark * 1000))
        return outputs, claimed_all


def _dead_letter(payload: bytes, reason: str, source: str, message: Any) -> str:
    """A dead-letter line with where the message came from."""
    try:
        record = json.loads(payload)
    except ValueError:
        record = None
    line = json.loads(
        dead_letter_line(record if isinstance(record, dict) else None, payload, reason)
    )
    line["source"] = source
    line["offset"] = int(message.offset)
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False)


class PartitionsOf(beam.DoFn):  # type: ignore[misc]
    """A topic -> one :class:`PartitionRead` per partition, from the beginning
    (replay: the state is rebuilt from the events) or from the group's
    committed offsets (runners whose checkpoints restore the state)."""

    def __init__(
        self, settings: KafkaSettings, group_id: str, from_committed: bool
    ) -> None:
        self._settings = settings
        self._group_id = group_id
        self._from_committed = from_committed

    def process(self, topic: str) -> Iterator[PartitionRead]:
        """Ask the cluster for the partitions and the group's offsets."""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(
            **self._settings.consumer_config(
                group_id=self._group_id, enable_auto_commit=False
            )
        )
        try:
            partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                raise ValueError(f"Kafka topic {topic!r} does not exist")
            for partition in sorted(partitions):
                committed = None
                if self._from_committed:
                    committed = consumer.committed(TopicPartition(topic, partition))
                yield PartitionRead(topic, partition, committed or 0)
        finally:
            consumer.close()


class _SplitByKind(beam.DoFn):  # type: ignore[misc]
    """``(kind, value)`` -> the output named by kind.

    The splittable DoFn has a single output: the DirectRunner's streaming
    SDF expansion loses the watermarks of a multi-output one.
    """

    def process(self, element: tuple[str, Any]) -> Iterator[Any]:
        kind, value = element
        yield value if kind == EVENTS else pvalue.TaggedOutput(kind, value)


class ReadEventStream(beam.PTransform):  # type: ignore[misc]
    """Event batches (main), dead-letter lines (``dead_letters``) and progress
    marks (``marks``, see :mod:`.offsets`) from a topic."""

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
    ) -> None:
        super().__init__()
        self._settings = settings
        self._topic = topic
        self._group_id = group_id
        self._from_committed = from_committed
        self._reader = ReadPartitionFn(
            settings,
            group_id,
            out_of_orderness_ms=out_of_orderness_ms,
            allowed_lateness_ms=allowed_lateness_ms,
            idle_seconds=idle_seconds,
            now_ms=now_ms,
        )

    def expand(self, pbegin: beam.pvalue.PBegin) -> Any:
        """Partitions, then the splittable read of each."""
        return (
            pbegin
            | "Topic" >> beam.Create([self._topic])
            | "Partitions"
            >> beam.ParDo(
                PartitionsOf(self._settings, self._group_id, self._from_committed)
            )
            | "Read" >> beam.ParDo(self._reader)
            | "ByKind"
            >> beam.ParDo(_SplitByKind()).with_outputs(DEAD_LETTERS, MARKS, main=EVENTS)
        )
