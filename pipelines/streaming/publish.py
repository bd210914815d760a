"""The job's Kafka outputs: example messages (exactly once) and dead letters.

Example messages are the contract's codec (:mod:`features.example_messages`),
keyed by user shard, and the shard decides the partition
(:func:`examples_partition`), so one user's examples stay in order in one
partition.

Exactly once, without reading the examples topic (decision 0033): the
messages of a release at event time ``T`` reach this stage with timestamp
``T`` (:mod:`.user_state` emits one element per due time). The stage is
keyed by examples-topic partition and holds them in state; once the
watermark passes ``T`` (a timer at ``T + 1`` ms) every release up to ``T``
of the partition is here, and at the end of the bundle they go out in ONE
Kafka transaction with the partition's release horizon ``T``
(:mod:`.example_transactions`). A restarted job (SIGKILL of the job, a
worker or the broker; on Prism it replays the events topic and recomputes
every release) reads the horizons at start-up and drops the releases at or
below them: those are on the topic, the others are not. Readers of the
topic read committed records only (``isolation_level="read_committed"``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.coders import BytesCoder, TupleCoder, VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer

from features.deadletter import DeadLetter
from features.example_messages import encode_example_message, message_headers
from features.kafka import KafkaSettings
from features.kafka.topics import RECORD_OVERHEAD_BYTES, max_message_bytes
from pipelines.beam.kafka_send import KafkaSendFn
from pipelines.streaming.config import METRICS_NAMESPACE
from pipelines.streaming.event_timers import fired_ms, ms_to_timestamp
from pipelines.streaming.example_transactions import (
    Message,
    PartitionPublisher,
    partition_publisher,
)
from pipelines.streaming.offsets import Mark
from pipelines.streaming.tables import state_table

Release = tuple[int, bytes, bytes]
"""``(key, examples IPC, segments IPC)``: one message's worth of a release."""
Held = tuple[int, int, bytes, bytes]
"""A release waiting for its timer: ``(event time ms, key, examples, segments)``."""


def examples_partition(key: int, partitions: int) -> int:
    """The partition of the releases of key ``key`` (a user shard): shards
    spread evenly over the partitions (a hash of 4 shard keys can leave
    half of 4 partitions empty)."""
    return key % partitions


def topic_partition_count(settings: KafkaSettings, topic: str) -> int:
    """How many partitions ``topic`` has (it must exist)."""
    from features.kafka.topics import topic_partitions

    with settings.consumer(group_id=None) as consumer:
        return len(topic_partitions(consumer, topic))


# State and timers (module-level: Beam finds them in the defaults).
_HELD = BagStateSpec(
    "held", TupleCoder([VarIntCoder(), VarIntCoder(), BytesCoder(), BytesCoder()])
)
_HELD_PARAM = beam.DoFn.StateParam(_HELD)
_PUBLISH = TimerSpec("publish", TimeDomain.WATERMARK)
_PUBLISH_PARAM = beam.DoFn.TimerParam(_PUBLISH)


