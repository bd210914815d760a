"""Topic administration that works the same on the embedded broker and a cluster.

Every topic is created explicitly with its partition count: a broker that
auto-creates topics picks its own (``num.partitions``), and the partition
count decides how consumer groups split the work. Each allows messages of
:data:`~features.kafka.settings.MAX_MESSAGE_BYTES`, whatever the cluster's
default (1 MB on Apache Kafka).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final

from features.kafka.settings import MAX_MESSAGE_BYTES, KafkaSettings

log = logging.getLogger(__name__)

KAFKA_DEFAULT_MESSAGE_BYTES: Final = 1_048_588
"""Apache Kafka's default ``message.max.bytes``, for a cluster that will not say."""
RECORD_OVERHEAD_BYTES: Final = 16 * 1024
"""Room a record needs beyond its value: batch framing, key and headers."""


def ensure_topics(
    settings: KafkaSettings,
    topics: Mapping[str, int],
    *,
    replication_factor: int = 1,
    timeout: float = 10.0,
) -> None:
    """Create missing topics and wait until their metadata is visible.

    Existing topics are left as they are (with a warning when their partition
    count differs from the one asked for).

    Args:
        settings: the cluster.
        topics: topic name → partition count.
        replication_factor: replicas per partition (1 on the embedded broker).
        timeout: seconds to wait for the topics to appear in metadata.
    """
    from kafka.errors import TopicAlreadyExistsError

    admin = settings.admin()
    try:
        existing = set(admin.list_topics())
        wanted = {
            name: {
                "num_partitions": partitions,
                "replication_factor": replication_factor,
                "configs": {"max.message.bytes": str(MAX_MESSAGE_BYTES)},
            }
            for name, partitions in topics.items()
            if name not in existing
        }
        if wanted:
            try:
                admin.create_topics(wanted)
            except TopicAlreadyExistsError:
                pass  # created concurrently by another process
    finally:
        admin.close()

    # Wait for the metadata, so a producer right after us sees every partition.
    # No group and no auto-commit: a metadata probe only.
    probe = settings.consumer(group_id=None, enable_auto_commit=False)
    try:
        deadline = time.monotonic() + timeout
        for name, partitions in topics.items():
            while True:
                found = probe.partitions_for_topic(name)
                if found and len(found) >= partitions:
                    break
                if found and name in existing:
                    log.warning(
                        "topic %s exists with %d partitions, not %d",
                        name,
                        len(found),
                        partitions,
                    )
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"topic {name!r} did not show {partitions} partitions "
                        f"within {timeout:.0f} s"
                    )
                time.sleep(0.05)
                probe.topics()  # refresh the metadata cache
    finally:
        probe.close()


def topic_partitions(consumer: Any, topic: str) -> list[int]:
    """The partitions of ``topic``, in order, as ``consumer``'s cluster has them.

    Raises:
        ValueError: the topic does not exist.
    """
    partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        raise ValueError(f"Kafka topic {topic!r} does not exist")
    return sorted(partitions)


def topic_records(settings: KafkaSettings, topic: str) -> Iterator[Any]:
    """Every record of ``topic``, from its start to the end offsets seen now.

    No group: nothing is committed. Records published after the call begins
    are left out; a topic that does not exist yields nothing. Fetches allow
    messages of :data:`~features.kafka.settings.MAX_MESSAGE_BYTES`. Committed
    records only: a transactional producer's aborted or still open ones are
    not records of the topic (the end offsets are then the last stable ones).
    """
    from kafka import TopicPartition

    consumer = settings.consumer(
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
        fetch_max_bytes=2 * MAX_MESSAGE_BYTES,
    )
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=200, max_records=1000).values():
                yield from records
    finally:
        consumer.close()


def max_message_bytes(settings: KafkaSettings, topic: str) -> int:
    """The largest record ``topic`` accepts: its ``max.message.bytes``, else
    the broker's ``message.max.bytes``, else Kafka's default."""
    from kafka.admin import ConfigResource, ConfigResourceType

    admin = settings.admin()
    try:
        described: dict[str, Any] = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all"
        )
        value = (
            described.get("topic", {})
            .get(topic, {})
            .get("max.message.bytes", {})
            .get("value")
        )
        if value is None:
            broker_id = admin.describe_cluster()["brokers"][0]["broker_id"]
            described = admin.describe_configs(
                [ConfigResource(ConfigResourceType.BROKER, str(broker_id))],
                config_filter="all",
            )
            brokers: dict[str, Any] = described.get("broker", {})
            first: dict[str, Any] = next(iter(brokers.values()), {})
            value = first.get("message.max.bytes", {}).get("value")
    except Exception as error:
        log.warning(
            "cannot read max.message.bytes of %s (%s); assuming Kafka's default",
            topic,
            error,
        )
        value = None
    finally:
        admin.close()
    return int(value) if value else KAFKA_DEFAULT_MESSAGE_BYTES
