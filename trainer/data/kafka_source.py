"""Training batches from a Kafka topic of example messages, for the daemon.

One background thread owns the kafka-python consumer (it is not thread-safe):
it polls, decodes each record into a :class:`~trainer.data.batch.Batch`
(:mod:`trainer.data.record_decoder`), and puts ready :class:`Item` s on a
bounded queue, so decoding runs ahead of the step but never more than
``queue_size`` messages.

Offsets: the *trainer* decides where reading starts, not the group. The main
loop reports every record it has applied (:meth:`KafkaSource.mark`); on
assignment the rebalance listener seeks each partition to that next-offset
map (from the checkpoint; the earliest offset for a partition it lacks,
never the group's commit) and pauses it, and the thread checks it against
the topic (:mod:`trainer.data.offset_check`), enters its start in the map
and resumes it. :meth:`KafkaSource.start` checks every stored partition
before the thread runs, and an offset out of range while reading is checked
the same way (the consumer never resets one itself). Kafka commits happen
only after a checkpoint is durable and are advisory (lag dashboards); the
last requested one is sent before the consumer closes.

Transactions: the streaming job publishes in Kafka transactions, so the
consumer reads committed records only (``read_committed``): an aborted
transaction's records are skipped, and an open one holds its partition back
until it commits. Each commit leaves a marker at an offset no record is read
at: offsets are not consecutive, and a partition read to its end shows a
lag of the one marker after its last record.

Poison: a record that gives no batch (:mod:`trainer.data.record_decoder`)
becomes a dead letter (:mod:`trainer.data.dead_letter_writer`) and an
:class:`Item` with ``batch=None``, so the loop still advances past it.

Lag (:meth:`KafkaSource.lag`): after every poll the thread notes each
assigned partition's end offset from what the fetch responses already carry
(kafka-python's cached high watermark: no request of its own), and asks the
broker for the end offsets once every ``LAG_REFRESH_S`` (also while it waits
for room in a full queue), because a backlogged partition's fetch responses
are read late. So the lag, end offset minus the next offset to train, costs
nothing per step and can be read at any moment, e.g. when Prometheus scrapes.

Order across partitions: fetched records are queued earliest event time
first across the assigned partitions (:mod:`trainer.data.partition_merge`).

Outages: a failing poll, or a failing liveness probe while no records come,
is retried with exponential backoff and logged; the idle clock (used to
decide "drained") restarts when the broker is back, so an outage longer
than ``idle_seconds`` does not end a bounded run early.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Final

from features.kafka.settings import MAX_MESSAGE_BYTES, KafkaSettings
from trainer.data.batch import Batch
from trainer.data.dead_letter_writer import MAX_BACKOFF_S, DeadLetterWriter
from trainer.data.offset_check import (
    OffsetRefusedError,
    TopicView,
    plan_starts,
    read_view,
    whole_topic_view,
)
from trainer.data.partition_merge import EventTimeMerge
from trainer.data.record_decoder import RecordDecoder, RecordFormat

log = logging.getLogger(__name__)

PROBE_EVERY_S: Final = 1.0
LAG_REFRESH_S: Final = 5.0
PROBE_TIMEOUT_MS: Final = 1500
FENCE_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True)
class Item:
    """One consumed record: a batch, or ``batch=None`` for a dead letter.

    ``decoded`` holds the :class:`~features.example_messages.DecodedMessage`
    (example rows and timeline segments) when the source was built
    with ``keep_examples=True`` (consumers that need ids and times, e.g. the
    distillation student joining teacher outputs); ``payload`` is what a
    custom ``decode_record`` returned (then ``batch`` is None).
    """

    partition: int
    offset: int
    batch: Batch | None
    generation: int
    decoded: Any = None
    payload: Any = None

    @property
    def examples(self) -> int:
        """Examples in the batch (0 for a dead letter)."""
        return 0 if self.batch is None else self.batch.size


class KafkaSource:
    """Consume ``topic`` as a member of ``group`` (see the module docstring).

    Args:
        settings: the cluster.
        topic: example-message topic.
        group: consumer group id (every rank of a run uses the same).
        max_seq_len: history window length of the batches.
        offsets: next offset per partition to start from (the checkpoint's).
        queue_size: decoded messages buffered ahead of the step.
        dead_letter: a topic name, or a path ending in ``.jsonl``; default
            ``<topic>.dead-letter``.
        poll_ms: poll timeout of the background thread.
        pin_memory, keep_examples, decode_record: how records are decoded
            (:class:`~trainer.data.record_decoder.RecordDecoder`).
        topic_id: the topic id the checkpoint recorded (None: adopt the
            topic's).
        gaps: the gaps the checkpoint recorded (:meth:`gaps` goes on from them).
        on_gap: a :data:`~trainer.data.offset_check.GAP_POLICIES` policy.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        group: str,
        *,
        max_seq_len: int,
        offsets: dict[int, int] | None = None,
        queue_size: int = 8,
        dead_letter: str | None = None,
        poll_ms: int = 100,
        pin_memory: bool = False,
        keep_examples: bool = False,
        decode_record: RecordFormat | None = None,
        topic_id: str | None = None,
        gaps: list[dict[str, Any]] | None = None,
        on_gap: str = "stop",
    ) -> None:
        self.settings = settings
        self.topic = topic
        self.topic_id = topic_id
        self.on_gap = on_gap
        self._gaps: list[dict[str, Any]] = list(gaps or [])
        # Assigned partitions paused until checked against the topic.
        self._unchecked: set[int] = set()
        self._admin: Any = None
        self.group = group
        self.dead_letter = dead_letter or f"{topic}.dead-letter"
        self.poll_ms = poll_ms
        self._queue: queue.Queue[Item] = queue.Queue(maxsize=queue_size)
        self._next: dict[int, int] = dict(offsets or {})
        self._lock = threading.Condition()
        self._generation = 0
        self._iteration = 0
        self._closing = threading.Event()
        self._commit: dict[int, int] | None = None
        self._assigned: set[int] = set()
        # Per assigned partition: its end offset as of the last poll, and
        # where this assignment started reading it (the first record fetched,
        # else the fetch position): the lag of a partition nothing was
        # marked in yet counts from there.
        self._ends: dict[int, int] = {}
        self._starts: dict[int, int] = {}
        self._ends_asked = 0.0  # monotonic time of the last end-offsets request
        self._reachable = True
        self._last_activity = time.monotonic()
        self._last_contact = time.monotonic()
        self._last_probe = time.monotonic()
        # No "drained" while the group has not given us partitions (the first
        # join, and every rebalance: meanwhile nothing is fetched, so idle).
        self._joined = False
        self._error: BaseException | None = None
        # Consumer thread only: fetched records not yet queued.
        self._merge = EventTimeMerge()
        self._dead_letters = DeadLetterWriter(
            settings, topic, self.dead_letter, self._closing
        )
        self._decoder = RecordDecoder(
            self._dead_letters,
            max_seq_len=max_seq_len,
            pin_memory=pin_memory,
            keep_examples=keep_examples,
            decode_record=decode_record,
        )
        self._thread = threading.Thread(
            target=self._run, name="kafka-source", daemon=True
        )

    # ---- main-thread API -------------------------------------------------

    @property
    def dead_letters(self) -> int:
        """Records set aside so far."""
        return self._dead_letters.written

    @property
    def merge_waits(self) -> int:
        """Times the cross-partition merge held records back for a partition
        with records not fetched yet (:mod:`trainer.data.partition_merge`)."""
        return self._merge.waits

    def start(self) -> KafkaSource:
        """Check the stored offsets against the topic, then start the
        background consumer thread.

        Raises:
            OffsetRefusedError: the topic was recreated or truncated, or (policy
                stop) records were removed before they were trained.
        """
        if self._next or self.topic_id:
            self._check_stored()
        self._thread.start()
        return self

    def gaps(self) -> list[dict[str, Any]]:
        """Every gap of the run (the checkpoint's and this process's)."""
        with self._lock:
            return list(self._gaps)

    def gap_records(self) -> int:
        """Offsets removed before they were trained, over the whole run."""
        return sum(int(g["records"]) for g in self.gaps())

    def next(self, timeout: float) -> Item | None:
        """The next record for this rank, or None after ``timeout`` seconds.

        Raises:
            OffsetRefusedError: the consumer thread found the topic changed, or a gap.
            RuntimeError: the consumer thread failed.
        """
        if isinstance(self._error, OffsetRefusedError):
            raise self._error
        if self._error is not None:
            raise RuntimeError("Kafka consumer thread failed") from self._error
        deadline = time.monotonic() + timeout
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            with self._lock:
                # Items decoded before a rebalance belong to an old assignment:
                # the new owner of their partition will re-read them.
                if item.generation == self._generation:
                    return item

    def mark(self, partition: int, next_offset: int) -> None:
        """Record that everything before ``next_offset`` in ``partition`` is applied.

        In data parallel every rank marks every rank's records (they are
        all-gathered each step), so any rank can resume any partition.
        """
        with self._lock:
            self._next[partition] = max(self._next.get(partition, 0), next_offset)

    def iteration_done(self) -> None:
        """The loop finished an iteration (its offsets are marked): a fence."""
        with self._lock:
            self._iteration += 1
            self._lock.notify_all()

    def offsets(self) -> dict[int, int]:
        """The next-offset map (what the checkpoint stores)."""
        with self._lock:
            return dict(self._next)

    def lag(self) -> dict[int, int]:
        """Records not yet trained on, per partition assigned to this consumer.

        End offset (as of the last poll) minus the next offset to train
        (:meth:`mark`'s map; where this assignment started reading, for a
        partition with nothing marked yet). Partitions whose end is not
        known yet (no fetch response since the assignment) are left out.
        """
        with self._lock:
            return {
                p: max(0, end - self._next.get(p, self._starts.get(p, end)))
                for p, end in self._ends.items()
            }

    def request_commit(self) -> None:
        """Commit this rank's assigned partitions' offsets (after a checkpoint)."""
        with self._lock:
            self._commit = {p: o for p, o in self._next.items() if p in self._assigned}

    def drained(self, idle_seconds: float) -> bool:
        """No record for ``idle_seconds`` while assigned and reachable, none queued."""
        now = time.monotonic()
        # A recent broker round trip is required too: a paused broker looks idle.
        return (
            self._joined
            and self._reachable
            and now - self._last_contact < 2 * PROBE_EVERY_S
            and self._queue.empty()
            and self._merge.count == 0
            and now - self._last_activity > idle_seconds
        )

    def close(self) -> None:
        """Stop the thread and close the consumer, sending the last requested
        commit (:meth:`request_commit`) first."""
        self._closing.set()
        with self._lock:
            self._lock.notify_all()
        self._thread.join(timeout=15)

    # ---- background thread ------------------------------------------------

    def _fence(self) -> None:
        """Wait until the main loop completes its current iteration.

        Rebalance sync point: after it, every record this rank (or, through
        the all-gather, any rank) applied so far is in the offset map.
        """
        with self._lock:
            start = self._iteration
            self._lock.wait_for(
                lambda: self._iteration > start or self._closing.is_set(),
                timeout=FENCE_TIMEOUT_S,
            )

    def _run(self) -> None:
        try:
            self._consume()
        except OffsetRefusedError as error:  # the main thread says it, in one line
            self._error = error
        except BaseException as error:  # surfaced to the main thread by next()
            log.exception("Kafka consumer thread failed")
            self._error = error

    def _consume(self) -> None:
        from kafka.errors import KafkaError, OffsetOutOfRangeError

        consumer = self.settings.consumer(
            group_id=self.group,
            enable_auto_commit=False,
            isolation_level="read_committed",
            # Every start is the map's or checked (module docstring).
            auto_offset_reset="none",
            max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
        )
        consumer.subscribe([self.topic], listener=self._rebalance_listener(consumer))
        backoff, down_since = 0.5, 0.0
        self._last_probe = time.monotonic()
        try:
            while not self._closing.is_set():
                try:
                    records = self._poll(consumer)
                except OffsetOutOfRangeError as error:
                    self._out_of_range(consumer, error)
                    continue
                except KafkaError as error:
                    if self._reachable:
                        down_since = time.monotonic()
                    self._reachable = False
                    log.warning(
                        "Kafka broker %s unreachable (%s: %s); retrying in %.1f s",
                        self.settings.bootstrap,
                        type(error).__name__,
                        error,
                        backoff,
                    )
                    self._closing.wait(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    continue
                if not self._reachable:
                    log.info(
                        "Kafka broker reachable again after %.1f s",
                        time.monotonic() - down_since,
                    )
                    self._reachable = True
                    self._last_activity = time.monotonic()  # restart the idle clock
                backoff = 0.5
                if records:
                    self._last_activity = time.monotonic()
                self._merge.hold(records)
                self._release(consumer)
        finally:
            try:
                self._flush_commit(consumer)  # a clean exit's last checkpoint
            except KafkaError as error:
                log.warning("last offset commit not sent (%s): advisory only", error)
            consumer.close(autocommit=False)
            if self._admin is not None:
                self._admin.close()
            self._dead_letters.close()

    def _rebalance_listener(self, consumer: Any) -> Any:
        """The listener that fences the main loop and seeks each assigned
        partition to the offset map (module docstring)."""
        from kafka import ConsumerRebalanceListener

        source = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            def on_partitions_revoked(self, revoked: Any) -> None:
                with source._lock:
                    source._generation += 1
                    source._assigned = set()
                    source._ends, source._starts = {}, {}
                    source._joined = False
                source._merge.drop()
                source._fence()  # a record taken before the bump may be mid-step

            def on_partitions_assigned(self, assigned: Any) -> None:
                source._fence()  # the previous owner's last step is now marked
                with source._lock:
                    source._assigned = {tp.partition for tp in assigned}
                    source._unchecked = set(source._assigned)
                    known = dict(source._next)
                source._merge.drop()
                # No broker request here (it would block the client's loop):
                # held until the thread checks them (_check_assigned).
                for tp in assigned:
                    consumer.pause(tp)
                    if tp.partition in known:
                        consumer.seek(tp, known[tp.partition])
                    else:
                        consumer.seek_to_beginning(tp)
                log.info(
                    "assigned %s; starting at %s (checked against the topic first)",
                    sorted(source._assigned),
                    {p: known.get(p, "earliest") for p in sorted(source._assigned)},
                )

        return Listener()

    def _poll(self, consumer: Any) -> dict[Any, list[Any]]:
        """Send a requested commit, poll, and note the broker's liveness and
        the end offsets; raises the client's KafkaError on an outage."""
        self._flush_commit(consumer)
        records: dict[Any, list[Any]] = consumer.poll(
            timeout_ms=self.poll_ms, max_records=self._queue.maxsize
        )
        if self._unchecked:
            self._check_assigned(consumer)
        with self._lock:
            for tp, messages in records.items():
                self._starts.setdefault(tp.partition, messages[0].offset)
        if not records and time.monotonic() - self._last_probe > PROBE_EVERY_S:
            self._last_probe = time.monotonic()
            probe = next(iter(consumer.assignment()), None)
            if probe is not None:  # any broker round trip proves liveness
                consumer.committed(probe, timeout_ms=PROBE_TIMEOUT_MS)
            self._last_contact = time.monotonic()
        elif records:
            self._last_contact = time.monotonic()
        self._note_ends(consumer)
        return records

    def _check_stored(self) -> None:
        """Every stored partition against the topic, before the thread runs."""
        self._take_view(whole_topic_view(self.settings, self.topic, self._next))

    def _check_assigned(self, consumer: Any) -> None:
        """The paused, newly assigned partitions: checked against the topic,
        their starts entered in the map, then sought to and resumed."""
        from kafka import TopicPartition

        if self._admin is None:
            self._admin = self.settings.admin()
        partitions = sorted(self._unchecked)
        starts = self._take_view(
            read_view(self._admin, consumer, self.topic, partitions)
        )
        tps = [TopicPartition(self.topic, p) for p in partitions]
        for tp in tps:
            consumer.seek(tp, starts[tp.partition])
        consumer.resume(*tps)
        with self._lock:
            self._unchecked = set()
            self._joined = True
            self._last_activity = time.monotonic()  # idle counts from here
        log.info("partitions %s of %s start at %s", partitions, self.topic, starts)

    def _take_view(self, view: TopicView) -> dict[int, int]:
        """Apply the gap policy to ``view`` and enter each of its partitions'
        start in the map; the starts.

        Raises:
            OffsetRefusedError: the topic changed, or a gap under policy stop.
        """
        with self._lock:
            stored = dict(self._next)
        starts, gaps = plan_starts(view, stored, self.topic_id, self.on_gap)
        with self._lock:
            self.topic_id = self.topic_id or view.topic_id
            self._gaps += [gap.record() for gap in gaps]
            for partition, start in starts.items():
                self._next[partition] = max(self._next.get(partition, 0), start)
        return starts

    def _out_of_range(self, consumer: Any, error: Exception) -> None:
        """A fetch position fell out of its partition's range while reading
        (retention overtook the run): as after a rebalance, the queued
        records are dropped and every assigned partition is checked again
        from the map."""
        from kafka import TopicPartition

        log.warning("%s: checking the offsets against the topic", error)
        with self._lock:
            self._generation += 1
            self._unchecked = set(self._assigned)
        self._merge.drop()
        self._fence()
        with self._lock:
            known = dict(self._next)
        for partition in sorted(self._unchecked):
            tp = TopicPartition(self.topic, partition)
            consumer.pause(tp)
            consumer.seek(tp, known[partition])
        # The check itself is the next poll's, which retries it through an outage.

    def _release(self, consumer: Any) -> None:
        """Queue the held records that may go, earliest event time first."""
        while self._merge.count and not self._closing.is_set():
            # Before the record leaves the merge's count: never idle between.
            self._last_activity = time.monotonic()
            taken = self._merge.take(consumer)
            if taken is None:
                break
            self._put(self._decode(*taken), consumer)

    def _note_ends(self, consumer: Any) -> None:
        """Cache each assigned partition's end offset (and, until a record
        comes, its fetch position as where reading started).

        Both are client-side state after a poll (the high watermark comes
        with every fetch response); only once every ``LAG_REFRESH_S`` are
        the end offsets asked of the broker. Ends only grow: the larger of
        the two is kept.
        """
        assigned = list(consumer.assignment())
        ends = {tp.partition: consumer.highwater(tp) for tp in assigned}
        if assigned and time.monotonic() - self._ends_asked > LAG_REFRESH_S:
            self._ends_asked = time.monotonic()
            asked = consumer.end_offsets(assigned, timeout_ms=PROBE_TIMEOUT_MS)
            for tp, end in asked.items():
                ends[tp.partition] = max(end, ends[tp.partition] or end)
        with self._lock:
            started = set(self._starts) | set(self._next)
        positions = {}
        for tp in assigned:
            if tp.partition not in started and ends[tp.partition] is not None:
                # Fetched from, so it has a position: answered locally.
                position = consumer.position(tp, timeout_ms=0)
                if position is not None:
                    positions[tp.partition] = position
        with self._lock:
            for partition, end in ends.items():
                if end is not None:
                    self._ends[partition] = max(end, self._ends.get(partition, end))
            for partition, position in positions.items():
                self._starts.setdefault(partition, position)

    def _flush_commit(self, consumer: Any) -> None:
        from kafka import OffsetAndMetadata, TopicPartition

        with self._lock:
            offsets, self._commit = self._commit, None
        if offsets:
            consumer.commit(
                {
                    TopicPartition(self.topic, p): OffsetAndMetadata(o, "", -1)
                    for p, o in offsets.items()
                },
                timeout_ms=PROBE_TIMEOUT_MS,
            )

    def _decode(self, partition: int, message: Any) -> Item:
        """Record → Item; poison becomes a dead letter and an empty Item."""
        decoded = self._decoder(partition, message)
        with self._lock:
            generation = self._generation
        return Item(
            partition,
            message.offset,
            decoded.batch,
            generation,
            decoded=decoded.examples,
            payload=decoded.payload,
        )

    def _put(self, item: Item, consumer: Any) -> None:
        from kafka.errors import KafkaError

        while not self._closing.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                # Bounded: the step is behind; wait for it, lag kept fresh.
                if time.monotonic() - self._ends_asked > LAG_REFRESH_S:
                    try:
                        self._note_ends(consumer)
                    except KafkaError as error:  # an outage is the poll's to log
                        log.debug("end offsets not refreshed: %s", error)
