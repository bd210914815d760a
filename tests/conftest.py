"""Shared fixtures: a real Kafka-protocol broker for the whole session.

``kafka_settings`` starts the embedded Apache Kafka broker once per test
session, or, when ``GEM_KAFKA_BOOTSTRAP`` is set, uses that cluster instead.
``kafka_topic`` makes a fresh topic per test, which keeps tests independent on
one broker. ``reference`` is the tiny generated set the daemon tests train on,
and ``feed`` puts the three together (:mod:`tests.example_feed`). ``dataset``
is the synthetic data set of the requesting module's ``CONFIG``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from features.kafka import KafkaSettings, ensure_topics
from launchers.kafka_broker import EmbeddedKafka
from pipelines.core.reference import ReferenceOutput
from pipelines.sources.synthetic import generate_dataset
from tests.example_feed import ExampleFeed, tiny_reference

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """The shared real-data folder (``GEM_SHARED_DATA`` overrides)."""
    override = os.environ.get("GEM_SHARED_DATA")
    return Path(override) if override else REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def kafka_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaSettings]:
    """Settings of a running Kafka broker."""
    external = os.environ.get("GEM_KAFKA_BOOTSTRAP")
    if external:
        yield KafkaSettings(bootstrap=external)
        return
    with EmbeddedKafka(home=tmp_path_factory.mktemp("kafka")) as broker:
        yield broker.settings


@pytest.fixture
def kafka_topic(kafka_settings: KafkaSettings) -> Callable[[int], str]:
    """Factory: ``kafka_topic(partitions)`` creates and returns a fresh topic."""

    def make(partitions: int = 1) -> str:
        name = f"test-{uuid.uuid4().hex[:12]}"
        ensure_topics(kafka_settings, {name: partitions})
        return name

    return make


@pytest.fixture
def reference() -> ReferenceOutput:
    """The tiny generated set (never mutated); a module may define its own."""
    return tiny_reference()


@pytest.fixture
def feed(
    kafka_settings: KafkaSettings, kafka_topic: Callable[[int], str]
) -> ExampleFeed:
    """The session's broker, fresh topics on it and the tiny set's messages."""
    return ExampleFeed(kafka_settings, kafka_topic, tiny_reference())


@pytest.fixture(scope="module")
def dataset(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The data set the generator writes for the test module's ``CONFIG``
    (a :class:`~pipelines.sources.synthetic.GeneratorConfig`), once per module;
    a module may define its own."""
    root = tmp_path_factory.mktemp("dataset")
    generate_dataset(request.module.CONFIG, root)
    return root
