"""The topic reader's restriction and watermark (no broker: their rules alone)."""

from __future__ import annotations

import pytest

from pipelines.streaming.topic_positions import (
    END,
    PartitionWatermarks,
    ReadFrom,
    TopicPositions,
    TopicPositionsTracker,
)


def test_a_checkpoint_hands_on_every_partition_at_its_next_offset() -> None:
    tracker = TopicPositionsTracker(TopicPositions(((0, 5), (1, 0))))
    assert tracker.try_claim((0, 5))
    assert tracker.try_claim((0, 6))
    assert tracker.try_claim((1, 3))  # offsets may skip (compacted topics)
    with pytest.raises(ValueError, match="neither deferred nor finished"):
        tracker.check_done()
    primary, residual = tracker.try_split(0)
    assert primary == TopicPositions(((0, 7), (1, 4)), finished=True)
    assert residual == TopicPositions(((0, 7), (1, 4)))
    tracker.check_done()
    assert not tracker.try_claim((0, 7)), "nothing is claimed after a checkpoint"


def test_a_fractional_split_is_declined_and_offsets_only_move_forward() -> None:
    tracker = TopicPositionsTracker(TopicPositions(((0, 10),)))
    assert tracker.try_split(0.5) is None
    assert tracker.try_claim((0, 10))
    with pytest.raises(ValueError, match="claimed after"):
        tracker.try_claim((0, 3))


def test_the_end_claim_finishes_a_bounded_read() -> None:
    tracker = TopicPositionsTracker(TopicPositions(((0, 0),)))
    assert tracker.try_claim((0, 0))
    assert tracker.try_claim(END)
    tracker.check_done()
    assert tracker.current_restriction().finished
    assert tracker.try_split(0) is None


def test_the_watermark_is_the_slowest_partition_and_never_moves_back() -> None:
    marks = PartitionWatermarks((((0, None), (1, None)), None))
    marks.advance(0, 1_000)
    assert marks.mark_ms() is None, "a partition without events holds it back"
    marks.advance(1, 400)
    assert marks.mark_ms() == 400
    marks.advance(1, 300)  # an older event does not lower a mark
    assert marks.mark_ms() == 400
    marks.advance(1, 2_000)
    assert marks.mark_ms() == 1_000
    restored = PartitionWatermarks(marks.get_estimator_state())
    assert restored.mark_ms() == 1_000
    assert restored.current_watermark().micros == 1_000_000
    # A partition added to the topic holds the watermark where it is.
    restored.add(2)
    restored.advance(0, 5_000)
    assert restored.mark_ms() == 1_000
    restored.advance(2, 500)
    assert restored.mark_ms() == 1_000, "the watermark never moves back"
    restored.advance(2, 3_000)
    assert restored.mark_ms() == 2_000


def test_lateness_is_judged_against_the_partitions_own_mark() -> None:
    marks = PartitionWatermarks((((0, None), (1, None)), None))
    marks.advance(0, 3_600_000)  # partition 0's clock runs an hour ahead
    marks.advance(1, 1_000)
    assert marks.mark_ms() == 1_000
    assert marks.lateness_reference_ms(0) == 3_600_000
    assert marks.lateness_reference_ms(1) == 1_000, "not partition 0's clock"
    # A partition added late is judged against what was already passed on.
    marks.add(2)
    assert marks.lateness_reference_ms(2) == 1_000
    marks.advance(2, 200)
    assert marks.lateness_reference_ms(2) == 1_000


def test_read_from_adds_a_partition_or_moves_one_forward() -> None:
    tracker = TopicPositionsTracker(TopicPositions(((0, 5),)))
    assert tracker.try_claim(ReadFrom(0, 9))  # retention deleted 5..8
    assert tracker.try_claim((0, 9))
    assert tracker.try_claim(ReadFrom(1, 0))  # partition 1 joined
    with pytest.raises(ValueError, match="read from 3 after 10"):
        tracker.try_claim(ReadFrom(0, 3))
    _, residual = tracker.try_split(0)
    assert residual == TopicPositions(((0, 10), (1, 0)))
