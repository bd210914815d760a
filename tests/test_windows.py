"""The window reader against windows cut by hand, one example at a time."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from features.examples import TIMELINE_SCHEMA, TIMELINE_SEGMENT_SCHEMA
from features.registry import time_bucket
from features.windows import (
    SEQUENCE_COLUMNS,
    TIMELINE_SEQUENCE_COLUMNS,
    Windows,
    attach_windows,
    read_windows,
    timeline_segments,
)

T0 = 1_790_000_000_000  # epoch ms in 2026
TIME = TIMELINE_SCHEMA.field("event_time").type.value_type
Batch = tuple[pa.Table, list[int], list[int], list[int], int]


def make_timelines(histories: dict[int, list[int]], seed: int = 0) -> pa.Table:
    """Timelines (TIMELINE_SCHEMA) of users whose events happen at given ms."""
    rng = np.random.default_rng(seed)
    users = sorted(histories)
    rows: dict[str, list[Any]] = {"user_id": users, "event_time": []}
    rows |= {name: [] for name in TIMELINE_SEQUENCE_COLUMNS}
    for user in users:
        times = sorted(histories[user])
        n = len(times)
        rows["event_time"].append(pa.array(times, pa.int64()).cast(TIME).to_pylist())
        rows["seq_item_id"].append((rng.integers(0, 10**12, n)).tolist())
        for name in TIMELINE_SEQUENCE_COLUMNS[1:]:
            rows[name].append(rng.integers(1, 9, n).tolist())
    return pa.Table.from_pydict(rows, schema=TIMELINE_SCHEMA)


def by_hand(
    timelines: pa.Table, user: list[int], t: list[int], cut: list[int], max_len: int
) -> dict[str, list[list[int]]]:
    """Each example's window, one loop iteration per example."""
    rows = {row["user_id"]: row for row in timelines.to_pylist()}
    out: dict[str, list[list[int]]] = {name: [] for name in SEQUENCE_COLUMNS}
    for u, now, c in zip(user, t, cut, strict=True):
        row = rows.get(u)
        lo = max(0, c - max_len)
        for name in TIMELINE_SEQUENCE_COLUMNS:
            out[name].append(list(row[name][lo:c]) if row else [])
        times = [
            int(e.timestamp() * 1000) for e in (row["event_time"][lo:c] if row else [])
        ]
        out["seq_time_bucket"].append(
            [int(time_bucket([(now - e) / 1000.0])[0]) for e in times]
        )
    return out


def as_lists(windows: Windows) -> dict[str, list[list[int]]]:
    o = windows.offsets
    return {
        name: [
            windows.values[name][o[i] : o[i + 1]].tolist() for i in range(windows.size)
        ]
        for name in SEQUENCE_COLUMNS
    }


@pytest.fixture(scope="module")
def long_history() -> tuple[pa.Table, list[int], list[int], list[int]]:
    """User 7 with 6,000 events (longer than the longest window), user 3 with
    a few, user 9 with none; examples at various cuts."""
    rng = np.random.default_rng(1)
    long_times = np.sort(T0 + rng.integers(0, 30 * 86_400_000, 6000)).tolist()
    histories = {7: long_times, 3: [T0 + 5, T0 + 5, T0 + 2_000]}
    timelines = make_timelines(histories)
    cuts_7 = [0, 1, 255, 256, 257, 4095, 4096, 4097, 5999, 6000]
    user = [7] * len(cuts_7) + [3, 3, 3, 9]
    cut = [*cuts_7, 0, 2, 3, 0]
    t = [long_times[c] + 1 if c < 6000 else long_times[-1] + 1 for c in cuts_7]
    t += [T0 + 5, T0 + 6, T0 + 10_000, T0]
    return timelines, user, t, cut


@pytest.mark.parametrize("max_len", [1, 256, 4096])
def test_windows_equal_hand_cut_windows(
    long_history: tuple[pa.Table, list[int], list[int], list[int]], max_len: int
) -> None:
    timelines, user, t, cut = long_history
    windows = read_windows(user, t, cut, timelines, max_len)
    assert windows.lengths.tolist() == [min(c, max_len) for c in cut]
    assert as_lists(windows) == by_hand(timelines, user, t, cut, max_len)
    assert windows.values["seq_item_id"].dtype == np.int64
    assert windows.values["seq_action"].dtype == np.int32


