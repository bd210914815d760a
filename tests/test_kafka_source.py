"""The trainer's Kafka source merges partitions by event time.

Each partition is a user shard in event-time order; the source queues
records earliest ``event-time-ms`` first across partitions, waits for a
partition only while it has records on the broker not fetched yet, and
never for one that is caught up.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from features.example_messages import encode_example_message, message_headers
from features.kafka import KafkaSettings
from features.windows import timeline_segments
from pipelines.core.reference import ReferenceOutput
from tests.example_feed import MAX_LEN, PER_MESSAGE, tiny_reference
from trainer.data.kafka_source import Item, KafkaSource


def time_ordered_chunks(reference: ReferenceOutput, count: int) -> list[pa.Table]:
    """``count`` consecutive slices of the examples sorted by event time."""
    ordered = reference.examples.sort_by("event_time")
    return [ordered.slice(i * PER_MESSAGE, PER_MESSAGE) for i in range(count)]


def send(
    settings: KafkaSettings,
    topic: str,
    placed: list[tuple[int, pa.Table]],
    reference: ReferenceOutput,
) -> None:
    """Publish each (partition, examples) in the list's order, stamped."""
    producer = settings.producer(acks="all", max_request_size=16 * 1024 * 1024)
    for partition, chunk in placed:
        segments = timeline_segments(chunk, reference.timelines, MAX_LEN)
        producer.send(
            topic,
            value=encode_example_message(chunk, segments, max_seq_len=MAX_LEN),
            partition=partition,
            headers=message_headers(chunk),
        )
    producer.flush()
    producer.close()


def take(source: KafkaSource, count: int, deadline_s: float = 60) -> list[Item]:
    items: list[Item] = []
    deadline = time.monotonic() + deadline_s
    while len(items) < count:
        assert time.monotonic() < deadline, f"{len(items)} of {count} records"
        item = source.next(timeout=0.2)
        if item is not None:
            items.append(item)
            source.mark(item.partition, item.offset + 1)
        source.iteration_done()  # as a training loop does, idle or not
    return items


def earliest(item: Item) -> int:
    column = item.decoded.examples.column("event_time").cast(pa.int64())
    value: int = pc.min(column).as_py()
    return value


def test_a_backlog_is_read_in_event_time_order_across_partitions(
    kafka_settings: KafkaSettings, kafka_topic: Callable[[int], str]
) -> None:
    reference = tiny_reference()
    chunks = time_ordered_chunks(reference, 12)
    topic = kafka_topic(3)
    # Chunk i goes to partition i % 3, published partition after partition:
    # read in fetch order, the trainer would see time jump back twice.
    placed = sorted(enumerate(chunks), key=lambda pair: pair[0] % 3)
    send(kafka_settings, topic, [(i % 3, chunk) for i, chunk in placed], reference)
    source = KafkaSource(
        kafka_settings,
        topic,
        "g-order",
        max_seq_len=MAX_LEN,
        queue_size=2,
        keep_examples=True,
    ).start()
    try:
        items = take(source, len(chunks))
    finally:
        source.close()
    times = [earliest(item) for item in items]
    assert times == sorted(times)
    assert [item.partition for item in items] == [i % 3 for i in range(len(chunks))]


def test_a_caught_up_partition_holds_nothing_back(
    kafka_settings: KafkaSettings, kafka_topic: Callable[[int], str]
) -> None:
    reference = tiny_reference()
    first, later = time_ordered_chunks(reference, 2)
    topic = kafka_topic(2)
    send(kafka_settings, topic, [(0, first)], reference)
    source = KafkaSource(
        kafka_settings,
        topic,
        "g-live",
        max_seq_len=MAX_LEN,
        keep_examples=True,
    ).start()
    try:
        assert take(source, 1)[0].partition == 0
        # Live: partition 1 gets a record, partition 0 has nothing more.
        send(kafka_settings, topic, [(1, later)], reference)
        assert take(source, 1)[0].partition == 1
        waits_after_start = source.merge_waits
        send(kafka_settings, topic, [(0, later)], reference)
        assert take(source, 1)[0].partition == 0
    finally:
        source.close()
    # Only the first fetch (before any partition's end was known) may wait.
    assert source.merge_waits == waits_after_start <= 1
