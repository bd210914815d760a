"""One reader's Kafka consumer: where it is in each of its partitions, what
retention deleted before it got there, which partitions joined the topic,
how far behind the log end it is, and whether the topic is idle.

Kept across the reader's calls (:class:`~pipelines.streaming.kafka_source.ReadTopicFn`
holds one per reader), so a call that resumes where the last one stopped
seeks nothing and asks the broker nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from features.kafka import KafkaSettings
from features.kafka.settings import EVENT_FETCH_BYTES
from pipelines.streaming.topic_positions import TopicPositions, TopicRead

log = logging.getLogger(__name__)

POLL_MS: Final = 100
MAX_RECORDS: Final = 20_000
PARTITION_REFRESH_MS: Final = 5_000
"""The consumer's metadata lasts this long: a partition added to the topic
is read within about this time (plus a call)."""
PROBE_TIMEOUT_MS: Final = 3_000
PROBE_SLOW_SECONDS: Final = 1.5
"""Bounded runs: a broker round trip slower than this (a fetch long-poll ahead
of it on the connection takes up to 0.5 s) counts as the broker being quiet
(see :meth:`ReaderConsumer.idle_confirmed_now`) ..."""
MAX_SLOW_PROBES: Final = 3
"""... up to this many times in a row: a broker that is always that slow (an
overloaded machine) must not keep a bounded run from ever finishing."""


@dataclass(frozen=True)
class RetentionGap:
    """Records of a partition deleted (by retention) before the reader read them."""

    partition: int
    expected: int
    """The offset the reader was to read next."""
    earliest: int
    """The partition's earliest retained offset, where it goes on."""

    @property
    def skipped(self) -> int:
        return self.earliest - self.expected


