"""Raw events on Kafka: publish a table of events, read a topic back.

Wire format (see :mod:`features.events`): one UTF-8 JSON event per message,
keyed by user id so that one user's events stay in order within a partition,
with a ``schema-version`` header. Reading validates every message; what fails
becomes a dead letter (:class:`features.deadletter.DeadLetter`: topic,
partition, offset, reason and the message's bytes), and is counted, so
``read == valid + dead letters`` always holds. Its copy on a dead-letter topic
is the message's bytes, cut only when the topic accepts less, with the
letter's fields (the whole message's length and hash among them) in its
headers.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa

from features.deadletter import DeadLetter
from features.events import (
    SCHEMA_VERSION,
    decode_event,
    encode_event_table,
    events_from_records,
)
from features.kafka.settings import EVENT_FETCH_BYTES, KafkaSettings
from features.kafka.topics import RECORD_OVERHEAD_BYTES, max_message_bytes

log = logging.getLogger(__name__)

SCHEMA_HEADER = "schema-version"
CONTENT_TYPE_HEADER = "content-type"
_HEADERS = [
    (SCHEMA_HEADER, str(SCHEMA_VERSION).encode()),
    (CONTENT_TYPE_HEADER, b"application/json"),
]

MAX_EVENT_REQUEST_BYTES: Final = 16 * 1024 * 1024
"""The producer's request limit for raw events (one event is far smaller)."""


@dataclass(frozen=True)
class PublishReport:
    """What :func:`publish_events` sent."""

    messages: int
    bytes: int
    seconds: float

    @property
    def rate(self) -> float:
        """Messages per second actually achieved."""
        return self.messages / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class ConsumeReport:
    """What :func:`read_events` got: valid events, dead letters, and counts."""

    events: pa.Table
    dead_letters: list[DeadLetter]
    messages: int
    bytes: int
    seconds: float
    per_partition: Counter[int] = field(default_factory=Counter)
    out_of_order_users: int = 0

    @property
    def reasons(self) -> Counter[str]:
        """Dead letters counted by reason."""
        return Counter(letter.reason for letter in self.dead_letters)


def publish_events(
    table: pa.Table,
    settings: KafkaSettings,
    topic: str,
    *,
    rate: float | None = None,
    order_by_time: bool = True,
) -> PublishReport:
    """Send every event of ``table`` to ``topic``, optionally at a steady rate.

    Args:
        table: events in :data:`features.events.EVENT_SCHEMA`.
        settings: the cluster.
        topic: destination topic (create it first, with its partition count).
        rate: events per second to pace at; None sends as fast as possible.
        order_by_time: send in event-time order, as a live stream would.

    Returns:
        Counts and the time taken (until every message was acknowledged).
    """
    if order_by_time:
        table = table.sort_by([("event_time", "ascending")])
    payloads = encode_event_table(table)
    keys = [str(u).encode() for u in table.column("user_id").to_pylist()]
    producer = settings.producer(
        throughput=True, max_request_size=MAX_EVENT_REQUEST_BYTES
    )
    start = time.monotonic()
    sent_bytes = 0
    # Pace in small chunks: sleeping per message would cost more than sending.
    chunk = max(1, int(rate // 20)) if rate else len(payloads) or 1
    with producer:
        for begin in range(0, len(payloads), chunk):
            for key, value in zip(
                keys[begin : begin + chunk],
                payloads[begin : begin + chunk],
                strict=True,
            ):
                producer.send(topic, key=key, value=value, headers=_HEADERS)
                sent_bytes += len(value)
            if rate:
                ahead = (begin + chunk) / rate - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
        producer.flush()
    return PublishReport(len(payloads), sent_bytes, time.monotonic() - start)


def publish_raw(
    payloads: Iterable[bytes], settings: KafkaSettings, topic: str, *, key: bytes
) -> int:
    """Send raw message bodies as they are (used to inject malformed input)."""
    count = 0
    with settings.producer() as producer:
        for payload in payloads:
            producer.send(topic, key=key, value=payload, headers=_HEADERS)
            count += 1
        producer.flush()
    return count


def read_events(
    settings: KafkaSettings,
    topic: str,
    *,
    group_id: str,
    max_seconds: float = 300.0,
    dead_letter_topic: str | None = None,
) -> ConsumeReport:
    """Read ``topic`` from the group's committed offsets (else the start) to its end.

    The end is each partition's end offset when the group assigns the consumer
    its partitions: what is published later is left for the next read. The
    offsets consumed are committed to the group.

    Args:
        settings: the cluster.
        topic: topic of raw events.
        group_id: consumer group; offsets are committed to it at the end.
        max_seconds: limit on the whole read; reaching it is logged.
        dead_letter_topic: where to copy dead letters (with their reason in
            headers); None keeps them in the report only.
    """
    consumer = settings.consumer(
        topic,
        group_id=group_id,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=EVENT_FETCH_BYTES,
    )
    tally = _ReadTally(topic)
    ends: dict[Any, int] | None = None
    start = time.monotonic()
    with consumer:
        while True:
            if ends is not None and all(
                consumer.position(tp) >= end for tp, end in ends.items()
            ):
                break
            if time.monotonic() - start > max_seconds:
                log.warning("read of %s stopped after %.0f s", topic, max_seconds)
                break
            batches = consumer.poll(timeout_ms=200, max_records=10_000)
            for tp, batch in batches.items():
                for message in batch:
                    tally.add(tp.partition, message)
            if ends is None and consumer.assignment():
                ends = consumer.end_offsets(list(consumer.assignment()))
        consumer.commit()
    if tally.dead and dead_letter_topic:
        _copy_dead_letters(settings, dead_letter_topic, tally.dead)
    return ConsumeReport(
        events=events_from_records(tally.records),
        dead_letters=tally.dead,
        messages=tally.messages,
        bytes=tally.bytes,
        seconds=time.monotonic() - start,
        per_partition=tally.per_partition,
        out_of_order_users=len(tally.out_of_order),
    )


@dataclass
class _ReadTally:
    """What :func:`read_events` has read of ``topic`` so far."""

    topic: str
    records: list[dict[str, Any]] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    per_partition: Counter[int] = field(default_factory=Counter)
    last_time: dict[int, int] = field(default_factory=dict)
    out_of_order: set[int] = field(default_factory=set)
    messages: int = 0
    bytes: int = 0

    def add(self, partition: int, message: Any) -> None:
        """Count one message; keep its event, or its dead letter."""
        payload = message.value or b""
        self.messages += 1
        self.bytes += len(payload)
        self.per_partition[partition] += 1
        decoded = decode_event(payload)
        if decoded.event is None:
            assert decoded.reason is not None
            self.dead.append(
                DeadLetter(
                    source=self.topic,
                    partition=partition,
                    offset=message.offset,
                    reason=decoded.reason,
                    payload=payload,
                )
            )
            return
        event = decoded.event
        # Per-user order within a partition is what keying buys us.
        user, millis = event["user_id"], event["event_time"]
        if millis < self.last_time.get(user, millis):
            self.out_of_order.add(user)
        self.last_time[user] = millis
        self.records.append(event)


def _copy_dead_letters(
    settings: KafkaSettings, topic: str, letters: list[DeadLetter]
) -> None:
    """Send each letter to ``topic``: its message's bytes as the value, cut
    only where the topic takes less, its fields in the headers."""
    limit = max_message_bytes(settings, topic)
    with settings.producer(max_request_size=limit) as producer:
        for letter in letters:
            copy = letter.truncated_to(limit - RECORD_OVERHEAD_BYTES)
            producer.send(topic, value=copy.payload, headers=copy.kafka_headers())
        producer.flush()