class PublishExampleMessagesFn(beam.DoFn):  # type: ignore[misc]
    """``(partition, release)`` -> the partition's releases, published in
    one transaction per partition and bundle (see the module docstring)."""

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        *,
        group: str,
        partitions: int,
        max_seq_len: int,
    ) -> None:
        self._settings = settings
        self._topic = topic
        self._group = group
        self._partitions = partitions
        self._max_seq_len = max_seq_len
        # This bundle's transactions: partition -> (messages, horizon).
        self._pending: dict[int, tuple[list[Message], int]] = {}
        self.messages = Metrics.counter(METRICS_NAMESPACE, "messages_published")
        self.examples = Metrics.counter(METRICS_NAMESPACE, "examples_published")
        self.skipped = Metrics.counter(METRICS_NAMESPACE, "examples_already_published")
        self.transactions = Metrics.counter(METRICS_NAMESPACE, "example_transactions")
        self.horizon_reads = Metrics.counter(METRICS_NAMESPACE, "horizon_reads")

    def start_bundle(self) -> None:
        """No transaction pending yet."""
        self._pending = {}

    def process(
        self,
        element: tuple[int, Release],
        timestamp: Any = beam.DoFn.TimestampParam,
        held: Any = _HELD_PARAM,
        publish: Any = _PUBLISH_PARAM,
    ) -> Iterator[Any]:
        """Hold the release until the watermark passes its time."""
        _, (key, examples, segments) = element
        at = fired_ms(timestamp)
        held.add((at, key, examples, segments))
        publish.set(ms_to_timestamp(at + 1), dynamic_timer_tag=str(at + 1))
        yield from ()

    @on_timer(_PUBLISH)
    def publish(
        self,
        key: Any = beam.DoFn.KeyParam,
        fire_at: Any = beam.DoFn.TimestampParam,
        held: Any = _HELD_PARAM,
    ) -> None:
        """Move the releases before the timer into the bundle's transaction
        of the partition, without those at or below its horizon."""
        partition, fire = int(key), fired_ms(fire_at)
        waiting: list[Held] = list(held.read())
        due = sorted((r for r in waiting if r[0] < fire), key=lambda r: r[:2])
        if not due:
            return
        held.clear()
        for release in waiting:
            if release[0] >= fire:
                held.add(release)
        publisher = self._publisher(partition)
        messages, horizon = self._pending.get(partition, ([], publisher.horizon))
        for at, message_key, examples_data, segments_data in due:
            examples = state_table(examples_data)
            if at <= publisher.horizon:
                self.skipped.inc(examples.num_rows)
                continue
            messages.append(
                Message(
                    at=at,
                    key=str(message_key).encode(),
                    value=encode_example_message(
                        examples,
                        state_table(segments_data),
                        max_seq_len=self._max_seq_len,
                    ),
                    headers=message_headers(examples),
                    examples=examples.num_rows,
                )
            )
        if messages:
            self._pending[partition] = (messages, max(horizon, fire - 1))

    def _publisher(self, partition: int) -> PartitionPublisher:
        publisher = partition_publisher(
            self._settings, self._topic, self._group, partition, self._partitions
        )
        if not publisher.started:
            publisher.start()
            self.horizon_reads.inc()
        return publisher

    def finish_bundle(self) -> None:
        """Commit each partition's transaction before the bundle commits."""
        for partition, (messages, horizon) in sorted(self._pending.items()):
            sent = self._publisher(partition).publish(messages, horizon)
            if sent:
                self.transactions.inc()
                self.messages.inc(len(sent))
                self.examples.inc(sum(m.examples for m in sent))
            self.skipped.inc(
                sum(m.examples for m in messages) - sum(m.examples for m in sent)
            )
        self._pending = {}


class PublishExamples(beam.PTransform):  # type: ignore[misc]
    """Releases (:data:`Release`, timestamped at their event time) -> the
    examples topic, exactly once (see the module docstring). Its output is
    empty: the offset committer reads it for its watermark (:mod:`.offsets`)."""

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        *,
        group: str,
        partitions: int,
        max_seq_len: int,
    ) -> None:
        super().__init__()
        self._partitions = partitions
        self._publish = PublishExampleMessagesFn(
            settings,
            topic,
            group=group,
            partitions=partitions,
            max_seq_len=max_seq_len,
        )

    def expand(self, releases: beam.PCollection) -> beam.PCollection:
        """Key by partition, then hold and publish."""
        partitions = self._partitions
        return (
            releases
            | "ByExamplesPartition"
            >> beam.Map(
                lambda r: (examples_partition(r[0], partitions), r)
            ).with_output_types(tuple[int, tuple[int, bytes, bytes]])
            | "PublishInTransactions"
            >> beam.ParDo(self._publish).with_output_types(Mark)
        )


class PublishDeadLettersFn(KafkaSendFn):
    """Dead-letter JSON lines -> their Kafka topic, each whole when the topic
    takes it, else with its payload cut to fit (``truncated``, with the whole
    payload's length and hash): never dropped, never refused by the broker."""

    def __init__(self, settings: KafkaSettings, topic: str) -> None:
        super().__init__(settings, topic)
        self._max_line_bytes = 0
        self.count = Metrics.counter(METRICS_NAMESPACE, "dead_letters_published")
        self.cut = Metrics.counter(METRICS_NAMESPACE, "dead_letters_truncated")

    def setup(self) -> None:
        """One producer per worker, allowed the topic's largest record."""
        limit = max_message_bytes(self._settings, self._topic)
        self._max_line_bytes = limit - RECORD_OVERHEAD_BYTES
        self.open_producer(enable_idempotence=True, max_request_size=limit)

    def process(self, line: str) -> Iterator[Any]:
        """Send one dead letter."""
        if len(line) > self._max_line_bytes:
            line = DeadLetter.from_json(line).to_json_within(self._max_line_bytes)
            self.cut.inc()
        self._producer.send(self._topic, value=line.encode())
        self.count.inc()
        yield from ()
