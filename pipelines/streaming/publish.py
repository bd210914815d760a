"""The job's Kafka outputs: example messages (exactly once) and dead letters.

Example messages are the contract's codec (:mod:`features.example_messages`),
keyed by user shard so one user's examples stay in order in one partition.

No example reaches the examples topic twice, by two mechanisms:

- the **idempotent producer** (``enable_idempotence``) removes the copies
  its own retries would make within a run;
- **deduplication by example id against the topic itself**: at start-up
  the publisher reads the example ids already on the examples topic (the
  ledger) and drops any example it is asked to publish again. A restarted
  job (after SIGKILL, or a runner retrying a bundle) recomputes examples
  from the replayed events; those already published are dropped here, the
  rest go out. A message sent but not acknowledged before a crash is either
  on the topic (then in the next ledger) or not (then sent again): never two.

What the ledger costs: one read of the examples topic at start (on a real
cluster, of its retained tail: examples older than the replay horizon cannot
come back).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from apache_beam.metrics import Metrics

from features.deadletter import DeadLetter
from features.example_messages import (
    decode_example_message,
    encode_example_message,
    message_headers,
)
from features.kafka import KafkaSettings, topic_records
from features.kafka.topics import RECORD_OVERHEAD_BYTES, max_message_bytes
from features.windows import timeline_segments
from pipelines.beam.kafka_send import KafkaSendFn
from pipelines.streaming.config import METRICS_NAMESPACE
from pipelines.streaming.tables import state_table


def published_example_ids(settings: KafkaSettings, topic: str) -> set[str]:
    """Every example id on ``topic`` (the ledger), from the start to its end."""
    ids: set[str] = set()
    for record in topic_records(settings, topic):
        decoded = decode_example_message(record.value)
        if decoded.examples is not None:
            ids.update(decoded.examples.column("example_id").to_pylist())
    return ids


class PublishExampleMessagesFn(KafkaSendFn):
    """``(user shard, examples IPC, segments IPC)`` -> one Kafka message each,
    minus examples already on the topic (see the module docstring)."""

    def __init__(self, settings: KafkaSettings, topic: str, max_seq_len: int) -> None:
        super().__init__(settings, topic)
        self._max_seq_len = max_seq_len
        self._published: set[str] = set()
        self._sent: list[str] = []
        self.messages = Metrics.counter(METRICS_NAMESPACE, "messages_published")
        self.examples = Metrics.counter(METRICS_NAMESPACE, "examples_published")
        self.skipped = Metrics.counter(METRICS_NAMESPACE, "examples_already_published")

    def setup(self) -> None:
        """The producer, and the ledger of what the topic already holds."""
        self._published = published_example_ids(self._settings, self._topic)
        self.open_producer(enable_idempotence=True)

    def process(self, element: tuple[int, bytes, bytes]) -> Iterator[Any]:
        """Publish the examples not yet on the topic."""
        shard, examples_data, segments_data = element
        examples = state_table(examples_data)
        segments = state_table(segments_data)
        if self._published:
            ids = examples.column("example_id").to_pylist()
            fresh = [i not in self._published for i in ids]
            if not all(fresh):
                examples = examples.filter(pa.array(fresh))
                self.skipped.inc(len(ids) - examples.num_rows)
                segments = timeline_segments(examples, segments, self._max_seq_len)
        if examples.num_rows == 0:
            return
        self._producer.send(
            self._topic,
            key=str(shard).encode(),
            value=encode_example_message(
                examples, segments, max_seq_len=self._max_seq_len
            ),
            headers=message_headers(examples),
        )
        self._sent.extend(examples.column("example_id").to_pylist())
        self.messages.inc()
        self.examples.inc(examples.num_rows)
        yield from ()

    def finish_bundle(self) -> None:
        """Acknowledged before the bundle commits; then part of the ledger."""
        super().finish_bundle()
        self._published.update(self._sent)
        self._sent = []


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
