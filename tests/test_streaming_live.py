"""The streaming job is incremental: it releases while the stream is live.

Three bursts of one generated world, a day of event time each (the label
window is a day), go to the events topic one after the other while the job
runs on Prism. Once the second burst is in, the source's watermark has passed
the end of the first burst's label windows, so its examples must reach the
examples topic, and its dead letters the dead-letter topic, before the third
burst is published. After the third, the bounded run ends and the topic
holds every example of the batch reference exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from benchmarks.generated import generated_tables
from features.example_messages import decode_example_message
from features.kafka import KafkaSettings, ensure_topics, topic_records
from pipelines.sources.event_stream import publish_events, publish_raw
from pipelines.sources.synthetic import GeneratorConfig, validation_now_ms
from tests.test_streaming_restart import _job

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONFIG = GeneratorConfig(users=40, ads=15, days=3, seed=5)
NOW = validation_now_ms(CONFIG)
ROOT = Path(__file__).resolve().parents[1]
DAY_MS = 86_400_000
IDLE_SECONDS = 15.0
GARBAGE = b"{not json"


def _bursts(events: pa.Table) -> list[pa.Table]:
    times = events.column("event_time").cast(pa.int64())
    start = pc.min(times).as_py()
    day = pc.divide(pc.subtract(times, start), DAY_MS)
    return [events.filter(pc.equal(day, k)) for k in range(CONFIG.days)]


def _examples(settings: KafkaSettings, topic: str) -> pa.Table | None:
    tables = []
    for record in topic_records(settings, topic):
        decoded = decode_example_message(record.value)
        assert decoded.examples is not None, decoded.reason
        tables.append(decoded.examples)
    return pa.concat_tables(tables) if tables else None


def _wait_for_examples(
    settings: KafkaSettings, topic: str, job: subprocess.Popen[bytes]
) -> pa.Table:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert job.poll() is None, "the job ended before the stream did"
        found = _examples(settings, topic)
        if found is not None:
            return found
        time.sleep(0.5)
    raise AssertionError("no example reached the topic while the stream was live")


def test_the_first_burst_is_released_before_the_last_is_published(
    tmp_path: Path, kafka_settings: KafkaSettings
) -> None:
    data = tmp_path / "gen"
    tables = generated_tables(CONFIG, data)
    events = tables.events
    bursts = _bursts(events)
    assert sum(b.num_rows for b in bursts) == events.num_rows
    second_starts = pc.min(bursts[1].column("event_time").cast(pa.int64())).as_py()
    suffix = uuid.uuid4().hex[:8]
    topics = (f"ev-{suffix}", f"ex-{suffix}")
    ensure_topics(kafka_settings, {topics[0]: 2, topics[1]: 4})
    command = _job(
        kafka_settings,
        data,
        tmp_path / "out",
        topics,
        idle_seconds=IDLE_SECONDS,
        now_ms=NOW,
    )
    with open(tmp_path / "job.log", "wb") as log:
        job = subprocess.Popen(
            command, cwd=ROOT, stdout=log, stderr=log, start_new_session=True
        )
    try:
        publish_events(bursts[0], kafka_settings, topics[0])
        publish_raw([GARBAGE], kafka_settings, topics[0], key=b"0")
        publish_events(bursts[1], kafka_settings, topics[0])
        live = _wait_for_examples(kafka_settings, topics[1], job)
        dead = list(topic_records(kafka_settings, f"{topics[0]}.dead-letter"))
        assert job.poll() is None, "the job ended before the last burst"
        publish_events(bursts[2], kafka_settings, topics[0])
        returncode = job.wait(timeout=240)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)  # with its Prism
            job.wait()
    assert returncode == 0, (tmp_path / "job.log").read_text(errors="replace")[-3000:]

    # Released live: impressions of the first burst only, and its dead letter.
    live_times = live.column("event_time").cast(pa.int64())
    assert pc.max(live_times).as_py() < second_starts
    assert [json.loads(r.value)["payload"] for r in dead] == [GARBAGE.decode()]

    # In the end: every example of the batch reference, exactly once.
    reference = tables.reference()
    final = _examples(kafka_settings, topics[1])
    assert final is not None
    ids = final.column("example_id").to_pylist()
    assert len(ids) == len(set(ids)), "an example was published twice"
    assert set(ids) == set(reference.examples.column("example_id").to_pylist())
    assert set(live.column("example_id").to_pylist()) <= set(ids)
