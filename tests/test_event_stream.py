"""Raw events through a real broker: nothing lost, bad messages set aside."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from kafka import TopicPartition

from features.events import EVENT_SCHEMA, events_from_records
from features.kafka import KafkaSettings
from pipelines.sources.event_stream import publish_events, publish_raw, read_events
from pipelines.sources.synthetic import read_events as read_generated

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_780_000_000_000


def _events(n: int, users: int = 7) -> pa.Table:
    records: list[dict[str, Any]] = []
    for i in range(n):
        records.append(
            {
                "schema_version": 1,
                "event_id": f"e-{i}",
                "event_time": T0 + 1000 * ((i * 7919) % n),  # shuffled times
                "user_id": i % users,
                "domain": "messaging",
                "surface": "thread",
                "action": "message",
                "content_id": i,
            }
        )
    return events_from_records(records)


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by("event_id")


def test_publish_and_read_back_everything_in_user_order(
    kafka_settings: KafkaSettings, kafka_topic: Callable[[int], str]
) -> None:
    topic = kafka_topic(3)
    table = _events(500)
    sent = publish_events(table, kafka_settings, topic)
    assert sent.messages == 500
    report = read_events(kafka_settings, topic, group_id=f"g-{uuid.uuid4().hex}")
    assert report.messages == 500
    assert report.dead_letters == []
    assert report.events.schema == EVENT_SCHEMA
    assert _sorted(report.events).equals(_sorted(table))
    # Keyed by user: every user's events arrive in event-time order.
    assert report.out_of_order_users == 0
    assert len(report.per_partition) == 3


def test_bad_messages_become_dead_letters_and_counts_balance(
    kafka_settings: KafkaSettings, kafka_topic: Callable[[int], str]
) -> None:
    topic, dlq = kafka_topic(1), kafka_topic(1)
    publish_events(_events(20), kafka_settings, topic)
    bad = [
        b"\xc3\x28 not utf-8",
        b"{truncated",
        json.dumps({"x": 1}).encode(),
        json.dumps({"schema_version": 1, "event_id": "z", "event_time": -1}).encode(),
    ]
    publish_raw(bad, kafka_settings, topic, key=b"poison")
    report = read_events(
        kafka_settings,
        topic,
        group_id=f"g-{uuid.uuid4().hex}",
        dead_letter_topic=dlq,
    )
    assert report.messages == 24
    assert report.events.num_rows + len(report.dead_letters) == report.messages
    assert report.events.num_rows == 20
    reasons = [d.reason for d in report.dead_letters]
    assert reasons[0].startswith("not UTF-8")
    assert reasons[1].startswith("not JSON")
    assert reasons[2] == "unknown field(s) 'x'"
    assert reasons[3].startswith("field 'event_time' is -1, below the minimum")
    assert [d.offset for d in report.dead_letters] == [20, 21, 22, 23]
    assert all(d.partition == 0 for d in report.dead_letters)

    # The dead-letter topic holds the original bytes with reason headers.
    consumer = kafka_settings.consumer(consumer_timeout_ms=1500)
    consumer.assign([TopicPartition(dlq, 0)])
    consumer.seek_to_beginning()
    copies = list(consumer)
    consumer.close()
    assert [c.value for c in copies] == bad
    headers = dict(copies[1].headers)
    assert headers["dead-letter-reason"].decode() == reasons[1]
    assert headers["dead-letter-offset"] == b"21"


def test_committed_offsets_resume_where_the_group_stopped(
    kafka_settings: KafkaSettings, kafka_topic: Callable[[int], str]
) -> None:
    topic = kafka_topic(2)
    group = f"g-{uuid.uuid4().hex}"
    first, second = _events(40), _events(60).slice(40)
    publish_events(first, kafka_settings, topic)
    assert read_events(kafka_settings, topic, group_id=group).messages == 40
    publish_events(second, kafka_settings, topic)
    again = read_events(kafka_settings, topic, group_id=group)
    assert _sorted(again.events).equals(_sorted(second))


def test_rate_paces_the_producer(
    kafka_settings: KafkaSettings, kafka_topic: Callable[[int], str]
) -> None:
    topic = kafka_topic(1)
    report = publish_events(_events(200), kafka_settings, topic, rate=400)
    # 200 events at 400/s take about half a second; never much faster.
    assert report.seconds >= 0.45
    assert report.rate <= 440


def test_generator_cli_publishes_its_events_at_a_rate(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    topic = f"gen-{uuid.uuid4().hex[:8]}"
    assert kafka_settings.bootstrap is not None
    out = subprocess.run(
        [
            sys.executable, "-m", "pipelines.generate",
            "--users", "40", "--ads", "10", "--days", "1", "--seed", "5",
            "--output", str(tmp_path),
            "--kafka-bootstrap", kafka_settings.bootstrap,
            "--topic", topic, "--partitions", "2", "--rate", "3000",
        ],
        check=True, capture_output=True, text=True, cwd=ROOT,
    ).stdout  # fmt: skip
    summary = json.loads(out)
    sent = summary["kafka"]["messages"]
    assert sent == summary["events"] > 0
    assert summary["kafka"]["rate"] <= 3300
    report = read_events(kafka_settings, topic, group_id=f"g-{uuid.uuid4().hex}")
    assert report.messages == sent
    assert report.dead_letters == []
    assert _sorted(report.events).equals(_sorted(read_generated(tmp_path)))
