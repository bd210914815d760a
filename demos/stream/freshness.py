"""Freshness samples of one streaming demo run, from what it left on the
topics and in its JSON-lines files: each a ``(wall time ms, age ms)`` pair."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from features.example_messages import decode_example_message
from pipelines.streaming.config import LABEL_WINDOW_MS

ExampleRecord = tuple[Any, pa.Table]
"""A message of the examples topic and its decoded examples."""
Sample = tuple[float, float]
"""``(wall time ms, age ms)``: when a freshness was measured, and its value."""


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50 and p99 in seconds of ages in milliseconds, and their count."""
    if not values:
        return {"p50": None, "p99": None, "n": 0}
    array = np.asarray(values, dtype=np.float64)
    return {
        "p50": round(float(np.percentile(array, 50)) / 1000, 3),
        "p99": round(float(np.percentile(array, 99)) / 1000, 3),
        "n": int(array.size),
    }


def jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file; none when it is missing."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _event_record(record: Any) -> dict[str, Any] | None:
    try:
        value = json.loads(record.value)
    except ValueError:
        return None
    if isinstance(value, dict) and isinstance(value.get("event_time"), int):
        return value
    return None


def decoded_examples(records: list[Any]) -> list[ExampleRecord]:
    """The examples topic's messages with their examples, in offset order."""
    decoded = []
    for record in sorted(records, key=lambda r: r.offset):
        message = decode_example_message(record.value)
        if message.examples is not None:
            decoded.append((record, message.examples))
    return decoded


def example_freshness(
    event_records: list[Any], example_records: list[ExampleRecord]
) -> tuple[list[Sample], int]:
    """Per example, ``(wall time ms, age ms)``: when it reached Kafka, minus
    when its label window closed in the stream (the publish time of the first
    event at or after ``t + window``); and how many examples the final drain
    released (their window never closed in the stream, so they have no age)."""
    parsed = [(_event_record(r), r.timestamp) for r in event_records]
    pairs = [(value["event_time"], ts) for value, ts in parsed if value is not None]
    if not pairs:
        return [], 0
    event_times = np.asarray([t for t, _ in pairs], dtype=np.int64)
    published = np.asarray([ts for _, ts in pairs], dtype=np.int64)
    order = np.argsort(event_times, kind="stable")
    event_times, published = event_times[order], published[order]
    # The first publish time at or after each event time (a suffix minimum).
    first_after = np.minimum.accumulate(published[::-1])[::-1]
    samples: list[Sample] = []
    drained = 0
    for record, examples in example_records:
        times = examples.column("event_time").cast(pa.int64()).to_numpy()
        at = np.searchsorted(event_times, times + LABEL_WINDOW_MS, side="left")
        inside = at < event_times.size
        drained += int((~inside).sum())
        ages = record.timestamp - first_after[at[inside]]
        samples.extend((float(record.timestamp), float(age)) for age in ages)
    return samples, drained


def trainer_freshness(
    example_records: list[ExampleRecord], steps: list[dict[str, Any]]
) -> list[Sample]:
    """Per example message: ``(wall time ms, age ms)`` of the first logged
    training step whose cumulative examples reach it (one partition, so the
    trainer consumes in topic order), the age counted from the message's
    Kafka time."""
    if not steps:
        return []
    step_examples = np.asarray([s["examples"] for s in steps], dtype=np.int64)
    step_times = np.asarray([s["time"] * 1000 for s in steps], dtype=np.float64)
    samples, total = [], 0
    for record, examples in example_records:
        total += examples.num_rows
        at = int(np.searchsorted(step_examples, total, side="left"))
        if at < step_examples.size:
            samples.append((step_times[at], step_times[at] - record.timestamp))
    return samples


def feast_freshness(pushes: list[dict[str, Any]]) -> list[Sample]:
    """``(wall time ms of the push, age ms)`` of each sampled event."""
    return [
        (push["time"] * 1000, age) for push in pushes for age in push["freshness_ms"]
    ]


def online_rate(
    pushes: list[dict[str, Any]], events: int, first_publish: float
) -> float | None:
    """Events per second from the first publish to the last push of a
    freshly read event: what the job sustained while the stream was live
    (its start and the bounded run's idle tail left out)."""
    last = max((p["time"] for p in pushes if p["freshness_ms"]), default=None)
    if last is None or last <= first_publish:
        return None
    return round(events / (last - first_publish), 1)
