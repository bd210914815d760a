"""Where the trainer's Kafka reader sets aside the records it cannot train on.

A dead letter (:class:`features.deadletter.DeadLetter`) goes to a topic
(``<topic>.dead-letter`` by default) or, for a path ending in ``.jsonl``, to
a JSON-lines file, with partition, offset and reason. Dead letters are
at-least-once: a crash before the reader's next checkpoint re-sends them.

The dead-letter producer allows records as large as the dead-letter topic
does (its ``max.message.bytes``, else the broker's ``message.max.bytes``); a
larger letter is sent truncated to fit, its headers carrying the whole
payload's length and SHA-256 and ``truncated=true``
(:meth:`features.deadletter.DeadLetter.truncated_to`), so one huge poison
message is set aside like any other and the stream goes on. A write that
fails (broker away) is retried with backoff, never skipped.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Final

from features.deadletter import DeadLetter
from features.kafka.settings import KafkaSettings
from features.kafka.topics import (
    RECORD_OVERHEAD_BYTES,
    ensure_topics,
    max_message_bytes,
)

log = logging.getLogger(__name__)

MAX_BACKOFF_S: Final = 30.0
MAX_REASON_CHARS: Final = 2000


class DeadLetterWriter:
    """Set records of ``source`` aside to ``destination`` (module docstring).

    Args:
        settings: the cluster (unused for a ``.jsonl`` destination).
        source: the topic the records came from.
        destination: a topic name, or a path ending in ``.jsonl``.
        closing: once set, a write that keeps failing is given up.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        source: str,
        destination: str,
        closing: threading.Event,
    ) -> None:
        self.settings = settings
        self.source = source
        self.destination = destination
        self.closing = closing
        self.written = 0
        self._producer: Any = None
        self._payload_bytes = 0

    def set_aside(self, partition: int, message: Any, reason: str) -> None:
        """Write ``message`` (a Kafka record) with ``reason``, retrying until
        it is out or :attr:`closing` is set."""
        if len(reason) > MAX_REASON_CHARS:  # it travels in a header: keep it small
            reason = reason[:MAX_REASON_CHARS] + "..."
        letter = DeadLetter(
            source=self.source,
            partition=partition,
            offset=message.offset,
            reason=reason,
            payload=message.value or b"",
        )
        log.warning(
            "dead letter %s/%d@%d (%d bytes): %s",
            self.source,
            partition,
            message.offset,
            letter.payload_length,
            reason,
        )
        self.written += 1
        backoff = 0.5
        # Retried until written: a dead letter is never skipped, and the
        # record's offset is marked only once its letter is out.
        while not self.closing.is_set():
            try:
                self._write(letter)
                return
            except Exception as error:
                log.warning(
                    "dead letter %s/%d@%d not written (%s: %s); retrying in %.1f s",
                    self.source,
                    partition,
                    message.offset,
                    type(error).__name__,
                    error,
                    backoff,
                )
                self.closing.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    def close(self) -> None:
        """Close the producer, if one was started."""
        if self._producer is not None:
            self._producer.close()

    def _write(self, letter: DeadLetter) -> None:
        if self.destination.endswith(".jsonl"):
            with open(Path(self.destination), "a") as file:
                file.write(letter.to_json() + "\n")
            return
        from kafka.errors import MessageSizeTooLargeError

        if self._producer is None:
            ensure_topics(self.settings, {self.destination: 1})
            limit = self._topic_limit()
            self._payload_bytes = max(0, limit - RECORD_OVERHEAD_BYTES)
            self._producer = self.settings.producer(acks="all", max_request_size=limit)
        sent = letter.truncated_to(self._payload_bytes)
        while True:
            if sent.truncated:
                log.warning(
                    "dead letter %s/%s@%d truncated to %d of %d bytes to fit %s",
                    letter.source,
                    letter.partition,
                    letter.offset,
                    len(sent.payload),
                    letter.payload_length,
                    self.destination,
                )
            try:
                self._producer.send(
                    self.destination, value=sent.payload, headers=sent.kafka_headers()
                ).get(timeout=10)
                return
            except MessageSizeTooLargeError:
                if not sent.payload:
                    raise
                # The broker counts more than the estimate: halve and resend.
                sent = letter.truncated_to(len(sent.payload) // 2)

    def _topic_limit(self) -> int:
        """The largest record the dead-letter topic accepts, in bytes."""
        limit = max_message_bytes(self.settings, self.destination)
        log.info("dead letters to %s: records up to %d bytes", self.destination, limit)
        return limit
