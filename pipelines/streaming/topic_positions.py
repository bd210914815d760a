"""The reader's restriction and watermark: where it is in each partition, and
how far event time has come.

The splittable read (:class:`~pipelines.streaming.kafka_source.ReadTopicFn`)
has one element per reader (:class:`TopicRead`): reader ``r`` of ``n`` reads
the partitions ``p`` with ``p % n == r``, also those added to the topic
while it runs. Its restriction is the next offset of each of its partitions
(:class:`TopicPositions`), with no end, and its watermark the minimum over
them of ``max event time seen - out_of_orderness`` (:class:`PartitionWatermarks`).

How many readers is the runner's to say
(:func:`~pipelines.streaming.kafka_source.one_reader`): one per partition
where the runner takes the minimum of the readers' watermarks (Flink,
Dataflow); one for the whole topic on Prism, which keeps the estimate of
the bundle it finished last instead of combining them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from apache_beam.io.iobase import (
    RestrictionProgress,
    RestrictionTracker,
    WatermarkEstimator,
)
from apache_beam.transforms.core import RestrictionProvider, WatermarkEstimatorProvider
from apache_beam.utils.timestamp import Timestamp

from pipelines.streaming.event_timers import ms_to_timestamp

END: Final = "end"
"""The claim that finishes a bounded run's restriction."""


@dataclass(frozen=True)
class ReadFrom:
    """The claim that a partition is read from ``offset`` on: one added to
    the topic while the job runs joins the restriction there; one whose
    records below ``offset`` retention deleted moves past them."""

    partition: int
    offset: int


@dataclass(frozen=True)
class TopicRead:
    """What one reader reads: its partitions of a topic, from an offset each
    (the SDF's element)."""

    topic: str
    starts: tuple[tuple[int, int], ...]
    """``(partition, first offset)``, by partition."""
    readers: int = 1
    reader: int = 0

    def owns(self, partition: int) -> bool:
        """Whether this reader reads ``partition`` (one added later included)."""
        return partition % self.readers == self.reader


@dataclass(frozen=True)
class TopicPositions:
    """The restriction: the next offset of each partition.

    ``finished`` marks the part already read: after a checkpoint or at the
    end of a bounded run, nothing in it is left to claim.
    """

    next: tuple[tuple[int, int], ...]
    finished: bool = False


class TopicPositionsTracker(RestrictionTracker):  # type: ignore[misc]
    """Claims ``(partition, offset)`` in order per partition, or :data:`END`.

    Offsets may skip (a compacted topic); a :class:`ReadFrom` claim adds a
    partition or moves one forward.

    The runner may checkpoint it at the current positions (a split at
    fraction 0); it cannot split it by fraction: a remainder that never ends
    has no half.
    """

    def __init__(self, restriction: TopicPositions) -> None:
        self._restriction = restriction
        self._next = dict(restriction.next)
        self._stopped = restriction.finished

    def current_restriction(self) -> TopicPositions:
        return self._restriction

    def try_claim(self, position: Any) -> bool:
        if self._stopped:
            return False
        if position == END:
            self._stop()
            return True
        if isinstance(position, ReadFrom):
            current = self._next.get(position.partition)
            if current is not None and position.offset < current:
                raise ValueError(
                    f"partition {position.partition} read from {position.offset} "
                    f"after {current}"
                )
            self._next[position.partition] = position.offset
            return True
        partition, offset = position
        if offset < self._next[partition]:
            raise ValueError(
                f"offset {offset} of partition {partition} claimed after "
                f"{self._next[partition]}"
            )
        self._next[partition] = offset + 1
        return True

    def try_split(self, fraction_of_remainder: float) -> Any:
        if self._stopped or fraction_of_remainder > 0:
            return None
        residual = TopicPositions(tuple(sorted(self._next.items())))
        return self._stop(), residual

    def _stop(self) -> TopicPositions:
        self._stopped = True
        self._restriction = TopicPositions(
            tuple(sorted(self._next.items())), finished=True
        )
        return self._restriction

    def check_done(self) -> None:
        if not self._stopped:
            raise ValueError("the topic read ended neither deferred nor finished")

    def current_progress(self) -> RestrictionProgress:
        # No fraction of a remainder that never ends is done; counts of
        # claimed records here made the SDK's split arithmetic NaN.
        return RestrictionProgress(fraction=0.0)

    def is_bounded(self) -> bool:
        return False


