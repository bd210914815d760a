"""kafka-python's group join, as this project's consumers use it (short polls,
fresh groups on fresh topics), on the real broker: every consumer gets its
partitions. Without :mod:`features.kafka.client_fixes` about 1 in 5 of these
joins left the consumer with no partitions for good."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer

from features.kafka import KafkaSettings, client_fixes

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
JOINS = 10
RECORDS = 20


def test_the_fix_is_applied_to_the_pinned_client() -> None:
    from kafka.coordinator.consumer import ConsumerCoordinator

    assert client_fixes.apply()
    assert getattr(ConsumerCoordinator.need_rejoin, "_gem_fixed", False)


def test_the_fix_is_applied_when_a_client_is_built_not_on_import() -> None:
    """A command that never builds a client never imports kafka-python; every
    client KafkaSettings builds gets the fix first."""
    probe = (
        "import sys\n"
        "from features.kafka import KafkaSettings\n"
        "assert 'kafka' not in sys.modules\n"
        "try:\n"
        "    KafkaSettings(bootstrap=None).consumer()\n"
        "except ValueError:\n"
        "    pass\n"
        "from kafka.coordinator.consumer import ConsumerCoordinator\n"
        "assert ConsumerCoordinator.need_rejoin._gem_fixed\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=ROOT)


def test_fresh_consumers_on_fresh_topics_all_get_their_partitions(
    kafka_settings: KafkaSettings, kafka_topic: Callable[[int], str]
) -> None:
    stuck = []
    for _ in range(JOINS):
        topic = kafka_topic(2)
        producer = KafkaProducer(**kafka_settings.client_config())
        for i in range(RECORDS):
            producer.send(topic, b"x", partition=i % 2)
        producer.close()
        consumer = KafkaConsumer(
            **kafka_settings.consumer_config(
                group_id=f"g-{uuid.uuid4().hex}",
                enable_auto_commit=False,
                auto_offset_reset="earliest",
            )
        )
        consumer.subscribe([topic])
        received, deadline = 0, time.monotonic() + 20
        try:
            while received < RECORDS and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=200, max_records=8).values():
                    received += len(records)
        finally:
            consumer.close()
        if received < RECORDS:
            stuck.append(topic)
    assert not stuck, f"{len(stuck)} of {JOINS} consumers never got their partitions"


def test_the_clients_noise_is_dropped_and_its_other_lines_kept() -> None:
    import logging

    client_fixes.apply()
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep()
    selector = logging.getLogger("kafka.net.selector")
    transport = logging.getLogger("kafka.net.transport")
    for logger in (selector, transport):
        logger.addHandler(handler)
        # Whatever level a command set on "kafka" earlier in this process.
        logger.setLevel(logging.DEBUG)
    try:
        selector.warning(
            "Task %r ran for %.3fs (>%.3fs threshold). It is blocking the event "
            "loop -- likely a tight sync loop inside a coroutine.",
            "t",
            0.2,
            0.1,
        )
        transport.error(
            "%s: Error receiving network data closing socket",
            "<KafkaTCPTransport [none] (closed)>",
        )
        selector.warning("IO loop failed")
        transport.error(
            "%s: Error receiving network data closing socket",
            "<KafkaTCPTransport [127.0.0.1:9092]>",
        )
    finally:
        for logger in (selector, transport):
            logger.removeHandler(handler)
            logger.setLevel(logging.NOTSET)
    assert seen == [
        "IO loop failed",
        "<KafkaTCPTransport [127.0.0.1:9092]>: Error receiving network data "
        "closing socket",
    ]
