"""The Student Adapter's calibration filter (adapter.OffsetTracker): it follows
a drifting intercept without lag, weighs batches by their information,
ignores rows without a teacher and survives a checkpoint round trip."""

from __future__ import annotations

import math

import torch

from features.vocab import DOMAINS, TRAINING_OBJECTIVES
from trainer.distill.adapter import OffsetTracker, StudentAdapter

NO = len(TRAINING_OBJECTIVES)


def _stream(
    tracker: OffsetTracker,
    *,
    days: float,
    drift_per_day: float,
    start_offset: float,
    batch: int = 256,
    batches_per_day: int = 200,
    domain: int = 0,
    seed: int = 0,
) -> list[tuple[float, float]]:
    """Feed batches whose true logit is ``z + start + drift·t``; return
    (true offset, tracker offset) at each batch *before* it is learnt."""
    g = torch.Generator().manual_seed(seed)
    seen = []
    d = torch.full((batch,), domain, dtype=torch.long)
    for step in range(int(days * batches_per_day)):
        hours = 24.0 * step / batches_per_day
        stale = torch.full((batch,), hours)
        z = torch.randn(batch, NO, generator=g) - 3.0  # the teacher's logits
        true = start_offset + drift_per_day * hours / 24
        y = (torch.rand(batch, NO, generator=g) < torch.sigmoid(z + true)).float()
        seen.append((true, float(tracker.offset(d, stale)[0, 0])))
        tracker.update(z, y, torch.ones(batch, 1), d, stale)
    return seen


def test_follows_a_linear_drift_without_lag() -> None:
    tracker = OffsetTracker()
    seen = _stream(tracker, days=6, drift_per_day=0.15, start_offset=-0.4)
    last_day = seen[-200:]
    bias = sum(est - true for true, est in last_day) / len(last_day)
    assert abs(bias) < 0.03, bias  # a lagging estimate would be ~0.15 low
    slope = float(tracker.state[0, 0, 1])
    assert abs(slope - 0.15) < 0.05, slope
    # Other domains never saw a label: still the identity.
    assert torch.count_nonzero(tracker.state[1:]) == 0


def test_a_batch_without_teacher_rows_changes_nothing() -> None:
    tracker = OffsetTracker()
    before = {k: v.clone() for k, v in tracker.state_dict().items()}
    d = torch.zeros(8, dtype=torch.long)
    tracker.update(
        torch.zeros(8, NO), torch.ones(8, NO), torch.zeros(8, 1), d, torch.ones(8)
    )
    for k, v in tracker.state_dict().items():
        assert torch.equal(v, before[k]) or (v.isnan() == before[k].isnan()).all(), k


def test_one_batch_moves_the_level_by_the_newton_step() -> None:
    """Prior variance v, n rows at p = 1/2 all positive: the level moves by
    g / (h + 1/v) with g = n/2, h = n/4 (the Laplace update, written out)."""
    v, n = 0.5**2, 16
    tracker = OffsetTracker(prior_level=math.sqrt(v))
    d = torch.zeros(n, dtype=torch.long)
    tracker.update(
        torch.zeros(n, NO), torch.ones(n, NO), torch.ones(n, 1), d, torch.zeros(n)
    )
    expected = (n / 2) / (n / 4 + 1 / v)
    assert torch.allclose(
        tracker.state[0, :, 0], torch.full((NO,), expected, dtype=torch.float64)
    )


def test_adapter_adds_the_offset_and_checkpoints_it() -> None:
    adapter = StudentAdapter(tracker=OffsetTracker())
    d = torch.full((4,), DOMAINS.index("messaging"), dtype=torch.long)
    z, stale = torch.randn(4, NO), torch.full((4,), 3.0)
    adapter.tracker.update(z, torch.ones(4, NO), torch.ones(4, 1), d, stale)
    offset = adapter.tracker.offset(d, stale)
    assert (offset > 0).all()
    assert torch.allclose(
        adapter(z, d, stale), adapter.mlp_logits(z, d, stale) + offset
    )
    restored = StudentAdapter(tracker=OffsetTracker())
    restored.load_state_dict(adapter.state_dict())
    assert torch.equal(restored(z, d, stale), adapter(z, d, stale))


def test_a_fresher_teacher_reads_the_line_back_at_its_staleness() -> None:
    """After days of a drifting teacher, rows at staleness 0 (a new teacher
    checkpoint) get the offset the line gives at 0, not the latest level."""
    tracker = OffsetTracker()
    _stream(tracker, days=4, drift_per_day=0.15, start_offset=-0.4)
    d = torch.zeros(1, dtype=torch.long)
    at_zero = float(tracker.offset(d, torch.zeros(1))[0, 0])
    latest = float(tracker.offset(d, torch.full((1,), 96.0))[0, 0])
    assert abs(at_zero - (-0.4)) < 0.06, at_zero
    assert abs(latest - (-0.4 + 0.15 * 4)) < 0.04, latest
