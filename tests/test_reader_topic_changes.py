"""The topic reader on the embedded broker and Prism, in both its shapes (one
reader for the whole topic, and one reader per partition): what retention
deleted is skipped and reported, partitions added while it runs are read,
and one partition's clock running ahead makes no other partition's events
late.

Each test runs the reader alone (``ReadEventStream``, bounded by
``idle_seconds``) and writes what it outputs to files.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from features.events import MAX_CLOCK_SKEW_MS, encode_event
from features.kafka import KafkaSettings
from pipelines.beam.runner import job_counters, job_gauges
from pipelines.streaming.config import METRICS_NAMESPACE
from pipelines.streaming.job import choose_streaming_runner
from pipelines.streaming.kafka_source import DEAD_LETTERS, ReadEventStream

pytestmark = pytest.mark.integration

SHAPES = [pytest.param(True, id="one-reader"), pytest.param(False, id="per-partition")]


def event(event_id: str, at_ms: int, user: int = 1) -> bytes:
    return encode_event(
        {
            "schema_version": 1,
            "event_id": event_id,
            "user_id": user,
            "event_time": at_ms,
            "domain": "facebook",
            "surface": "feed",
            "action": "like",
            "content_id": 5,
        }
    )


def publish(settings: KafkaSettings, topic: str, sent: list[tuple[int, bytes]]) -> None:
    """``(partition, value)`` in the list's order."""
    with settings.producer(acks="all") as producer:
        for partition, value in sent:
            producer.send(topic, value=value, partition=partition)
        producer.flush()


class _Lines(beam.DoFn):  # type: ignore[misc]
    """Appends event ids (of an event batch) or dead-letter lines to a file."""

    def __init__(self, path: str) -> None:
        self._path = path

    def process(self, element: Any) -> Iterator[None]:
        if isinstance(element, str):
            lines = [element]
        else:
            lines = element.events.column("event_id").to_pylist()
        with open(self._path, "a") as out:
            out.writelines(f"{line}\n" for line in lines)
        yield from ()


@dataclass
class ReaderRun:
    """A reader started on Prism; :meth:`finish` waits for its bounded end."""

    result: Any
    folder: Path

    def lines(self, name: str) -> list[str]:
        path = self.folder / name
        return path.read_text().splitlines() if path.exists() else []

    def wait_for(self, count: int, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.lines("events")) < count:
            assert time.monotonic() < deadline, f"{len(self.lines('events'))} events"
            time.sleep(0.2)

    def finish(self) -> dict[str, int]:
        self.result.wait_until_finish()
        return job_counters(self.result, METRICS_NAMESPACE)

    def gauges(self) -> dict[str, Any]:
        return job_gauges(self.result, METRICS_NAMESPACE)


def start_reader(
    settings: KafkaSettings,
    topic: str,
    folder: Path,
    *,
    one_reader: bool,
    idle_seconds: float = 1.0,
) -> ReaderRun:
    options = PipelineOptions(["--runner=DirectRunner"])
    options.view_as(StandardOptions).streaming = True
    choose_streaming_runner(options)
    pipeline = beam.Pipeline(options=options)
    read = pipeline | ReadEventStream(
        settings,
        topic,
        group_id=f"g-{topic}",
        out_of_orderness_ms=5_000,
        allowed_lateness_ms=60_000,
        idle_seconds=idle_seconds,
        one_reader=one_reader,
    )
    _ = read.events | "Events" >> beam.ParDo(_Lines(str(folder / "events")))
    _ = read[DEAD_LETTERS] | "Dead" >> beam.ParDo(_Lines(str(folder / "dead")))
    return ReaderRun(pipeline.run(), folder)


