"""The base of the DoFns that send to one Kafka topic, in both Beam jobs."""

from __future__ import annotations

from typing import Any

import apache_beam as beam

from features.kafka import KafkaSettings


class KafkaSendFn(beam.DoFn):  # type: ignore[misc]
    """Sends to one topic with one producer per DoFn instance: opened in
    ``setup`` (by the subclass, :meth:`open_producer`), flushed before each
    bundle commits, closed at ``teardown``."""

    def __init__(self, settings: KafkaSettings, topic: str) -> None:
        self._settings = settings
        self._topic = topic
        self._producer: Any = None

    def open_producer(self, **overrides: Any) -> None:
        """The producer, tuned for throughput (``overrides`` win)."""
        self._producer = self._settings.producer(throughput=True, **overrides)

    def finish_bundle(self) -> None:
        """Everything sent in the bundle is acknowledged before it commits."""
        self._producer.flush()

    def teardown(self) -> None:
        """Close the producer."""
        if self._producer is not None:
            self._producer.close()
