"""Kafka: client settings, topic administration and the embedded broker.

The broker's names are loaded on first use: ``python -m features.kafka.broker``
runs that module as ``__main__``, and an import of it here, before runpy
runs it, would load it twice (runpy's RuntimeWarning).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from features.kafka import client_fixes
from features.kafka.settings import KafkaSettings, add_kafka_arguments
from features.kafka.topics import ensure_topics, topic_records

if TYPE_CHECKING:
    from features.kafka.broker import BrokerStartError, EmbeddedKafka, kafka_cluster

client_fixes.apply()

_BROKER_NAMES = frozenset({"BrokerStartError", "EmbeddedKafka", "kafka_cluster"})

__all__ = [
    "BrokerStartError",
    "EmbeddedKafka",
    "KafkaSettings",
    "add_kafka_arguments",
    "ensure_topics",
    "kafka_cluster",
    "topic_records",
]


def __getattr__(name: str) -> Any:
    if name in _BROKER_NAMES:
        from features.kafka import broker

        return getattr(broker, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
