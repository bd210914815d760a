"""``CommitOffsets``: commit a partition's offsets once their output is durable.

The reader emits a progress mark per call and partition, ``(partition, next
offset, newest event time)``. An event can change the labels and features of
examples up to ``label window + allowed lateness + granularity`` after it (its
own impression's labels, the labels of the impression it follows up); those
examples are released by then (:mod:`.user_state`) and acknowledged by the
examples topic before the publisher's bundle commits. This stage reads the
marks *and* the publisher's (empty) output, so its event-time watermark passes
``T`` only once every example due by ``T`` is on the topic: a mark whose
events are final by ``T`` is then durable, and its offset is committed.

A partition commits at most once per release step of event time. Offsets are
the group's committed position: what a lag dashboard reads, and where a
restart of a runner with checkpointed state (Flink, Dataflow) would resume;
Prism keeps no state across a restart, so the streaming job
replays the topic from the beginning (``--stream-start earliest``) and relies
on the publisher's release horizons (:mod:`.publish`) instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.coders import TupleCoder, VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    TimerSpec,
    on_timer,
)

from features.kafka import KafkaSettings
from pipelines.streaming.config import LABEL_WINDOW_MS, METRICS_NAMESPACE, StreamConfig
from pipelines.streaming.event_timers import fired_ms, ms_to_timestamp

Mark = tuple[str, tuple[int, int]]
"""``("topic/partition", (next offset, newest event time ms))``."""

_PAIR = TupleCoder([VarIntCoder(), VarIntCoder()])


def durable_at(newest_ms: int, config: StreamConfig) -> int:
    """Event time by which every example an event can touch is released."""
    return (
        newest_ms
        + LABEL_WINDOW_MS
        + config.allowed_lateness_ms
        + 2 * config.granularity_ms
    )


# State and timers (module-level: Beam finds them in the defaults).
_MARKS = BagStateSpec("marks", _PAIR)
_MARKS_PARAM = beam.DoFn.StateParam(_MARKS)
_DURABLE = TimerSpec("durable", TimeDomain.WATERMARK)
_DURABLE_PARAM = beam.DoFn.TimerParam(_DURABLE)


class CommitOffsetsFn(beam.DoFn):  # type: ignore[misc]
    """Per partition: hold marks until durable, then commit."""

    def __init__(
        self,
        settings: KafkaSettings,
        group_id: str,
        config: StreamConfig,
    ) -> None:
        self._settings = settings
        self._group_id = group_id
        self._config = config
        self._consumer: Any = None
        self.commits = Metrics.counter(METRICS_NAMESPACE, "offset_commits")

    def process(
        self,
        element: Mark,
        marks: Any = _MARKS_PARAM,
        durable: Any = _DURABLE_PARAM,
    ) -> Iterator[Any]:
        """Hold the mark; wake up when it is durable."""
        _, (offset, newest) = element
        marks.add((offset, newest))
        due = durable_at(newest, self._config)
        durable.set(ms_to_timestamp(due))
        yield from ()

    @on_timer(_DURABLE)
    def on_durable(
        self,
        key: Any = beam.DoFn.KeyParam,
        fire_at: Any = beam.DoFn.TimestampParam,
        marks: Any = _MARKS_PARAM,
        durable: Any = _DURABLE_PARAM,
    ) -> None:
        """Commit the highest offset whose marks are durable by now."""
        fire = fired_ms(fire_at)
        held = list(marks.read())
        done = [o for o, newest in held if durable_at(newest, self._config) <= fire]
        rest = [(o, n) for o, n in held if durable_at(n, self._config) > fire]
        marks.clear()
        for pair in rest:
            marks.add(pair)
        if rest:
            due = min(durable_at(n, self._config) for _, n in rest)
            durable.set(ms_to_timestamp(due))
        if done:
            self._commit(str(key), max(done))

    def _commit(self, source: str, offset: int) -> None:
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        topic, partition = source.rsplit("/", 1)
        if self._consumer is None:
            self._consumer = self._settings.consumer(
                group_id=self._group_id, enable_auto_commit=False
            )
        self._consumer.commit(
            {TopicPartition(topic, int(partition)): OffsetAndMetadata(offset, "", -1)}
        )
        self.commits.inc()

    def teardown(self) -> None:
        """Close the committing consumer."""
        if self._consumer is not None:
            self._consumer.close()
