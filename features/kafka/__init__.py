"""Kafka: client settings, topic administration and the embedded broker."""

from features.kafka import client_fixes
from features.kafka.broker import BrokerStartError, EmbeddedKafka, kafka_cluster
from features.kafka.settings import KafkaSettings, add_kafka_arguments
from features.kafka.topics import ensure_topics, topic_records

client_fixes.apply()

__all__ = [
    "BrokerStartError",
    "EmbeddedKafka",
    "KafkaSettings",
    "add_kafka_arguments",
    "ensure_topics",
    "kafka_cluster",
    "topic_records",
]
