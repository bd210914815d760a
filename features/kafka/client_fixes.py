"""A fix to kafka-python 3.0.12's group consumer, applied where a client is built.

A consumer that leads its group and whose ``poll()`` times out while the
SyncGroup of a rebalance is in flight loses that rebalance: the response
arrives, but ``need_rejoin()`` already says no (the leader's own assignment
made its snapshots agree), so the join is never finished and the consumer
sits with no partitions, forever. Every fresh consumer meets this: its first
join often precedes its first metadata for the topic, and the metadata that
follows triggers exactly that second rebalance. Seen in 6 of 20 joins on
Apache Kafka 4.1 with 200 ms polls; ``tests/test_kafka_client_fixes.py``
reproduces it.

The fix: a join still in flight means the member must keep rejoining, so
the next poll finishes it (or starts it over). :class:`~features.kafka.KafkaSettings`
applies it before it builds any client (so a command that never talks to
Kafka never imports the client library). It is applied to the one
kafka-python version the lock pins and checked there by the test; another
version is left as it is, with a warning.

Two of the client's log lines are dropped where they are emitted
(:class:`ClientNoiseFilter`): the selector's "blocking the event loop"
warning, which on a busy shared CPU reports the scheduler, not a bug; and
the traceback of a read on a transport already closed by another thread
(the consumer's own shutdown), after which the client reconnects or stops
as it should. Every other warning and error of the client is kept.
"""

from __future__ import annotations

import logging
from typing import Any, Final

log = logging.getLogger(__name__)

FIXED_VERSION: Final = "3.0.12"


class ClientNoiseFilter(logging.Filter):
    """Drops the two kafka-python log lines described in the module docstring."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.name == "kafka.net.selector":
            return "blocking the event loop" not in message
        if record.name == "kafka.net.transport":
            return not ("(closed)>" in message and "Error receiving" in message)
        return True


_NOISE_FILTER = ClientNoiseFilter()


def quiet_client_noise() -> None:
    """Attach :class:`ClientNoiseFilter` to the two loggers that emit the noise
    (a logger's filters see only its own records, not its children's)."""
    for name in ("kafka.net.selector", "kafka.net.transport"):
        logger = logging.getLogger(name)
        if _NOISE_FILTER not in logger.filters:
            logger.addFilter(_NOISE_FILTER)


def apply() -> bool:
    """Patch ``ConsumerCoordinator.need_rejoin`` and quiet the client's noise;
    True once the patch is applied."""
    import kafka
    from kafka.coordinator.consumer import ConsumerCoordinator

    quiet_client_noise()

    if getattr(ConsumerCoordinator.need_rejoin, "_gem_fixed", False):
        return True
    if kafka.__version__ != FIXED_VERSION:
        log.warning(
            "kafka-python %s is not %s: its group-join fix is not applied "
            "(features/kafka/client_fixes.py)",
            kafka.__version__,
            FIXED_VERSION,
        )
        return False
    original = ConsumerCoordinator.need_rejoin

    def need_rejoin(self: Any) -> bool:
        return bool(original(self)) or self._join_task is not None

    need_rejoin._gem_fixed = True  # type: ignore[attr-defined]
    ConsumerCoordinator.need_rejoin = need_rejoin
    return True