@pytest.mark.parametrize("one_reader", SHAPES)
def test_records_deleted_by_retention_are_skipped_and_reported(
    kafka_settings: KafkaSettings,
    kafka_topic: Callable[[int], str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    one_reader: bool,
) -> None:
    from kafka import TopicPartition

    topic = kafka_topic(2)
    now = int(time.time() * 1000)
    publish(kafka_settings, topic, [(0, event(f"a{i}", now + i)) for i in range(30)])
    publish(kafka_settings, topic, [(1, event(f"b{i}", now + i)) for i in range(10)])
    admin = kafka_settings.admin()
    try:
        admin.delete_records({TopicPartition(topic, 0): 12})
    finally:
        admin.close()
    caplog.set_level(logging.WARNING, logger="pipelines.streaming.kafka_source")
    run = start_reader(kafka_settings, topic, tmp_path, one_reader=one_reader)
    counts = run.finish()
    ids = _ids(tmp_path)
    assert sorted(ids) == sorted(
        [f"a{i}" for i in range(12, 30)] + [f"b{i}" for i in range(10)]
    )
    assert counts["events_lost_to_retention"] == 12
    assert counts["events_read"] == 28
    # Read to the end of both partitions, as the lag gauges say.
    metrics = run.gauges()
    assert metrics["gauges"]["consumer_lag_records.0"] == 0
    assert metrics["gauges"]["consumer_lag_records.1"] == 0
    assert metrics["distributions"]["watermark_delay_ms"]["count"] > 0
    warned = [r.getMessage() for r in caplog.records if "retention" in r.getMessage()]
    assert warned == [
        f"partition {topic}/0: offsets 0 to 11 were deleted by retention before "
        "they were read; reading from 12 (12 records skipped)"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("one_reader", SHAPES)
def test_partitions_added_while_reading_are_read(
    kafka_settings: KafkaSettings,
    kafka_topic: Callable[[int], str],
    tmp_path: Path,
    one_reader: bool,
) -> None:
    topic = kafka_topic(2)
    now = int(time.time() * 1000)
    first = [(i % 2, event(f"old{i}", now + i)) for i in range(20)]
    publish(kafka_settings, topic, first)
    run = start_reader(
        kafka_settings, topic, tmp_path, one_reader=one_reader, idle_seconds=15
    )
    run.wait_for(20)
    admin = kafka_settings.admin()
    try:
        admin.create_partitions({topic: 4})
    finally:
        admin.close()
    added = [(2 + i % 2, event(f"new{i}", now + 100 + i)) for i in range(20)]
    publish(kafka_settings, topic, added)
    counts = run.finish()
    assert sorted(_ids(tmp_path)) == sorted(
        [f"old{i}" for i in range(20)] + [f"new{i}" for i in range(20)]
    )
    assert counts["partitions_joined"] == 2
    assert counts["events_read"] == 40


@pytest.mark.parametrize("one_reader", SHAPES)
def test_a_partition_clock_ahead_makes_no_other_partition_late(
    kafka_settings: KafkaSettings,
    kafka_topic: Callable[[int], str],
    tmp_path: Path,
    one_reader: bool,
) -> None:
    topic = kafka_topic(3)
    now = int(time.time() * 1000)
    ahead = now + MAX_CLOCK_SKEW_MS - 60_000  # accepted by the contract
    sent = []
    for i in range(25):
        sent.append((0, event(f"ahead{i}", ahead + i * 1_000)))
        sent.append((1, event(f"one{i}", now - 600_000 + i * 1_000)))
    # Partition 2 delivers its honest events after the others (a backlog).
    sent += [(2, event(f"two{i}", now - 300_000 + i * 1_000)) for i in range(25)]
    publish(kafka_settings, topic, sent)
    run = start_reader(kafka_settings, topic, tmp_path, one_reader=one_reader)
    counts = run.finish()
    assert not (tmp_path / "dead").exists(), (tmp_path / "dead").read_text()[:500]
    assert len(_ids(tmp_path)) == 75
    assert counts["events_valid"] == 75
    assert counts.get("events_too_late", 0) == 0


def _ids(folder: Path) -> list[str]:
    path = folder / "events"
    return path.read_text().splitlines() if path.exists() else []
