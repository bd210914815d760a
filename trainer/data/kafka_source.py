"""Training batches from a Kafka topic of example messages, for the daemon.

One background thread owns the kafka-python consumer (it is not thread-safe):
it polls, decodes (:mod:`features.example_messages`) and builds the
:class:`~trainer.data.batch.Batch` (:func:`trainer.data.inputs.make_batch`), and puts
ready :class:`Item` s on a bounded queue, so decoding runs ahead of the step
but never more than ``queue_size`` messages.

Offsets: the *trainer* decides where reading starts, not the group. The main
loop reports every record it has applied (:meth:`KafkaSource.mark`); when the
group assigns partitions, the rebalance listener seeks each one to that
next-offset map (initialised from the checkpoint). Kafka commits happen only
after a checkpoint is durable and are advisory (lag dashboards): the
checkpoint is the source of truth. A partition unknown to the map starts at
the group's committed offset, else the earliest (always the earliest with
``start_at_earliest``: a new model beside unusable checkpoints). The last
requested commit is sent before the consumer closes.

Poison: a message that does not decode, or whose ids are out of range
(``make_batch`` raises ValueError), becomes a dead letter (topic
``<topic>.dead-letter`` or a JSONL file) with partition, offset and reason,
and an :class:`Item` with ``batch=None`` so the loop still advances past it.
Whatever a record holds, decoding it never raises: any error becomes the
dead letter's reason. Dead letters are at-least-once: a crash before the next
checkpoint re-sends. The dead-letter producer allows records as large as the
dead-letter topic does (its ``max.message.bytes``, else the broker's
``message.max.bytes``); a larger letter is sent truncated to fit, its
headers carrying the original length and SHA-256 and ``truncated=true``
(:meth:`features.deadletter.DeadLetter.truncated_to`), so one huge poison
message is set aside like any other and the stream goes on. A dead-letter
write that fails (broker away) is retried with backoff, never skipped.

Lag (:meth:`KafkaSource.lag`): after every poll the thread notes each
assigned partition's end offset from what the fetch responses already carry
(kafka-python's cached high watermark: no request of its own), and asks the
broker for the end offsets once every ``LAG_REFRESH_S`` (also while it waits
for room in a full queue), because a backlogged partition's fetch responses
are read late. So the lag, end offset minus the next offset to train, costs
nothing per step and can be read at any moment, e.g. when Prometheus scrapes.

Order across partitions: the topic's partitions are user shards, each in
event-time order, so reading them one after another would train on one
shard's whole history before the next one's. Fetched records are held per
partition and queued earliest ``event-time-ms`` header first (a record
without one goes at once), the merge a Kafka Streams task does. A partition
whose held records are used up holds the others back while it has records
on the broker not yet fetched (its position is short of its high watermark),
for at most ``ALIGN_WAIT_S``; a partition that is caught up holds nothing
back, so a live stream pays no latency. The records held are what the
client had fetched anyway (one fetch response per partition, it fetches a
partition again only once its last response is used up); past
``MAX_HELD_BYTES`` the merge stops waiting, which bounds the memory. Pausing
full partitions would bound it tighter, but kafka-python 3.0 can leave a
partition paused in the middle of a fetch response unfetched after it is
resumed.

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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from features.deadletter import DeadLetter
from features.example_messages import decode_example_message, header_event_time
from features.kafka.settings import MAX_MESSAGE_BYTES, KafkaSettings
from features.kafka.topics import RECORD_OVERHEAD_BYTES
from trainer.data.batch import Batch
from trainer.data.inputs import make_batch

log = logging.getLogger(__name__)

PROBE_EVERY_S: Final = 1.0
LAG_REFRESH_S: Final = 5.0
PROBE_TIMEOUT_MS: Final = 1500
MAX_BACKOFF_S: Final = 30.0
FENCE_TIMEOUT_S: Final = 10.0
MAX_REASON_CHARS: Final = 2000
ALIGN_WAIT_S: Final = 1.0
MAX_HELD_BYTES: Final = 4 * MAX_MESSAGE_BYTES
"""Held records past this are queued without waiting for other partitions."""
UNSTAMPED: Final = -(2**63)
"""The merge key of a record without ``event-time-ms``: it is queued first."""


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
        max_seq_len: history window length for :func:`make_batch`.
        offsets: next offset per partition to start from (the checkpoint's).
        queue_size: decoded messages buffered ahead of the step.
        dead_letter: a topic name, or a path ending in ``.jsonl``; default
            ``<topic>.dead-letter``.
        poll_ms: poll timeout of the background thread.
        start_at_earliest: partitions missing from ``offsets`` start at their
            earliest offset, not at the group's committed one.
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
        start_at_earliest: bool = False,
        decode_record: Callable[
            [bytes, list[tuple[str, bytes]]], tuple[Any, str | None]
        ]
        | None = None,
    ) -> None:
        self.settings = settings
        # Both optional and off by default (the trainer daemon's behaviour is
        # unchanged): keep the decoded example rows on each Item, or decode
        # another record format (value, headers) -> (payload, reason or None).
        self.keep_examples = keep_examples
        self.decode_record = decode_record
        self.pin_memory = pin_memory
        self.start_at_earliest = start_at_earliest
        self.topic = topic
        self.group = group
        self.max_seq_len = max_seq_len
        self.dead_letter = dead_letter or f"{topic}.dead-letter"
        self.poll_ms = poll_ms
        self.dead_letters = 0
        # Times the cross-partition merge held records back for a partition
        # with records not fetched yet (module docstring).
        self.merge_waits = 0
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
        # No "drained" while the group has not given us partitions (the first
        # join, and every rebalance: meanwhile nothing is fetched, so idle).
        self._joined = False
        self._error: BaseException | None = None
        # Consumer thread only: fetched records not yet queued, per partition,
        # as (event time, record); when the merge began waiting on a
        # partition with unfetched records; how many records (and bytes)
        # are held.
        self._held: dict[int, deque[tuple[int, Any]]] = {}
        self._waiting_since: float | None = None
        self._held_count = self._held_bytes = 0
        self._thread = threading.Thread(
            target=self._run, name="kafka-source", daemon=True
        )

    # ---- main-thread API -------------------------------------------------

    def start(self) -> KafkaSource:
        """Start the background consumer thread."""
        self._thread.start()
        return self

    def next(self, timeout: float) -> Item | None:
        """The next record for this rank, or None after ``timeout`` seconds."""
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
            and self._held_count == 0
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
        except BaseException as error:  # surfaced to the main thread by next()
            log.exception("Kafka consumer thread failed")
            self._error = error

    def _consume(self) -> None:
        from kafka import ConsumerRebalanceListener, KafkaConsumer
        from kafka.errors import KafkaError

        source = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            def on_partitions_revoked(self, revoked: Any) -> None:
                with source._lock:
                    source._generation += 1
                    source._assigned = set()
                    source._ends, source._starts = {}, {}
                    source._joined = False
                source._drop_held()
                source._fence()  # a record taken before the bump may be mid-step

            def on_partitions_assigned(self, assigned: Any) -> None:
                source._fence()  # the previous owner's last step is now marked
                with source._lock:
                    source._assigned = {tp.partition for tp in assigned}
                    source._joined = True
                    source._last_activity = time.monotonic()  # idle counts from here
                    known = dict(source._next)
                source._drop_held()
                for tp in assigned:
                    if tp.partition in known:
                        consumer.seek(tp, known[tp.partition])
                    elif source.start_at_earliest:
                        consumer.seek_to_beginning(tp)
                log.info(
                    "assigned %s; starting at %s",
                    sorted(source._assigned),
                    {
                        p: known.get(p, "committed/earliest")
                        for p in sorted(source._assigned)
                    },
                )

        consumer = KafkaConsumer(
            **self.settings.consumer_config(
                group_id=self.group,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            )
        )
        consumer.subscribe([self.topic], listener=Listener())
        backoff, down_since, last_probe = 0.5, 0.0, time.monotonic()
        try:
            while not self._closing.is_set():
                try:
                    self._flush_commit(consumer)
                    records = consumer.poll(
                        timeout_ms=self.poll_ms, max_records=self._queue.maxsize
                    )
                    with self._lock:
                        for tp, messages in records.items():
                            self._starts.setdefault(tp.partition, messages[0].offset)
                    if not records and time.monotonic() - last_probe > PROBE_EVERY_S:
                        last_probe = time.monotonic()
                        probe = next(iter(consumer.assignment()), None)
                        if probe is not None:  # any broker round trip proves liveness
                            consumer.committed(probe, timeout_ms=PROBE_TIMEOUT_MS)
                        self._last_contact = time.monotonic()
                    elif records:
                        self._last_contact = time.monotonic()
                    self._note_ends(consumer)
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
                self._hold(records)
                self._release(consumer)
        finally:
            try:
                self._flush_commit(consumer)  # a clean exit's last checkpoint
            except KafkaError as error:
                log.warning("last offset commit not sent (%s): advisory only", error)
            consumer.close(autocommit=False)
            if hasattr(self, "_producer"):
                self._producer.close()

    def _hold(self, records: dict[Any, list[Any]]) -> None:
        for tp, messages in records.items():
            held = self._held.setdefault(tp.partition, deque())
            for message in messages:
                stamp = header_event_time(message.headers)
                held.append((UNSTAMPED if stamp is None else stamp, message))
                self._held_bytes += len(message.value or b"")
            self._held_count += len(messages)

    def _drop_held(self) -> None:
        """Forget held records: after a rebalance their partitions are re-read
        from the offset map (or belong to another rank)."""
        self._held, self._waiting_since = {}, None
        self._held_count = self._held_bytes = 0

    def _release(self, consumer: Any) -> None:
        """Queue held records, earliest event time first (module docstring)."""
        while self._held_count and not self._closing.is_set():
            heads = {p: held[0][0] for p, held in self._held.items() if held}
            if self._held_bytes < MAX_HELD_BYTES and self._unfetched_elsewhere(
                consumer, heads
            ):
                now = time.monotonic()
                if self._waiting_since is None:
                    self._waiting_since = now
                    self.merge_waits += 1
                if now - self._waiting_since < ALIGN_WAIT_S:
                    break
            else:
                self._waiting_since = None
            partition = min(heads, key=heads.__getitem__)
            _, message = self._held[partition].popleft()
            self._held_count -= 1
            self._last_activity = time.monotonic()
            self._held_bytes -= len(message.value or b"")
            self._put(self._decode(partition, message), consumer)

    def _unfetched_elsewhere(self, consumer: Any, heads: dict[int, int]) -> bool:
        """Whether an assigned partition with nothing held has records on the
        broker not fetched yet (or has not been fetched from at all)."""
        for tp in consumer.assignment():
            if tp.partition in heads:
                continue
            end = consumer.highwater(tp)
            if end is None:
                return True
            position = consumer.position(tp, timeout_ms=0)
            if position is not None and position < end:
                return True
        return False

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
        try:
            return self._decode_or_raise(partition, message)
        except Exception as error:  # outside bytes must never stop the reader
            reason = f"undecodable ({type(error).__name__}: {error})"
            self._set_aside(partition, message, reason)
            with self._lock:
                generation = self._generation
            return Item(partition, message.offset, None, generation)

    def _decode_or_raise(self, partition: int, message: Any) -> Item:
        headers = [(k, v) for k, v in (message.headers or [])]
        if self.decode_record is not None:
            payload, why = self.decode_record(message.value or b"", headers)
            if why is not None:
                self._set_aside(partition, message, why)
                payload = None
            with self._lock:
                generation = self._generation
            return Item(partition, message.offset, None, generation, payload=payload)
        decoded = decode_example_message(message.value, headers or None)
        batch, reason = None, decoded.reason
        if decoded.ok:
            try:
                # The segments only reach back as far as the producer's
                # window: read at most that many events.
                window = min(self.max_seq_len, decoded.max_seq_len or 0)
                batch = make_batch(
                    decoded.examples, decoded.segments, max_seq_len=window
                )
            except ValueError as error:
                reason = f"invalid examples: {error}"
            else:
                if self.pin_memory:
                    # Pinned here, on the decode thread, so the step's copy
                    # to the GPU can be non-blocking.
                    batch = batch.pin_memory()
        if batch is None or batch.size == 0:
            self._set_aside(partition, message, reason or "message holds no examples")
            batch = None
        with self._lock:
            generation = self._generation
        kept = decoded if self.keep_examples and batch is not None else None
        return Item(partition, message.offset, batch, generation, decoded=kept)

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

    def _set_aside(self, partition: int, message: Any, reason: str) -> None:
        if len(reason) > MAX_REASON_CHARS:  # it travels in a header: keep it small
            reason = reason[:MAX_REASON_CHARS] + "..."
        letter = DeadLetter(
            source=self.topic,
            partition=partition,
            offset=message.offset,
            reason=reason,
            payload=message.value or b"",
        )
        log.warning(
            "dead letter %s/%d@%d (%d bytes): %s",
            self.topic,
            partition,
            message.offset,
            letter.payload_length,
            reason,
        )
        self.dead_letters += 1
        backoff = 0.5
        # Retried until written: a dead letter is never skipped, and the
        # record's offset is marked only once its letter is out.
        while not self._closing.is_set():
            try:
                self._write_dead_letter(letter)
                return
            except Exception as error:
                log.warning(
                    "dead letter %s/%d@%d not written (%s: %s); retrying in %.1f s",
                    self.topic,
                    partition,
                    message.offset,
                    type(error).__name__,
                    error,
                    backoff,
                )
                self._closing.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _write_dead_letter(self, letter: DeadLetter) -> None:
        if self.dead_letter.endswith(".jsonl"):
            with open(Path(self.dead_letter), "a") as file:
                file.write(letter.to_json() + "\n")
            return
        from kafka.errors import MessageSizeTooLargeError

        if not hasattr(self, "_producer"):
            from kafka import KafkaProducer

            from features.kafka.topics import ensure_topics

            ensure_topics(self.settings, {self.dead_letter: 1})
            limit = self._dead_letter_topic_limit()
            self._dead_letter_payload_bytes = max(0, limit - RECORD_OVERHEAD_BYTES)
            self._producer = KafkaProducer(
                **self.settings.producer_config(acks="all", max_request_size=limit)
            )
        sent = letter.truncated_to(self._dead_letter_payload_bytes)
        while True:
            if sent.truncated:
                log.warning(
                    "dead letter %s/%s@%d truncated to %d of %d bytes to fit %s",
                    letter.source,
                    letter.partition,
                    letter.offset,
                    len(sent.payload),
                    letter.payload_length,
                    self.dead_letter,
                )
            try:
                self._producer.send(
                    self.dead_letter, value=sent.payload, headers=sent.kafka_headers()
                ).get(timeout=10)
                return
            except MessageSizeTooLargeError:
                if not sent.payload:
                    raise
                # The broker counts more than the estimate: halve and resend.
                sent = letter.truncated_to(len(sent.payload) // 2)

    def _dead_letter_topic_limit(self) -> int:
        """The largest record the dead-letter topic accepts, in bytes."""
        from features.kafka.topics import max_message_bytes

        limit = max_message_bytes(self.settings, self.dead_letter)
        log.info("dead letters to %s: records up to %d bytes", self.dead_letter, limit)
        return limit