@pytest.mark.parametrize("max_len", [1, 256, 4096])
def test_segments_give_the_same_windows(
    long_history: tuple[pa.Table, list[int], list[int], list[int]], max_len: int
) -> None:
    timelines, user, t, cut = long_history
    examples = pa.table({"user_id": user, "timeline_cut": cut})
    segments = timeline_segments(examples, timelines, max_len)
    assert segments.schema == TIMELINE_SEGMENT_SCHEMA
    full = read_windows(user, t, cut, timelines, max_len)
    part = read_windows(user, t, cut, segments, max_len)
    assert as_lists(part) == as_lists(full)
    # Each user's events are carried once, and only as far back as needed.
    row = segments.filter(pa.compute.equal(segments["user_id"], 7)).to_pylist()[0]
    assert row["segment_start"] == max(0, 0 - max_len)
    assert len(row["event_time"]) == 6000


def test_segment_that_does_not_cover_a_window_is_an_error(
    long_history: tuple[pa.Table, list[int], list[int], list[int]],
) -> None:
    timelines, *_ = long_history
    examples = pa.table({"user_id": [7], "timeline_cut": [5000]})
    segments = timeline_segments(examples, timelines, 100)
    assert segments["segment_start"].to_pylist() == [4900]
    read_windows([7], [T0 * 2], [5000], segments, 100)  # covered
    with pytest.raises(ValueError, match="not its events"):
        read_windows([7], [T0 * 2], [5000], segments, 101)
    with pytest.raises(ValueError, match="no timeline"):
        read_windows([42], [T0], [1], timelines, 10)


def test_attach_windows_materializes_list_columns(
    long_history: tuple[pa.Table, list[int], list[int], list[int]],
) -> None:
    from features.examples import training_example_schema

    timelines, user, t, cut = long_history
    schema = training_example_schema()
    n = len(user)
    columns: dict[str, Any] = {}
    for field in schema:
        if field.name == "user_id":
            columns[field.name] = pa.array(user, field.type)
        elif field.name == "timeline_cut":
            columns[field.name] = pa.array(cut, field.type)
        elif field.name == "event_time":
            columns[field.name] = pa.array(t, pa.int64()).cast(field.type)
        elif field.name == "example_id":
            columns[field.name] = pa.array([f"e{i}" for i in range(n)])
        else:
            columns[field.name] = pa.array(np.zeros(n), pa.float64()).cast(field.type)
    examples = pa.table(columns, schema=schema)
    out = attach_windows(examples, timelines, 256)
    assert out.schema == training_example_schema(with_sequences=True)
    expected = by_hand(timelines, user, t, cut, 256)
    for name in SEQUENCE_COLUMNS:
        assert out.column(name).to_pylist() == expected[name]


@st.composite
def random_batches(draw: st.DrawFn) -> Batch:
    n_users = draw(st.integers(1, 5))
    histories = {
        u: sorted(
            draw(st.lists(st.integers(0, 10_000_000), max_size=40)),
        )
        for u in range(n_users)
    }
    histories = {u: [T0 + x for x in h] for u, h in histories.items()}
    with_row = {u: h for u, h in histories.items() if h or draw(st.booleans())}
    n = draw(st.integers(0, 12))
    user, t, cut = [], [], []
    for _ in range(n):
        u = draw(st.integers(0, n_users - 1))
        c = draw(st.integers(0, len(histories[u]))) if u in with_row else 0
        user.append(u)
        cut.append(c)
        t.append(histories[u][c - 1] + draw(st.integers(1, 10**9)) if c else T0)
    max_len = draw(st.integers(1, 50))
    seed = draw(st.integers(0, 2**16))
    return make_timelines(with_row, seed), user, t, cut, max_len


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_batches())
def test_random_timelines_and_cuts(batch: Batch) -> None:
    timelines, user, t, cut, max_len = batch
    expected = by_hand(timelines, user, t, cut, max_len)
    assert as_lists(read_windows(user, t, cut, timelines, max_len)) == expected
    examples = pa.table({"user_id": user, "timeline_cut": cut})
    segments = timeline_segments(examples, timelines, max_len)
    assert as_lists(read_windows(user, t, cut, segments, max_len)) == expected
