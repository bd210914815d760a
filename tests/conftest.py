"""Shared fixtures: a real Kafka-protocol broker for the whole session.

``kafka_settings`` starts the embedded Tansu broker once per test session, or,
when ``GEM_KAFKA_BOOTSTRAP`` is set, uses that cluster instead (so the same
tests run against a real Kafka). ``kafka_topic`` makes a fresh topic per test,
which keeps tests independent on a broker that never deletes data.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from features.kafka import EmbeddedKafka, KafkaSettings, ensure_topics

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """The shared real-data folder (``GEM_SHARED_DATA`` overrides)."""
    override = os.environ.get("GEM_SHARED_DATA")
    return Path(override) if override else REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def kafka_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaSettings]:
    """Settings of a running Kafka-protocol broker."""
    # Short group timings: the embedded broker makes joins wait half the
    # session timeout, and tests join many groups.
    timing = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}
    external = os.environ.get("GEM_KAFKA_BOOTSTRAP")
    if external:
        yield KafkaSettings(bootstrap=external, **timing)
        return
    log_path = tmp_path_factory.mktemp("kafka") / "tansu.log"
    with EmbeddedKafka(log_path=log_path) as broker:
        yield dataclasses.replace(broker.settings, **timing)


@pytest.fixture
def kafka_topic(kafka_settings: KafkaSettings) -> Callable[[int], str]:
    """Factory: ``kafka_topic(partitions)`` creates and returns a fresh topic."""

    def make(partitions: int = 1) -> str:
        name = f"test-{uuid.uuid4().hex[:12]}"
        ensure_topics(kafka_settings, {name: partitions})
        return name

    return make
