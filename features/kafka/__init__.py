"""Kafka: client settings and topic administration.

The embedded broker that tests and demos start is :mod:`launchers.kafka_broker`.
"""

from __future__ import annotations

from features.kafka.settings import KafkaSettings, add_kafka_arguments
from features.kafka.topics import ensure_topics, topic_records

__all__ = [
    "KafkaSettings",
    "add_kafka_arguments",
    "ensure_topics",
    "topic_records",
]
