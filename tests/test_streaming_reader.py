"""The topic reader's restriction and watermark (no broker: their rules alone)."""

from __future__ import annotations

import pytest

from pipelines.streaming.topic_positions import (
    END,
    PartitionWatermarks,
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
    marks = PartitionWatermarks(((0, None), (1, None)))
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
