"""Kafka I/O of the feature job, with kafka-python inside DoFns.

Beam's ``ReadFromKafka`` / ``WriteToKafka`` are cross-language transforms
that need a Java expansion service; plain DoFns work on every runner.

- ``ReadKafkaEvents``: a bounded read of a raw-event topic, one DoFn per
  partition, from the group's committed offset (else the start) up to the end
  offset seen at start; committed at the end. Events published later are the
  next run's (or the streaming job's).
- ``PublishExamples``: per user shard, examples in time order, in messages
  of at most ``--examples-per-message`` examples plus the timeline segments
  they need (:mod:`features.example_messages`), keyed by the shard so one
  user's examples stay in order in one partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Final

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics

from features.arrow_ipc import ipc_to_table, table_to_ipc
from features.example_messages import encode_example_message, message_headers
from features.examples import TIMELINE_SCHEMA
from features.kafka import KafkaSettings
from features.kafka.settings import EVENT_FETCH_BYTES
from features.kafka.topics import topic_partitions
from features.windows import timeline_segments
from pipelines.batch.validate import METRICS_NAMESPACE, RawEvents
from pipelines.beam.kafka_send import KafkaSendFn
from pipelines.core.columns import concat

POLL_MS: Final = 200
BATCH_MESSAGES: Final = 50_000


class ListPartitionsFn(beam.DoFn):  # type: ignore[misc]
    """A topic name -> one ``(topic, partition)`` per partition."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings

    def process(self, topic: str) -> Iterator[tuple[str, int]]:
        """Ask the cluster for the topic's partitions."""
        with self._settings.consumer(group_id=None) as consumer:
            partitions = topic_partitions(consumer, topic)
        for partition in partitions:
            yield topic, partition


class ReadPartitionFn(beam.DoFn):  # type: ignore[misc]
    """Read one partition (bounded, see the module docstring) in batches."""

    def __init__(self, settings: KafkaSettings, group_id: str) -> None:
        self._settings = settings
        self._group_id = group_id

    def process(self, element: tuple[str, int]) -> Iterator[RawEvents]:
        """Yield :class:`RawEvents` batches of message values; commit at the end."""
        from kafka import TopicPartition

        topic, partition = element
        tp = TopicPartition(topic, partition)
        with self._settings.consumer(
            group_id=self._group_id,
            enable_auto_commit=False,
            max_partition_fetch_bytes=EVENT_FETCH_BYTES,
        ) as consumer:
            consumer.assign([tp])
            committed = consumer.committed(tp)
            if committed is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, committed)
            end = consumer.end_offsets([tp])[tp]
            batch: list[bytes] = []
            offsets: list[int] = []
            # The position, not the last offset seen, decides: transaction
            # markers and compacted gaps hold offsets no record is read at
            # (which is also why each message keeps its own offset).
            while consumer.position(tp) < end:
                records = consumer.poll(timeout_ms=POLL_MS, max_records=10_000)
                for message in records.get(tp, ()):
                    batch.append(message.value or b"")
                    offsets.append(message.offset)
                    if len(batch) >= BATCH_MESSAGES:
                        yield _message_batch(topic, partition, batch, offsets)
                        batch, offsets = [], []
            if batch:
                yield _message_batch(topic, partition, batch, offsets)
            consumer.commit()


def _message_batch(
    topic: str, partition: int, values: list[bytes], offsets: list[int]
) -> RawEvents:
    return RawEvents(
        topic,
        offsets[0],
        payloads=tuple(values),
        offsets=tuple(offsets),
        partition=partition,
    )


class ReadKafkaEvents(beam.PTransform):  # type: ignore[misc]
    """Raw event batches (:class:`RawEvents`) from a Kafka topic, bounded."""

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        *,
        group_id: str,
    ) -> None:
        super().__init__()
        self._topic = topic
        self._list_partitions = ListPartitionsFn(settings)
        self._read_partition = ReadPartitionFn(settings, group_id)

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        """Partitions, spread over workers, each read by one DoFn call."""
        return (
            pbegin
            | "Topic" >> beam.Create([self._topic])
            | "ListPartitions" >> beam.ParDo(self._list_partitions)
            | "SpreadPartitions" >> beam.Reshuffle()
            | "ReadPartitions"
            >> beam.ParDo(self._read_partition).with_output_types(RawEvents)
        )


def message_batches(
    examples: pa.Table, timelines: pa.Table, max_seq_len: int, per_message: int
) -> Iterator[tuple[pa.Table, pa.Table]]:
    """A shard's examples in time order, cut into (examples, segments) messages."""
    ordered = examples.sort_by(
        [("event_time", "ascending"), ("example_id", "ascending")]
    )
    for start in range(0, ordered.num_rows, per_message):
        chunk = ordered.slice(start, per_message)
        yield chunk, timeline_segments(chunk, timelines, max_seq_len)


class PublishShardFn(KafkaSendFn):
    """Publish one shard's examples (see the module docstring)."""

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        max_seq_len: int,
        per_message: int,
    ) -> None:
        super().__init__(settings, topic)
        self._max_seq_len = max_seq_len
        self._per_message = per_message
        self.messages = Metrics.counter(METRICS_NAMESPACE, "messages_published")
        self.examples = Metrics.counter(METRICS_NAMESPACE, "examples_published")

    def setup(self) -> None:
        """One producer per DoFn instance (reused across bundles)."""
        self.open_producer()

    def process(self, element: tuple[int, Iterable[tuple[str, bytes]]]) -> None:
        """Send the shard's messages, keyed by shard."""
        shard, pieces = element
        examples = [ipc_to_table(d) for tag, d in pieces if tag == "examples"]
        timelines = [ipc_to_table(d) for tag, d in pieces if tag == "timelines"]
        if not examples:
            return
        table = pa.concat_tables(examples)
        key = str(shard).encode()
        for chunk, segments in message_batches(
            table,
            concat(timelines, TIMELINE_SCHEMA),
            self._max_seq_len,
            self._per_message,
        ):
            self._producer.send(
                self._topic,
                key=key,
                value=encode_example_message(
                    chunk, segments, max_seq_len=self._max_seq_len
                ),
                headers=message_headers(chunk),
            )
            self.messages.inc()
            self.examples.inc(chunk.num_rows)


class PublishExamples(beam.PTransform):  # type: ignore[misc]
    """``(examples, timelines)`` keyed by user shard -> Kafka example messages."""

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        *,
        max_seq_len: int,
        examples_per_message: int,
    ) -> None:
        super().__init__()
        self._publish = PublishShardFn(
            settings, topic, max_seq_len, examples_per_message
        )

    def expand(self, inputs: tuple[Any, Any]) -> beam.PCollection:
        """Bring each shard's examples and timelines together, then publish."""
        examples, timelines = inputs

        def tagged(tag: str) -> Any:
            return lambda element: (element[0], (tag, table_to_ipc(element[1])))

        typed = tuple[int, tuple[str, bytes]]
        return (
            (
                examples
                | "TagExamples"
                >> beam.Map(tagged("examples")).with_output_types(typed),
                timelines
                | "TagTimelines"
                >> beam.Map(tagged("timelines")).with_output_types(typed),
            )
            | "Together" >> beam.Flatten()
            | "ByShard" >> beam.GroupByKey()
            | "Publish" >> beam.ParDo(self._publish)
        )
