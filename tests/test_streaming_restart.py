"""Reliability of the streaming job on a real broker: a SIGKILL mid-publish
and a restart lose nothing and publish nothing twice; a broker SIGKILLed and
restarted on its log directory is waited out and nothing is lost.

The restart mechanism (``pipelines/streaming/publish.py``): the job publishes
in Kafka transactions, each with its partition's release horizon; the
restarted job replays the events topic and rebuilds its state, its publisher
reads the horizons (not the topic) and drops the releases at or below them,
so the topic's committed records hold every example exactly once.

The outage mechanism (``pipelines/streaming/kafka_source.py``): a bounded run
stops a partition only after a full idle period that began and ended with a
prompt broker round trip; time the broker spent unresponsive does not count
as idle, so a pause longer than ``--stream-idle-seconds`` does not end the
run early.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from benchmarks.generated import generated_tables
from demos.stream.processes import streaming_job_command
from features.example_messages import decode_example_message
from features.kafka import KafkaSettings, ensure_topics
from launchers.kafka_broker import EmbeddedKafka
from pipelines.sources.event_stream import PublishReport, publish_events
from pipelines.sources.synthetic import GeneratorConfig, validation_now_ms
from tests.test_streaming_job import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONFIG = GeneratorConfig(users=40, ads=15, days=3, seed=8)
NOW = validation_now_ms(CONFIG)
ROOT = Path(__file__).resolve().parents[1]
SHARDS = 4


def _job(
    settings: KafkaSettings,
    data: Path,
    out: Path,
    topics: tuple[str, str],
    *,
    idle_seconds: float = 0.5,
    granularity_ms: int = 3_600_000,
    now_ms: int = NOW,
) -> list[str]:
    return streaming_job_command(
        settings,
        data,
        out,
        topics=topics,
        now_ms=now_ms,
        shards=SHARDS,
        idle_seconds=idle_seconds,
        granularity_ms=granularity_ms,
    )


def _example_ids(settings: KafkaSettings, topic: str) -> list[str]:
    ids: list[str] = []
    for value in read_topic(settings, topic):
        decoded = decode_example_message(value)
        assert decoded.examples is not None, decoded.reason
        ids += decoded.examples.column("example_id").to_pylist()
    return ids


def _generated(data: Path) -> tuple[pa.Table, set[str]]:
    """CONFIG's world written to ``data``: its events, and the ids of the
    batch reference job's examples of them."""
    tables = generated_tables(CONFIG, data)
    reference = tables.reference()
    return tables.events, set(reference.examples.column("example_id").to_pylist())


