"""A fix to kafka-python 3.0.12's group consumer, applied on import.

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
the next poll finishes it (or starts it over). It is applied to the one
kafka-python version the lock pins and checked there by the test; another
version is left as it is, with a warning.
"""

from __future__ import annotations

import logging
from typing import Any, Final

log = logging.getLogger(__name__)

FIXED_VERSION: Final = "3.0.12"


def apply() -> bool:
    """Patch ``ConsumerCoordinator.need_rejoin``; True once it is patched."""
    import kafka
    from kafka.coordinator.consumer import ConsumerCoordinator

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