class TopicRestrictions(RestrictionProvider):  # type: ignore[misc]
    """The element's start offsets; never split (see the module docstring)."""

    def initial_restriction(self, element: TopicRead) -> TopicPositions:
        return TopicPositions(element.starts)

    def create_tracker(self, restriction: TopicPositions) -> TopicPositionsTracker:
        return TopicPositionsTracker(restriction)

    def restriction_size(self, element: TopicRead, restriction: TopicPositions) -> int:
        return 1  # unknown

    def split(self, element: TopicRead, restriction: TopicPositions) -> Iterator[Any]:
        yield restriction


PartitionState = tuple[tuple[tuple[int, int | None], ...], int | None]
"""``(((partition, mark ms or None), ...), watermark ms or None)``."""


class PartitionWatermarks(WatermarkEstimator):  # type: ignore[misc]
    """A reader's watermark: the minimum of its partitions' marks.

    A partition's mark is its newest event time minus the out-of-orderness,
    never moving back. Every partition counts, also a quiet one: a partition
    is quiet alike when its producers are and when the broker is away, and
    taking the second for the first would make what it then delivers late.
    So a partition that never gets events holds the stream back (a bounded
    run still ends). A partition added while the job runs holds the
    watermark where it is until its first event; the watermark never moves
    back. The marks travel with the checkpointed restriction.
    """

    def __init__(self, state: PartitionState) -> None:
        marks, watermark = state
        self._marks = dict(marks)
        self._watermark = watermark

    def add(self, partition: int) -> None:
        """Count a partition added to the topic (no mark yet)."""
        self._marks.setdefault(partition, None)

    def advance(self, partition: int, mark: int) -> None:
        """Raise a partition's mark (ms) to ``mark``."""
        current = self._marks.get(partition)
        if current is None or mark > current:
            self._marks[partition] = mark
        marks = list(self._marks.values())
        if all(m is not None for m in marks):
            lowest = min(m for m in marks if m is not None)
            if self._watermark is None or lowest > self._watermark:
                self._watermark = lowest

    def mark_ms(self) -> int | None:
        """The watermark in ms, or None until every partition has a mark."""
        return self._watermark

    def partition_mark_ms(self, partition: int) -> int | None:
        """One partition's mark in ms (None before its first event)."""
        return self._marks.get(partition)

    def lateness_reference_ms(self, partition: int) -> int | None:
        """What an event of ``partition`` is late against: the partition's
        own mark, or the watermark this reader has passed on if that is
        later (where a partition added late starts).

        Never another partition's clock: a partition whose producers' clock
        runs ahead moves only its own mark, so it makes no other partition's
        events late. Safe downstream: the watermark the stages see is at
        most this reader's, which is at most each of its partitions' marks.
        """
        own = self._marks.get(partition)
        if own is None or (self._watermark is not None and self._watermark > own):
            return self._watermark
        return own

    def current_watermark(self) -> Timestamp | None:
        mark = self.mark_ms()
        return None if mark is None else ms_to_timestamp(mark)

    def observe_timestamp(self, timestamp: Timestamp) -> None:
        pass  # the marks are set by the reader, not by output timestamps

    def get_estimator_state(self) -> PartitionState:
        return tuple(sorted(self._marks.items())), self._watermark


class WatermarksProvider(WatermarkEstimatorProvider):  # type: ignore[misc]
    def initial_estimator_state(
        self, element: TopicRead, restriction: TopicPositions
    ) -> PartitionState:
        return tuple((p, None) for p, _ in element.starts), None

    def create_watermark_estimator(
        self, estimator_state: PartitionState
    ) -> PartitionWatermarks:
        return PartitionWatermarks(estimator_state)
