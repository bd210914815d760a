"""``ValidateEvents``: raw event batches in, valid event tables out, and dead letters.

Parquet batches are validated whole with
:func:`features.events.event_table_reasons` (the rules of
:func:`~features.event_table.validate_event_table`, a reason per row); JSONL
lines and Kafka messages one by one with :func:`features.events.decode_event`
(then gathered into one table per batch). A rejected event is not an error:
it leaves on the ``dead_letters`` tagged output as one
:meth:`features.deadletter.DeadLetter.to_json` line (where it came from: file
and line or row, or topic, partition and offset; the reason; the original
bytes: a JSONL line or Kafka message as read, a Parquet row as its wire
JSON), and is counted, so ``events_read = events_valid +
events_dead_lettered``.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
from apache_beam import pvalue
from apache_beam.metrics import Metrics

from features.arrow_ipc import ipc_to_table, table_to_ipc
from features.deadletter import DeadLetter
from features.event_table import event_table_reasons
from features.events import (
    EVENT_COLUMNS,
    EVENT_SCHEMA,
    decode_event,
    encode_event_table,
    events_from_records,
    now_ms,
)
from pipelines.batch.parallel import PooledDoFn
from pipelines.batch.tuning import pipeline_tuning

METRICS_NAMESPACE = "gem.build"
DEAD_LETTERS = "dead_letters"


@dataclass(frozen=True)
class RawEvents:
    """One batch of raw events as read, before validation.

    Exactly one of ``table`` (Parquet rows, in EVENT_SCHEMA) and ``payloads``
    (JSONL lines or Kafka message values) is set.

    Attributes:
        source: file or topic it came from.
        first_offset: 1-based row or line number, or Kafka offset, of the
            first event.
        table: Parquet rows (numbered from ``first_offset`` on).
        payloads: wire messages, one event each.
        offsets: each payload's line number or Kafka offset (blank lines
            and transaction markers leave gaps); None: consecutive from
            ``first_offset``.
        partition: Kafka partition (None for files).
    """

    source: str
    first_offset: int
    table: pa.Table | None = None
    payloads: tuple[bytes, ...] | None = None
    offsets: tuple[int, ...] | None = None
    partition: int | None = None

    def offset_of(self, index: int) -> int:
        """Line, row or Kafka offset of the batch's ``index``-th event."""
        if self.offsets is not None:
            return self.offsets[index]
        return self.first_offset + index

    def dead_letter(self, index: int, reason: str, payload: bytes) -> DeadLetter:
        """The dead letter of the batch's ``index``-th event."""
        return DeadLetter(
            source=self.source,
            partition=self.partition,
            offset=self.offset_of(index),
            reason=reason,
            payload=payload,
        )


class RawEventsCoder(beam.coders.Coder):  # type: ignore[misc]
    """Coder of :class:`RawEvents`: the table as Arrow IPC, never pickled.

    Batches normally pass from the reader to the validator in one fused
    stage; the coder matters for the size sampling a runner does, and for
    runners that do not fuse.
    """

    def encode(self, value: RawEvents) -> bytes:
        """Pickle the small fields, Arrow IPC the table."""
        table = None if value.table is None else table_to_ipc(value.table)
        return pickle.dumps(
            (
                value.source,
                value.first_offset,
                table,
                value.payloads,
                value.offsets,
                value.partition,
            )
        )

    def decode(self, encoded: bytes) -> RawEvents:
        """Inverse of :meth:`encode`."""
        source, first, table, payloads, offsets, partition = pickle.loads(encoded)
        return RawEvents(
            source,
            first,
            table=None if table is None else ipc_to_table(table),
            payloads=payloads,
            offsets=offsets,
            partition=partition,
        )

    def is_deterministic(self) -> bool:
        """Batches are never keys."""
        return False

    def estimate_size(self, value: RawEvents, nested: bool = False) -> int:
        """Bytes held, without encoding."""
        if value.table is not None:
            return int(value.table.nbytes)
        return sum(len(p) for p in value.payloads or ())


