"""The streaming publisher's transactions on a real broker: a restart learns
what is on the examples topic from the committed release horizons, not from
the topic's records; a second publisher with the same transactional id fences
the first, which is refused with a clear error; an open transaction is never
read.

The whole job under SIGKILL is ``test_streaming_restart.py``.
"""

from __future__ import annotations

import uuid

import pytest

from features.kafka import KafkaSettings, ensure_topics, topic_records
from pipelines.streaming.example_transactions import (
    NO_HORIZON,
    Message,
    PartitionPublisher,
    PublisherFencedError,
    horizon_group,
    horizon_metadata,
    parse_horizon,
    transactional_id,
)

pytestmark = pytest.mark.integration

PARTITIONS = 2


def _topic(settings: KafkaSettings) -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:8]
    topic = f"ex-{suffix}"
    ensure_topics(settings, {topic: PARTITIONS})
    return topic, f"job-{suffix}"


def _messages(tag: str, count: int, at: int) -> list[Message]:
    """``count`` messages of the release at ``at``."""
    return [
        Message(at=at, key=b"0", value=f"{tag}-{i}".encode(), headers=[])
        for i in range(count)
    ]


def _values(settings: KafkaSettings, topic: str) -> list[bytes]:
    return [record.value for record in topic_records(settings, topic)]


def test_a_restart_reads_the_horizons_not_the_topic(
    kafka_settings: KafkaSettings,
) -> None:
    topic, group = _topic(kafka_settings)
    first = PartitionPublisher(kafka_settings, topic, group, 1, PARTITIONS)
    first.start()
    assert first.horizon == NO_HORIZON
    for release in range(1, 21):
        assert first.publish(
            _messages(f"r{release}", 250, release * 60_000), release * 60_000
        )
    first.close()
    assert len(_values(kafka_settings, topic)) == 20 * 250

    # The records go (as retention would take them): a restart that needed
    # them to know what was published would now publish everything again.
    from kafka import TopicPartition

    admin = kafka_settings.admin()
    try:
        tp = TopicPartition(topic, 1)
        end = admin.list_group_offsets({horizon_group(group): [tp]})
        assert end[horizon_group(group)][tp].offset > 5000  # past the markers
        admin.delete_records({tp: end[horizon_group(group)][tp].offset})
    finally:
        admin.close()
    assert _values(kafka_settings, topic) == []

    restarted = PartitionPublisher(kafka_settings, topic, group, 1, PARTITIONS)
    restarted.start()
    assert restarted.horizon == 20 * 60_000
    # A recomputed release at or below the horizon is not sent again ...
    assert not restarted.publish(_messages("r20", 250, 20 * 60_000), 20 * 60_000)
    # ... a later one is.
    assert restarted.publish(_messages("r21", 3, 21 * 60_000), 21 * 60_000)
    restarted.close()
    assert _values(kafka_settings, topic) == [f"r21-{i}".encode() for i in range(3)]
    # The other partition's horizon is its own.
    other = PartitionPublisher(kafka_settings, topic, group, 0, PARTITIONS)
    other.start()
    assert other.horizon == NO_HORIZON
    other.close()


def test_a_second_publisher_with_the_same_id_fences_the_first(
    kafka_settings: KafkaSettings,
) -> None:
    topic, group = _topic(kafka_settings)
    first = PartitionPublisher(kafka_settings, topic, group, 0, PARTITIONS)
    first.start()
    assert first.publish(_messages("first", 2, 60_000), 60_000)
    second = PartitionPublisher(kafka_settings, topic, group, 0, PARTITIONS)
    second.start()  # a second copy of the job, same group
    assert second.horizon == 60_000

    with pytest.raises(PublisherFencedError) as refused:
        first.publish(_messages("zombie", 2, 120_000), 120_000)
    message = str(refused.value)
    assert first.transactional_id in message
    assert "second copy of this job" in message
    # It stays refused, without taking the id back from the second one.
    with pytest.raises(PublisherFencedError):
        first.publish(_messages("zombie", 2, 180_000), 180_000)
    with pytest.raises(PublisherFencedError):
        first.start()
    assert second.publish(_messages("second", 2, 120_000), 120_000)
    second.close()
    assert _values(kafka_settings, topic) == [
        b"first-0",
        b"first-1",
        b"second-0",
        b"second-1",
    ]


def test_an_open_transaction_is_not_read_and_is_aborted_by_the_next_producer(
    kafka_settings: KafkaSettings,
) -> None:
    """What a SIGKILL mid-transaction leaves: sent records, no commit."""
    topic, group = _topic(kafka_settings)
    kept = PartitionPublisher(kafka_settings, topic, group, 0, PARTITIONS)
    kept.start()
    assert kept.publish(_messages("kept", 1, 60_000), 60_000)
    kept.close()
    producer = kafka_settings.producer(
        transactional_id=transactional_id(group, topic, 0)
    )
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(topic, value=b"in-doubt", partition=0).get(timeout=10)
    assert _values(kafka_settings, topic) == [b"kept-0"]

    restarted = PartitionPublisher(kafka_settings, topic, group, 0, PARTITIONS)
    restarted.start()  # aborts the open transaction
    assert restarted.horizon == 60_000
    assert restarted.publish(_messages("again", 1, 120_000), 120_000)
    restarted.close()
    assert _values(kafka_settings, topic) == [b"kept-0", b"again-0"]
    producer.close(timeout=1)


def test_horizons_of_another_partition_count_are_refused() -> None:
    assert parse_horizon("", 4, "ex/0") == NO_HORIZON
    assert parse_horizon(horizon_metadata(123, 4), 4, "ex/0") == 123
    with pytest.raises(RuntimeError, match="new --kafka-group-id"):
        parse_horizon(horizon_metadata(123, 4), 8, "ex/0")