def _freeze_at_first_example(
    job: subprocess.Popen[bytes], settings: KafkaSettings, topic: str
) -> None:
    """SIGSTOP the job the moment the first committed example message
    reaches ``topic``.

    A tailing consumer (short fetch waits) sees the first committed
    transaction within tens of milliseconds, while the job is still releasing
    and sending the rest: freezing it there puts the SIGKILL that follows in
    the middle of the publishing, with some transactions committed and
    others open or not begun.
    """
    from kafka import TopicPartition

    consumer = settings.consumer(
        enable_auto_commit=False,
        fetch_max_wait_ms=20,
        isolation_level="read_committed",
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(SHARDS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and job.poll() is None:
            if consumer.poll(timeout_ms=20):
                os.kill(job.pid, signal.SIGSTOP)
                return
        raise AssertionError("the job published no example before it ended")
    finally:
        consumer.close()


def test_sigkill_mid_publish_and_restart_lose_nothing_and_duplicate_nothing(
    tmp_path: Path, kafka_settings: KafkaSettings
) -> None:
    data = tmp_path / "gen"
    events, expected = _generated(data)
    suffix = uuid.uuid4().hex[:8]
    topics = (f"ev-{suffix}", f"ex-{suffix}")
    ensure_topics(kafka_settings, {topics[0]: 2, topics[1]: SHARDS})
    publish_events(events, kafka_settings, topics[0])

    # First run: frozen at its first published example, then SIGKILLed (no
    # cleanup, producer buffers lost).
    first = subprocess.Popen(
        _job(kafka_settings, data, tmp_path / "out1", topics, granularity_ms=600_000),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the job and its Prism die together
    )
    try:
        _freeze_at_first_example(first, kafka_settings, topics[1])
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    before = _example_ids(kafka_settings, topics[1])
    assert len(before) == len(set(before))
    # The kill landed mid-run: some examples were out, not all of them.
    assert 0 < len(before) < len(expected), (len(before), len(expected))

    # Second run: replays the events, publishes only what is missing.
    second = subprocess.run(
        _job(kafka_settings, data, tmp_path / "out2", topics, granularity_ms=600_000),
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
    # The restart recomputed everything and dropped, by the horizons, exactly
    # what was committed before the kill; each partition's horizon was read
    # once.
    assert counts["examples"] == len(expected)
    assert counts.get("examples_already_published", 0) == len(before)
    assert counts.get("examples_published", 0) == len(expected) - len(before)
    assert counts.get("horizon_reads", 0) == SHARDS


OUTAGE_SECONDS = 4.0
IDLE_SECONDS = 1.0


def _wait_for_reader(log: Path, job: subprocess.Popen[bytes]) -> None:
    """Until the job's reader has its consumer (its log line says so)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job.poll() is None:
        if "reads partitions" in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(log.read_text(errors="replace")[-3000:])


def test_broker_crash_is_waited_out_and_nothing_is_lost(tmp_path: Path) -> None:
    """SIGKILL the broker mid-stream, leave it down for longer than the job's
    idle limit, restart it on the same log directory: the job waits, reads
    the rest, and loses nothing.

    The broker is this test's own (killing the session's would fail the
    others), and the stream is live: paced over the job's whole read, so the
    crash lands while the job is reading and the producer is sending.
    """
    data = tmp_path / "gen"
    events, expected = _generated(data)
    topics = ("events", "examples")
    with EmbeddedKafka(home=tmp_path / "kafka") as broker:
        settings = broker.settings
        ensure_topics(settings, {topics[0]: 2, topics[1]: SHARDS})
        sent: list[PublishReport] = []
        publisher = threading.Thread(
            target=lambda: sent.append(
                publish_events(events, settings, topics[0], rate=events.num_rows / 12)
            )
        )
        with open(tmp_path / "job.log", "wb") as job_log:
            job = subprocess.Popen(
                _job(
                    settings, data, tmp_path / "out", topics, idle_seconds=IDLE_SECONDS
                ),
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=job_log,
                start_new_session=True,
            )
        try:
            publisher.start()
            # The crash must land while the job reads: on a loaded machine the
            # job can take longer to start than the stream takes to publish.
            _wait_for_reader(tmp_path / "job.log", job)
            time.sleep(2.0)
            broker.kill()
            time.sleep(OUTAGE_SECONDS)
            broker.start()  # same port, same data
            publisher.join(timeout=120)
            returncode = job.wait(timeout=180)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)  # with its Prism
                job.wait()
        log = (tmp_path / "job.log").read_text(errors="replace")
        assert returncode == 0, log[-3000:]
        assert sent, "the publisher did not finish"
        assert sent[0].messages == events.num_rows
        counts = json.loads((tmp_path / "out" / "stream_summary.json").read_text())[
            "counts"
        ]
        after = _example_ids(settings, topics[1])
    # The reader saw the outage (an idle check found the broker unresponsive)
    # and did not take it for the end of the stream.
    assert counts.get("broker_quiet_probes", 0) >= 1, counts
    assert counts["events_read"] == events.num_rows, "an event was lost"
    assert len(after) == len(set(after)), "an example was published twice"
    assert set(after) == expected, "an example was lost"