beam.coders.registry.register_coder(RawEvents, RawEventsCoder)


class ValidateEventsFn(PooledDoFn):
    """Split each :class:`RawEvents` into a valid table and dead-letter lines
    (on worker threads, :class:`~pipelines.batch.parallel.PooledDoFn`, while
    the next batch is read). What is fused after it only queues the valid
    rows for sharding on a thread of its own, so the pool takes the bundle
    thread's core too (:attr:`~pipelines.batch.parallel.PooledDoFn.emits_little`).
    """

    emits_little = True

    def __init__(self, now: int | None) -> None:
        self._now = now
        self.read = Metrics.counter(METRICS_NAMESPACE, "events_read")
        self.valid = Metrics.counter(METRICS_NAMESPACE, "events_valid")
        self.dead = Metrics.counter(METRICS_NAMESPACE, "events_dead_lettered")

    def compute(self, batch: RawEvents) -> tuple[pa.Table | None, list[str], int]:
        """The valid rows, the dead-letter lines, and the events read."""
        now = self._now if self._now is not None else now_ms()
        lines: list[str] = []
        valid: pa.Table | None
        if batch.table is not None:
            valid, lines = table_dead_letters(batch, now)
            read = batch.table.num_rows
        else:
            payloads = batch.payloads or ()
            records: list[dict[str, Any]] = []
            for index, payload in enumerate(payloads):
                decoded = decode_event(payload, now=now)
                if decoded.event is not None:
                    records.append(decoded.event)
                    continue
                reason = decoded.reason or "invalid event"
                lines.append(batch.dead_letter(index, reason, payload).to_json())
            valid = events_from_records(records) if records else None
            read = len(payloads)
        if valid is not None:
            valid = valid.select(list(EVENT_COLUMNS)).cast(EVENT_SCHEMA)
        return valid, lines, read

    def emit(self, result: tuple[pa.Table | None, list[str], int]) -> Iterator[Any]:
        """Count; one line per rejected event (tagged), then the valid table."""
        valid, lines, read = result
        self.read.inc(read)
        self.dead.inc(len(lines))
        self.valid.inc(read - len(lines))
        for line in lines:
            yield pvalue.TaggedOutput(DEAD_LETTERS, line)
        if valid is not None and valid.num_rows:
            yield valid


def table_dead_letters(batch: RawEvents, now: int) -> tuple[pa.Table, list[str]]:
    """A table batch's valid rows, and a dead-letter line per rejected row
    (its payload: the row's wire JSON)."""
    assert batch.table is not None
    reasons = event_table_reasons(batch.table, now=now)
    rejected = np.flatnonzero(pd.notna(reasons))
    if rejected.size == 0:
        return batch.table, []
    keep = np.ones(batch.table.num_rows, dtype=bool)
    keep[rejected] = False
    wire = encode_event_table(batch.table.take(pa.array(rejected)))
    lines = [
        batch.dead_letter(int(index), reasons[index], payload).to_json()
        for index, payload in zip(rejected, wire, strict=True)
    ]
    return batch.table.filter(pa.array(keep)), lines


class ValidateEvents(beam.PTransform):  # type: ignore[misc]
    """Valid events (``pa.Table`` batches in EVENT_SCHEMA) and dead-letter lines.

    Returns a ``DoOutputsTuple``: ``.valid`` and ``.dead_letters``.
    """

    def __init__(self, now: int | None = None) -> None:
        super().__init__()
        self._now = now

    def expand(self, batches: beam.PCollection) -> Any:
        """Apply the validator with its tagged dead-letter output."""
        return batches | "Validate" >> beam.ParDo(
            ValidateEventsFn(self._now).tuned(pipeline_tuning(batches.pipeline))
        ).with_output_types(pa.Table).with_outputs(DEAD_LETTERS, main="valid")
