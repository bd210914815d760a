"""Checkpointed offsets checked against the topic they are resumed on.

A checkpoint stores the next offset of every partition it was assigned and
the topic's id (Kafka's topic id, KIP-516: a topic deleted and created again
under the same name gets a new one). Before a partition is read from a
stored offset, :func:`check_offsets` compares it with what the broker holds:

- a different topic id, a stored offset beyond the partition's end, or a
  stored partition the topic no longer has: the topic was recreated or
  truncated, and resuming would train on other records under old offsets
  (:class:`TopicChangedError`, always refused);
- a stored offset below the partition's earliest offset: records were
  removed (retention, ``delete_records``) before they were trained: a
  :class:`Gap`. The policy (:data:`GAP_POLICIES`) stops the run
  (:class:`OffsetGapError`) or counts the gap, records it in the checkpoint,
  logs it and reads on from the earliest kept record.

A partition the checkpoint does not name starts at its earliest offset,
never at the consumer group's commit; when the checkpoint names other
partitions of the topic (a partition added since, or one never assigned),
the records below that earliest offset are a gap too.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from features.cli import CommandError

log = logging.getLogger(__name__)

MAX_BACKOFF_S: Final = 10.0
GAP_POLICIES: Final = ("stop", "continue")
"""What ``--on-offset-gap`` takes."""
GAP_HELP: Final = (
    "records removed from the topic (retention, delete_records) before they "
    "were trained: stop (exit 6, one line), or continue from the earliest "
    "kept record, the gap counted, logged and recorded in the checkpoint"
)
RECREATED_FIX: Final = (
    "if the topic was recreated on purpose, train a new model: point "
    "--checkpoint-dir at a new directory; otherwise point --kafka-bootstrap "
    "and --topic at the cluster and topic the checkpoint was trained on"
)


class OffsetRefusedError(CommandError):
    """The stored offsets cannot be resumed on the topic as it is."""


class TopicChangedError(OffsetRefusedError):
    """The topic was recreated or truncated since the checkpoint."""


class OffsetGapError(OffsetRefusedError):
    """Records were removed before they were trained (policy ``stop``)."""


@dataclass(frozen=True)
class TopicView:
    """What the broker holds of one topic: its id and, per partition, the
    earliest offset and the end offset."""

    topic: str
    topic_id: str | None
    earliest: Mapping[int, int]
    end: Mapping[int, int]


@dataclass(frozen=True)
class Gap:
    """Records ``start`` up to ``stop`` (exclusive) of one partition, removed
    before they were trained."""

    topic: str
    partition: int
    start: int
    stop: int

    @property
    def records(self) -> int:
        """How many offsets the gap spans (transaction markers included)."""
        return self.stop - self.start

    def record(self) -> dict[str, Any]:
        """The gap as the checkpoint keeps it."""
        return {
            "topic": self.topic,
            "partition": self.partition,
            "from": self.start,
            "to": self.stop,
            "records": self.records,
            "noticed": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }


def describe(admin: Any, topic: str) -> tuple[str | None, list[int]] | None:
    """The topic's id (None where the broker predates topic ids) and its
    partitions; None when the topic does not exist."""
    described = admin.describe_topics([topic])
    if not described or described[0].get("error_code", 0) != 0:
        return None
    found = described[0].get("topic_id")
    partitions = sorted(int(p["partition_index"]) for p in described[0]["partitions"])
    # The all-zero id is Kafka's "none" (an old broker's answer).
    known = found is not None and uuid.UUID(str(found)).int != 0
    return (str(found) if known else None), partitions


def read_view(
    admin: Any, consumer: Any, topic: str, partitions: list[int] | None = None
) -> TopicView:
    """The broker's view of ``partitions`` of ``topic`` (None: all of them;
    ``consumer`` asks for the offsets: a read_committed one gives the last
    stable offset as the end).

    Raises:
        TopicChangedError: the topic does not exist.
    """
    from kafka import TopicPartition

    described = describe(admin, topic)
    if described is None:
        raise TopicChangedError(
            f"topic {topic} does not exist, and the checkpoint holds its offsets",
            RECREATED_FIX,
        )
    found_id, existing = described
    tps = [
        TopicPartition(topic, p)
        for p in existing
        if partitions is None or p in partitions
    ]
    earliest = consumer.beginning_offsets(tps) if tps else {}
    end = consumer.end_offsets(tps) if tps else {}
    return TopicView(
        topic,
        found_id,
        {tp.partition: int(o) for tp, o in earliest.items()},
        {tp.partition: int(o) for tp, o in end.items()},
    )


def check_offsets(
    view: TopicView,
    stored: Mapping[int, int],
    recorded_id: str | None,
) -> list[Gap]:
    """The gaps between ``stored`` and ``view`` for the partitions ``view``
    holds (module docstring).

    Args:
        view: the broker's view of the partitions to start.
        stored: next offset per partition, as the checkpoint (and the run
            since) has them; empty for a new model, which has no gaps.
        recorded_id: the topic id the checkpoint recorded (None: none yet).

    Raises:
        TopicChangedError: another topic id, or an offset beyond a
            partition's end.
    """
    topic = view.topic
    if recorded_id and view.topic_id and recorded_id != view.topic_id:
        raise TopicChangedError(
            f"topic {topic} is not the topic the checkpoint was trained on (its "
            f"id is {view.topic_id}, the checkpoint's {recorded_id}): it was "
            "deleted and created again",
            RECREATED_FIX,
        )
    beyond = {
        p: (o, view.end[p])
        for p, o in stored.items()
        if p in view.end and o > view.end[p]
    }
    if beyond:
        where = ", ".join(
            f"partition {p} at {o} (its end is {end})"
            for p, (o, end) in sorted(beyond.items())
        )
        raise TopicChangedError(
            f"the checkpoint resumes topic {topic} beyond its end: {where}; the "
            "topic was recreated or truncated",
            RECREATED_FIX,
        )
    gaps = []
    for partition, earliest in sorted(view.earliest.items()):
        start = stored.get(partition, 0 if stored else None)
        if start is not None and start < earliest:
            gaps.append(Gap(topic, partition, start, earliest))
    return gaps


def missing_partitions(stored: Mapping[int, int], partitions: int, topic: str) -> None:
    """Refuse a checkpoint naming partitions the topic no longer has.

    Raises:
        TopicChangedError: a stored partition is not in the topic.
    """
    gone = sorted(p for p in stored if p >= partitions)
    if gone:
        raise TopicChangedError(
            f"the checkpoint holds offsets of partitions {gone} of topic {topic}, "
            f"which has {partitions} partitions: it was recreated with fewer",
            RECREATED_FIX,
        )


def gap_error(gaps: list[Gap]) -> OffsetGapError:
    """The one line that stops a run at ``gaps``."""
    where = ", ".join(
        f"{g.records} of partition {g.partition} (offsets {g.start}-{g.stop - 1})"
        for g in gaps
    )
    return OffsetGapError(
        f"records of topic {gaps[0].topic} were removed (retention or "
        f"delete_records) before they were trained: {where}",
        "pass --on-offset-gap continue to train on from the earliest kept "
        "records (the gap is counted and recorded in the checkpoint), or "
        "restore the records",
    )


def log_gaps(gaps: list[Gap]) -> None:
    """The error line of gaps a run continues past."""
    for gap in gaps:
        log.error(
            "OFFSET GAP: topic %s partition %d: offsets %d-%d (%d) were removed "
            "before they were trained; continuing from %d (--on-offset-gap continue)",
            gap.topic,
            gap.partition,
            gap.start,
            gap.stop - 1,
            gap.records,
            gap.stop,
        )


def whole_topic_view(settings: Any, topic: str, stored: Mapping[int, int]) -> TopicView:
    """The view of every partition of ``topic``, read by clients of its own
    (no group), after refusing a checkpoint that names partitions the topic
    no longer has."""
    from kafka.errors import KafkaError

    backoff = 0.5
    while True:  # a broker outage is waited out, as the consumer's polls do
        try:
            consumer = settings.consumer(isolation_level="read_committed")
            admin = settings.admin()
            try:
                view = read_view(admin, consumer, topic)
            finally:
                consumer.close()
                admin.close()
            break
        except KafkaError as error:
            log.warning(
                "offsets not checked against %s yet (%s: %s); retrying in %.1f s",
                topic,
                type(error).__name__,
                error,
                backoff,
            )
            time.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
    missing_partitions(stored, len(view.earliest), topic)
    return view


def plan_starts(
    view: TopicView, stored: Mapping[int, int], recorded_id: str | None, on_gap: str
) -> tuple[dict[int, int], list[Gap]]:
    """Where each partition of ``view`` starts, and the gaps passed over:
    the stored offset, or the earliest kept one past a gap (policy
    ``continue``; ``stop`` raises) or for a partition ``stored`` is silent on.

    Raises:
        TopicChangedError: as :func:`check_offsets`.
        OffsetGapError: a gap under policy ``stop``.
    """
    gaps = check_offsets(view, stored, recorded_id)
    if gaps and on_gap == "stop":
        raise gap_error(gaps)
    log_gaps(gaps)
    return {p: max(stored.get(p, e), e) for p, e in view.earliest.items()}, gaps
