"""One examples-topic partition's transactional publisher and its release horizon.

The streaming job publishes example messages exactly once with Kafka
transactions, one transactional producer per partition of the examples
topic (transactional id ``<group>.<topic>.<partition>``). Each transaction
carries every message of the releases up to some event time ``T`` not yet
published, and commits, atomically with them, the partition's **release
horizon** ``T``: the offset metadata of that partition in the consumer
group ``<group>.examples`` (``send_offsets_to_transaction``; the committed
offset is the end of what the job published there). So after any crash the
group says exactly which releases are on the topic: those at or below the
horizon, and no others (an open transaction is aborted when the next
producer with its id starts, and read-committed readers never see it).

A restarted publisher reads the horizons (one OffsetFetch, constant in the
topic's length) and drops the releases at or below them; it never reads the
examples topic.

Starting a producer with a transactional id fences every older producer with
that id: a second copy of the job (same group) takes the partitions over and
the first one is refused with :class:`PublisherFencedError` at its next commit.
A fenced publisher stays fenced in its process: starting again would fence
the other copy in turn.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from features.kafka import KafkaSettings

log = logging.getLogger(__name__)

NO_HORIZON: Final = -(2**63)
"""The horizon of a partition nothing was published to yet."""
RETRY_BACKOFF_MS: Final = 10
"""kafka-python retries a partition added to a transaction right after the
previous commit (the coordinator is still completing it) after this; its
100 ms default is most of a short transaction's time."""
RETRY_FOR_S: Final = 300.0
"""How long a partition's transaction is retried through broker outages."""


class PublisherFencedError(RuntimeError):
    """Another producer took this partition's transactional id over."""


@dataclass(frozen=True)
class Message:
    """One example message of the release at event time ``at``, ready to send."""

    at: int
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    examples: int = 0
    """Examples in the message (for counting)."""


def horizon_group(group: str) -> str:
    """The consumer group whose offset metadata holds the release horizons."""
    return f"{group}.examples"


def transactional_id(group: str, topic: str, partition: int) -> str:
    """The transactional id of one partition's publisher."""
    return f"{group}.{topic}.{partition}"


def horizon_metadata(horizon_ms: int, partitions: int) -> str:
    """The offset metadata committed with a transaction."""
    return json.dumps({"horizon_ms": horizon_ms, "partitions": partitions})


def parse_horizon(metadata: str, partitions: int, where: str) -> int:
    """The horizon in ``metadata`` (``NO_HORIZON`` when empty).

    Raises:
        RuntimeError: the horizon was committed when the topic had another
            partition count (releases map to partitions by count, so the
            horizons no longer say what each partition holds).
    """
    if not metadata:
        return NO_HORIZON
    stored = json.loads(metadata)
    if stored["partitions"] != partitions:
        raise RuntimeError(
            f"{where}: release horizons were committed with "
            f"{stored['partitions']} examples-topic partitions, the topic has "
            f"{partitions}: start the job under a new --kafka-group-id"
        )
    return int(stored["horizon_ms"])


def read_horizons(
    settings: KafkaSettings,
    group: str,
    topic: str,
    partitions: Sequence[int],
    count: int,
) -> dict[int, int]:
    """Each partition's committed horizon (one request, no topic read)."""
    from kafka import TopicPartition

    tps = [TopicPartition(topic, p) for p in partitions]
    admin = settings.admin()
    try:
        offsets = admin.list_group_offsets({horizon_group(group): tps})
    finally:
        admin.close()
    found = offsets.get(horizon_group(group), {})
    return {
        tp.partition: parse_horizon(
            found[tp].metadata if tp in found else "", count, f"{topic}/{tp.partition}"
        )
        for tp in tps
    }


def _fenced(error: BaseException, producer: Any) -> bool:
    from kafka.errors import InvalidProducerEpochError, ProducerFencedError

    fencing = (ProducerFencedError, InvalidProducerEpochError)
    # After a fencing, every transactional call raises a plain KafkaError
    # naming the state; the manager keeps the error that caused it.
    manager = getattr(producer, "_transaction_manager", None)
    cause = getattr(manager, "last_error", None)
    return isinstance(error, fencing) or isinstance(cause, fencing)


