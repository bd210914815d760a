"""The streaming job on Flink's embedded cluster at parallelism 2 reads the
events topic with one reader per partition, each reader's consumer assigned
only its own partition, and its examples equal the batch job's.

The readers' own log lines say which partitions each reads; the per-partition
lag gauges say each partition was read to its end.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from benchmarks.generated import generated_tables
from features.example_messages import decode_example_message
from features.kafka import KafkaSettings, ensure_topics
from launchers.flink_job_server import FlinkJobServer
from pipelines import build
from pipelines.sources.event_stream import publish_events
from pipelines.sources.synthetic import GeneratorConfig, validation_now_ms
from tests.test_streaming_job import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONFIG = GeneratorConfig(users=40, ads=15, days=3, seed=5)
NOW = validation_now_ms(CONFIG)
PARTITIONS = 2


def test_two_readers_read_disjoint_partitions_and_match_the_batch_job(
    tmp_path: Path,
    kafka_settings: KafkaSettings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tables = generated_tables(CONFIG, tmp_path / "gen")
    suffix = uuid.uuid4().hex[:8]
    events_topic, examples_topic = f"ev-{suffix}", f"ex-{suffix}"
    ensure_topics(kafka_settings, {events_topic: PARTITIONS})
    # Keyed by user: each user's events in event-time order in one partition.
    publish_events(tables.events, kafka_settings, events_topic)
    reference = tables.reference(tables.events)
    flags = [
        "--streaming",
        f"--input={tmp_path / 'gen'}",
        f"--kafka-bootstrap={kafka_settings.bootstrap}",
        f"--events-topic={events_topic}",
        f"--examples-topic={examples_topic}",
        "--shards=4",
        "--entity-shards=2",
        "--max-seq-len=32",
        "--out-of-orderness-ms=0",
        "--allowed-lateness-ms=7200000",
        "--release-granularity-ms=3600000",
        "--stream-idle-seconds=0.5",
        f"--now-ms={NOW}",
    ]
    caplog.set_level(logging.INFO, logger="pipelines.streaming.kafka_source")
    with FlinkJobServer(log_path=tmp_path / "flink.log") as server:
        summary = build.run([*server.beam_flags(parallelism=2), *flags])

    readers = {
        record.args[0]: record.args[3]
        for record in caplog.records
        if record.msg.startswith("reader %d of %d") and record.args[2] == events_topic  # type: ignore[index]
    }
    assert readers == {1: [0], 2: [1]}, readers
    assert all(
        record.args[1] == PARTITIONS  # type: ignore[index]
        for record in caplog.records
        if record.msg.startswith("reader %d of %d")
    )
    gauges = summary["gauges"]
    assert {gauges[f"consumer_lag_records.{p}"] for p in range(PARTITIONS)} == {0}
    assert summary["distributions"]["watermark_delay_ms"]["count"] > 0

    examples = []
    for value in read_topic(kafka_settings, examples_topic):
        decoded = decode_example_message(value)
        assert decoded.examples is not None, decoded.reason
        examples.append(decoded.examples)
    got = pa.concat_tables(examples).sort_by("example_id")
    expected = reference.examples
    assert got.num_rows == expected.num_rows > 0
    for name in expected.column_names:
        column = got.column(name).cast(expected.schema.field(name).type)
        assert column.equals(expected.column(name)), name
    counts = summary["counts"]
    assert counts["events_read"] == tables.events.num_rows
    assert counts["examples_published"] == expected.num_rows