class ReaderConsumer:
    """A kafka-python consumer assigned to one reader's partitions.

    It never resets an offset by itself (``auto_offset_reset="none"``):
    a position below the earliest retained offset is a :class:`RetentionGap`
    the reader claims past and reports, never a silent jump to the log end.
    """

    def __init__(self, settings: KafkaSettings, group_id: str, read: TopicRead):
        self.read = read
        self.next: dict[int, int] = {}
        """Next offset per assigned partition: the restriction's, as read."""
        self._consumer = settings.consumer(
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="none",
            metadata_max_age_ms=PARTITION_REFRESH_MS,
            max_partition_fetch_bytes=EVENT_FETCH_BYTES,
        )
        # Bounded runs: seconds spent polling since the last message. Only
        # polling time counts: between two calls the runner runs the stages
        # after the reader, which says nothing about whether the topic is idle.
        self.quiet_for = 0.0
        self._idle_confirmed = False
        self._slow_probes = 0

    def close(self) -> None:
        self._consumer.close()

    def _tp(self, partition: int) -> Any:
        from kafka import TopicPartition

        return TopicPartition(self.read.topic, partition)

    def at(self, positions: TopicPositions) -> list[int]:
        """Be at the restriction's offsets; the partitions that had to seek
        (all of them on the first call; none when resuming in place)."""
        wanted = dict(positions.next)
        if set(wanted) != set(self.next):
            self._consumer.assign([self._tp(p) for p in sorted(wanted)])
            self.next = {p: o for p, o in self.next.items() if p in wanted}
        moved = [p for p, o in sorted(wanted.items()) if self.next.get(p) != o]
        for partition in moved:
            self.seek(partition, wanted[partition])
        return moved

    def add(self, partition: int, offset: int) -> None:
        """Read a partition that joined the topic, from ``offset``."""
        self._consumer.assign([self._tp(p) for p in sorted({*self.next, partition})])
        self.seek(partition, offset)

    def seek(self, partition: int, offset: int) -> None:
        """Read an assigned partition from ``offset`` next."""
        self._consumer.seek(self._tp(partition), offset)
        self.next[partition] = offset

    def joined(self) -> list[int]:
        """This reader's partitions the topic has and the reader does not
        read yet (added while the job runs), from the consumer's metadata."""
        found = self._consumer.partitions_for_topic(self.read.topic) or set()
        return sorted(p for p in found if self.read.owns(p) and p not in self.next)

    def gaps(
        self, partitions: Iterable[int], out_of_range: bool = False
    ) -> list[RetentionGap]:
        """Where retention deleted records the reader has not read yet.

        ``out_of_range``: the broker said these positions are outside the
        log; one at or past its start is past its end, which no retention
        explains (a topic deleted and created again): an error naming it.
        """
        from kafka.errors import KafkaError

        wanted = [p for p in partitions if p in self.next]
        if not wanted:
            return []
        try:
            earliest = self._consumer.beginning_offsets([self._tp(p) for p in wanted])
        except KafkaError as error:
            # The broker is away: a position it no longer has fails the
            # next fetch, which asks again.
            log.info("earliest offsets unknown (%s); asked again later", error)
            return []
        gaps = []
        for partition in wanted:
            first = int(earliest[self._tp(partition)])
            if first > self.next[partition]:
                gaps.append(RetentionGap(partition, self.next[partition], first))
            elif out_of_range:
                raise RuntimeError(
                    f"partition {self.read.topic}/{partition}: offset "
                    f"{self.next[partition]} is past the log's end (was the "
                    "topic deleted and created again?)"
                )
        return gaps

    def poll(self) -> tuple[dict[Any, list[Any]], list[RetentionGap]]:
        """One poll: the records by partition, and the retention gaps the
        broker found under the reader's positions."""
        from kafka.errors import OffsetOutOfRangeError

        try:
            records = self._consumer.poll(timeout_ms=POLL_MS, max_records=MAX_RECORDS)
        except OffsetOutOfRangeError as error:
            lost = error.args[0] if error.args else {}
            if not isinstance(lost, dict):
                lost = {}
            partitions = sorted(tp.partition for tp in lost) or sorted(self.next)
            return {}, self.gaps(partitions, out_of_range=True)
        return records, []

    def lag(self) -> dict[int, int]:
        """Records per partition between the reader and the log end, as of
        the last fetch response (no request; a partition not fetched from
        yet is left out)."""
        out = {}
        for partition, offset in self.next.items():
            end = self._consumer.highwater(self._tp(partition))
            if end is not None:
                out[partition] = max(0, int(end) - offset)
        return out

    def idle_confirmed_now(self) -> tuple[bool, bool]:
        """Bounded runs: is the topic's idleness the topic's, not the broker's?
        And did the broker answer late or not at all?

        An empty poll looks the same whether the topic is quiet or the broker
        is down (paused, restarting, unreachable). So the read is finished
        only after a full idle period that *began* with a broker round trip
        (ListOffsets) coming back and ends with another: the first probe of
        an idle topic only starts that period, counted from its answer. A
        broker that does not answer (or answers late, as a paused one does
        once resumed) restarts it, so producers that were blocked by the
        outage get a full idle period to deliver what they buffered.
        """
        from kafka.errors import KafkaError

        started = time.monotonic()
        try:
            self._consumer.end_offsets(
                list(self._consumer.assignment()), timeout_ms=PROBE_TIMEOUT_MS
            )
        except KafkaError:
            self._idle_confirmed = False
            return False, True
        slow = time.monotonic() - started > PROBE_SLOW_SECONDS
        if slow and self._slow_probes < MAX_SLOW_PROBES:
            self._slow_probes += 1
            self._idle_confirmed = False
            return False, True
        if not slow:
            self._slow_probes = 0
        if not self._idle_confirmed:
            self._idle_confirmed = True
            return False, False
        return True, False

    def heard(self, anything: bool, seconds: float) -> None:
        """Count a poll: ``anything`` it returned resets the idle time."""
        if anything:
            self.quiet_for = 0.0
            self._idle_confirmed = False
        else:
            self.quiet_for += seconds