class PartitionPublisher:
    """Transactions on one examples-topic partition (module docstring).

    Args:
        settings: the cluster.
        topic: the examples topic.
        group: the job's consumer group (names the horizon group and the
            transactional id).
        partition: this publisher's partition.
        partitions: the topic's partition count (checked against the one the
            horizon was committed with).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        group: str,
        partition: int,
        partitions: int,
    ) -> None:
        self.topic = topic
        self.group = group
        self.partition = partition
        self.partitions = partitions
        self.transactional_id = transactional_id(group, topic, partition)
        self._settings = settings
        self._producer: Any = None
        self._fenced: str | None = None
        self._lock = threading.Lock()
        self.horizon = NO_HORIZON
        self.starts = 0
        """Producers started (1, plus one per recovery from a broker error)."""

    def start(self) -> None:
        """Start the producer (aborting what an earlier one left open, and
        fencing it) and read the partition's horizon, retried through broker
        errors for :data:`RETRY_FOR_S`."""
        from kafka.errors import KafkaError

        deadline = time.monotonic() + RETRY_FOR_S
        while True:
            self._check_not_fenced()
            try:
                self._start_once()
                return
            except KafkaError as error:
                if time.monotonic() > deadline:
                    raise
                self._retry_after(error, "start")

    def _retry_after(self, error: BaseException, what: str) -> None:
        log.warning(
            "%s: %s failed (%s: %s); retrying with a new producer",
            self.transactional_id,
            what,
            type(error).__name__,
            error,
        )
        self.close()
        time.sleep(1.0)

    def _start_once(self) -> None:
        producer = self._settings.producer(
            throughput=True,
            transactional_id=self.transactional_id,
            retry_backoff_ms=RETRY_BACKOFF_MS,
        )
        try:
            producer.init_transactions()
        except BaseException:
            producer.close(timeout=5)
            raise
        self._producer = producer
        self.horizon = read_horizons(
            self._settings, self.group, self.topic, [self.partition], self.partitions
        )[self.partition]
        self.starts += 1

    @property
    def started(self) -> bool:
        """Whether a producer is up (and the horizon read)."""
        return self._producer is not None

    def publish(self, messages: Sequence[Message], horizon_ms: int) -> list[Message]:
        """The ``messages`` above the horizon, and the horizon ``horizon_ms``,
        in one transaction; the messages that went (none: all were at or
        below the horizon already).

        Retried through broker errors for :data:`RETRY_FOR_S`: each retry
        starts a new producer, which settles the transaction in doubt, and
        reads the horizon again (a horizon at ``horizon_ms`` means the
        transaction in doubt committed).

        Raises:
            PublisherFencedError: another producer holds the transactional id.
        """
        if not messages:
            raise ValueError("a transaction needs at least one message")
        with self._lock:
            return self._publish(messages, horizon_ms)

    def _publish(self, messages: Sequence[Message], horizon_ms: int) -> list[Message]:
        from kafka.errors import KafkaError

        deadline = time.monotonic() + RETRY_FOR_S
        while True:
            if self._producer is None:
                self.start()
            fresh = [m for m in messages if m.at > self.horizon]
            if not fresh:
                return []
            try:
                self._transaction(fresh, max(horizon_ms, self.horizon))
                self.horizon = max(horizon_ms, self.horizon)
                return fresh
            except KafkaError as error:
                if _fenced(error, self._producer):
                    self._fence(error)
                if time.monotonic() > deadline:
                    raise
                self._retry_after(error, "transaction")

    def _transaction(self, messages: Sequence[Message], horizon_ms: int) -> None:
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        producer = self._producer
        producer.begin_transaction()
        sent = [
            producer.send(
                self.topic,
                key=m.key,
                value=m.value,
                headers=m.headers,
                partition=self.partition,
            )
            for m in messages
        ]
        producer.flush()
        end = max(future.get().offset for future in sent) + 1
        producer.send_offsets_to_transaction(
            {
                TopicPartition(self.topic, self.partition): OffsetAndMetadata(
                    end, horizon_metadata(horizon_ms, self.partitions), -1
                )
            },
            horizon_group(self.group),
        )
        producer.commit_transaction()

    def _fence(self, error: BaseException) -> None:
        self._fenced = (
            f"examples partition {self.topic}/{self.partition}: another publisher "
            f"started with transactional id {self.transactional_id!r} (a second "
            "copy of this job, same --kafka-group-id?); this one stops publishing"
        )
        self.close()
        raise PublisherFencedError(self._fenced) from error

    def _check_not_fenced(self) -> None:
        if self._fenced is not None:
            raise PublisherFencedError(self._fenced)

    def close(self) -> None:
        """Close the producer (an open transaction is aborted by the next)."""
        if self._producer is not None:
            producer, self._producer = self._producer, None
            producer.close(timeout=5)


_OPEN: dict[str, PartitionPublisher] = {}
_OPEN_LOCK = threading.Lock()


def partition_publisher(
    settings: KafkaSettings, topic: str, group: str, partition: int, partitions: int
) -> PartitionPublisher:
    """The process's publisher of ``partition``, shared by every instance of
    the publishing DoFn in it: two producers with one transactional id in one
    process would fence each other."""
    key = transactional_id(group, topic, partition)
    with _OPEN_LOCK:
        found = _OPEN.get(key)
        if found is None:
            found = PartitionPublisher(settings, topic, group, partition, partitions)
            _OPEN[key] = found
    return found
