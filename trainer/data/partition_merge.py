"""Records of several partitions, merged into event-time order.

The examples topic's partitions are user shards, each in event-time order,
so reading them one after another would train on one shard's whole history
before the next one's. Fetched records are held per partition and released
earliest ``event-time-ms`` header first (a record without one goes at once),
the merge a Kafka Streams task does. A partition whose held records are used
up holds the others back while it has records on the broker not yet fetched
(its position is short of its high watermark), for at most ``ALIGN_WAIT_S``;
a partition that is caught up holds nothing back, so a live stream pays no
latency. The records held are what the client had fetched anyway (one fetch
response per partition; it fetches a partition again only once its last
response is used up); past ``MAX_HELD_BYTES`` the merge stops waiting, which
bounds the memory. Pausing full partitions would bound it tighter, but
kafka-python 3.0 can leave a partition paused in the middle of a fetch
response unfetched after it is resumed.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Final

from features.example_messages import header_event_time
from features.kafka.settings import MAX_MESSAGE_BYTES

ALIGN_WAIT_S: Final = 1.0
MAX_HELD_BYTES: Final = 4 * MAX_MESSAGE_BYTES
"""Held records past this are released without waiting for other partitions."""
UNSTAMPED: Final = -(2**63)
"""The merge key of a record without ``event-time-ms``: it is released first."""


class EventTimeMerge:
    """Fetched records held per partition, released in event-time order.

    Used by one thread (the consumer's); :attr:`count` may be read from others.
    """

    def __init__(self) -> None:
        # Per partition: (event time, record) in fetch order.
        self._held: dict[int, deque[tuple[int, Any]]] = {}
        # When the merge began waiting on a partition with unfetched records.
        self._waiting_since: float | None = None
        self.count = 0
        self._bytes = 0
        self.waits = 0
        """Times the merge held records back for a partition with records
        not fetched yet."""

    def hold(self, records: dict[Any, list[Any]]) -> None:
        """Take a poll's records (topic partition → records)."""
        for tp, messages in records.items():
            held = self._held.setdefault(tp.partition, deque())
            for message in messages:
                stamp = header_event_time(message.headers)
                held.append((UNSTAMPED if stamp is None else stamp, message))
                self._bytes += len(message.value or b"")
            self.count += len(messages)

    def drop(self) -> None:
        """Forget held records: after a rebalance their partitions are re-read
        from the offset map (or belong to another rank)."""
        self._held, self._waiting_since = {}, None
        self.count = self._bytes = 0

    def take(self, consumer: Any) -> tuple[int, Any] | None:
        """(partition, record) of the earliest held record, or None while
        none may go yet (module docstring)."""
        if not self.count:
            return None
        heads = {p: held[0][0] for p, held in self._held.items() if held}
        if self._bytes < MAX_HELD_BYTES and _unfetched_elsewhere(consumer, heads):
            now = time.monotonic()
            if self._waiting_since is None:
                self._waiting_since = now
                self.waits += 1
            if now - self._waiting_since < ALIGN_WAIT_S:
                return None
        else:
            self._waiting_since = None
        partition = min(heads, key=heads.__getitem__)
        _, message = self._held[partition].popleft()
        self.count -= 1
        self._bytes -= len(message.value or b"")
        return partition, message


def _unfetched_elsewhere(consumer: Any, heads: dict[int, int]) -> bool:
    """Whether an assigned partition with nothing held has records on the
    broker not fetched yet (or has not been fetched from at all)."""
    for tp in consumer.assignment():
        if tp.partition in heads:
            continue
        end = consumer.highwater(tp)
        if end is None:
            return True
        position = consumer.position(tp, timeout_ms=0)
        if position is not None and position < end:
            return True
    return False
