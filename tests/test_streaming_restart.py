"""Reliability of the streaming job: SIGKILL mid-run, restart, nothing lost and
nothing published twice.

The mechanism under test (``pipelines/streaming/publish.py``): the restarted
job replays the events topic and rebuilds its state; its publisher reads the
example ids already on the examples topic (the ledger) and drops those, so
the topic ends with every example exactly once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from features.example_messages import decode_example_message
from features.kafka import KafkaSettings, ensure_topics
from pipelines.event_stream import publish_events
from pipelines.reference import build_reference, read_input
from pipelines.synthetic import GeneratorConfig, generate_dataset, validation_now_ms
from tests.test_streaming_job import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONFIG = GeneratorConfig(users=40, ads=15, days=3, seed=8)
NOW = validation_now_ms(CONFIG)
ROOT = Path(__file__).resolve().parents[1]


def _job(
    settings: KafkaSettings, data: Path, out: Path, topics: tuple[str, str]
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pipelines.build",
        "--streaming",
        "--runner=FnApiRunner",
        f"--input={data}",
        f"--output={out}",
        f"--kafka-bootstrap={settings.bootstrap}",
        f"--events-topic={topics[0]}",
        f"--examples-topic={topics[1]}",
        "--shards=4",
        "--entity-shards=2",
        "--release-granularity-ms=3600000",
        "--stream-idle-seconds=0.5",
        f"--now-ms={NOW}",
    ]


def _example_ids(settings: KafkaSettings, topic: str) -> list[str]:
    ids: list[str] = []
    for value in read_topic(settings, topic):
        decoded = decode_example_message(value)
        assert decoded.examples is not None, decoded.reason
        ids += decoded.examples.column("example_id").to_pylist()
    return ids


def test_sigkill_and_restart_lose_nothing_and_duplicate_nothing(
    tmp_path: Path, kafka_settings: KafkaSettings
) -> None:
    generate_dataset(CONFIG, tmp_path / "gen")
    events, users, ads, contents = read_input(tmp_path / "gen")
    expected = set(
        build_reference(events, users, ads, contents, now_ms=NOW)
        .examples.column("example_id")
        .to_pylist()
    )
    suffix = uuid.uuid4().hex[:8]
    topics = (f"ev-{suffix}", f"ex-{suffix}")
    ensure_topics(kafka_settings, {topics[0]: 2})
    publish_events(events, kafka_settings, topics[0])

    # First run: killed (SIGKILL, no cleanup) once examples start to appear.
    first = subprocess.Popen(
        _job(kafka_settings, tmp_path / "gen", tmp_path / "out1", topics),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and first.poll() is None:
            ensure_topics(kafka_settings, {topics[1]: 4})
            if _example_ids(kafka_settings, topics[1]):
                break
            time.sleep(0.2)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    before = _example_ids(kafka_settings, topics[1])
    assert before, "the first run published nothing before it was killed"

    # Second run: replays the events, publishes only what is missing.
    second = subprocess.run(
        _job(kafka_settings, tmp_path / "gen", tmp_path / "out2", topics),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    counts = json.loads((tmp_path / "out2" / "stream_summary.json").read_text())[
        "counts"
    ]
    after = _example_ids(kafka_settings, topics[1])
    assert len(after) == len(set(after)), "an example was published twice"
    assert set(after) == expected, "an example was lost"
    # The restart recomputed everything and the ledger dropped what was there.
    assert counts["examples"] == len(expected)
    assert counts.get("examples_already_published", 0) == len(set(before))
    assert counts.get("examples_published", 0) == len(expected) - len(set(before))
