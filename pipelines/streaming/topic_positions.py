"""The reader's restriction and watermark: where it is in each partition, and
how far event time has come.

The splittable read (:class:`~pipelines.streaming.kafka_source.ReadTopicFn`)
has one element per topic; its restriction is the next offset of each
partition (:class:`TopicPositions`), with no end, and its watermark the
minimum over the partitions of ``max event time seen - out_of_orderness``
(:class:`PartitionWatermarks`).

Why one restriction for all partitions: that minimum can only be taken where
all partitions are read. With one restriction per partition the runner would
have to combine their estimates; Prism keeps the estimate of the bundle it
finished last, which lets one partition running ahead move every timer
downstream past events another partition has not delivered yet.
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
class TopicRead:
    """What to read: a topic, from an offset per partition (the SDF's element)."""

    topic: str
    starts: tuple[tuple[int, int], ...]
    """``(partition, first offset)``, by partition."""


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


PartitionState = tuple[tuple[int, int | None], ...]
"""``((partition, mark ms or None), ...)``."""


class PartitionWatermarks(WatermarkEstimator):  # type: ignore[misc]
    """The source's watermark: the minimum of the partitions' marks.

    A partition's mark is its newest event time minus the out-of-orderness,
    never moving back. Every partition counts, also a quiet one: a partition
    is quiet alike when its producers are and when the broker is away, and
    taking the second for the first would make what it then delivers late.
    So a partition that never gets events holds the stream back (a bounded
    run still ends). The marks travel with the checkpointed restriction.
    """

    def __init__(self, state: PartitionState) -> None:
        self._marks = dict(state)

    def advance(self, partition: int, mark: int) -> None:
        """Raise a partition's mark (ms) to ``mark``."""
        current = self._marks.get(partition)
        if current is None or mark > current:
            self._marks[partition] = mark

    def mark_ms(self) -> int | None:
        """The watermark in ms, or None while a partition has no mark."""
        marks = list(self._marks.values())
        if not marks or any(mark is None for mark in marks):
            return None
        return min(mark for mark in marks if mark is not None)

    def current_watermark(self) -> Timestamp | None:
        mark = self.mark_ms()
        return None if mark is None else ms_to_timestamp(mark)

    def observe_timestamp(self, timestamp: Timestamp) -> None:
        pass  # the marks are set by the reader, not by output timestamps

    def get_estimator_state(self) -> PartitionState:
        return tuple(sorted(self._marks.items()))


class WatermarksProvider(WatermarkEstimatorProvider):  # type: ignore[misc]
    def initial_estimator_state(
        self, element: TopicRead, restriction: TopicPositions
    ) -> PartitionState:
        return tuple((p, None) for p, _ in element.starts)

    def create_watermark_estimator(
        self, estimator_state: PartitionState
    ) -> PartitionWatermarks:
        return PartitionWatermarks(estimator_state)
