"""``ValidateEvents``: raw event batches in, valid event tables out, and dead letters.

Parquet batches are validated whole with
:func:`features.events.validate_event_table`; JSONL lines and Kafka messages
one by one with :func:`features.events.decode_event` (then gathered into one
table per batch). A rejected event is not an error: it leaves on the
``dead_letters`` tagged output as one JSON line (its fields in the event wire
format plus ``reason``; a payload that is not a JSON object is kept as
``payload`` text), and is counted, so ``events_read = events_valid +
events_dead_lettered``.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam import pvalue
from apache_beam.metrics import Metrics

from features.events import (
    EVENT_COLUMNS,
    EVENT_SCHEMA,
    decode_event,
    encode_event_table,
    events_from_records,
    now_ms,
    validate_event_table,
)
from pipelines.beam.arrow import ipc_to_table, table_to_ipc
from pipelines.beam.parallel import PooledDoFn

METRICS_NAMESPACE = "gem.build"
DEAD_LETTERS = "dead_letters"


@dataclass(frozen=True)
class RawEvents:
    """One batch of raw events as read, before validation.

    Exactly one of ``table`` (Parquet rows, in EVENT_SCHEMA) and ``payloads``
    (JSONL lines or Kafka message values) is set.

    Attributes:
        source: file or ``topic/partition`` it came from (for error messages).
        first_offset: row, line or Kafka offset of the first event.
        table: Parquet rows.
        payloads: wire messages, one event each.
    """

    source: str
    first_offset: int
    table: pa.Table | None = None
    payloads: tuple[bytes, ...] | None = None


class RawEventsCoder(beam.coders.Coder):  # type: ignore[misc]
    """Coder of :class:`RawEvents`: the table as Arrow IPC, never pickled.

    Batches normally pass from the reader to the validator in one fused
    stage; the coder matters for the size sampling a runner does, and for
    runners that do not fuse.
    """

    def encode(self, value: RawEvents) -> bytes:
        """Pickle the small fields, Arrow IPC the table."""
        table = None if value.table is None else table_to_ipc(value.table)
        return pickle.dumps((value.source, value.first_offset, table, value.payloads))

    def decode(self, encoded: bytes) -> RawEvents:
        """Inverse of :meth:`encode`."""
        source, first, table, payloads = pickle.loads(encoded)
        return RawEvents(
            source,
            first,
            table=None if table is None else ipc_to_table(table),
            payloads=payloads,
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


def dead_letter_line(record: dict[str, Any] | None, payload: bytes, reason: str) -> str:
    """The dead-letter JSON line of one rejected event.

    Args:
        record: the event's fields when the payload was a JSON object.
        payload: the original bytes (kept as text when not an object).
        reason: why it was rejected.
    """
    if record is None:
        body: dict[str, Any] = {"payload": payload.decode("utf-8", "replace")}
    else:
        body = dict(record)
    body["reason"] = reason
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


class ValidateEventsFn(PooledDoFn):
    """Split each :class:`RawEvents` into a valid table and dead-letter lines
    (on a worker thread, :class:`~pipelines.beam.parallel.PooledDoFn`, while
    the next batch is read and the last one sharded)."""

    def __init__(self, now: int | None) -> None:
        self._now = now
        self.read = Metrics.counter(METRICS_NAMESPACE, "events_read")
        self.valid = Metrics.counter(METRICS_NAMESPACE, "events_valid")
        self.dead = Metrics.counter(METRICS_NAMESPACE, "events_dead_lettered")

    def compute(self, batch: RawEvents) -> tuple[pa.Table | None, list[str], int]:
        """The valid rows, the dead-letter lines, and the events read."""
        now = self._now if self._now is not None else now_ms()
        lines: list[str] = []
        if batch.table is not None:
            valid, rejected = validate_event_table(batch.table, now=now)
            reasons = rejected.column("reason").to_pylist()
            wire = encode_event_table(rejected.drop_columns(["reason"]))
            for line, reason in zip(wire, reasons, strict=True):
                lines.append(dead_letter_line(json.loads(line), line, reason))
            read = batch.table.num_rows
        else:
            payloads = batch.payloads or ()
            records: list[dict[str, Any]] = []
            for payload in payloads:
                decoded = decode_event(payload, now=now)
                if decoded.event is not None:
                    records.append(decoded.event)
                    continue
                assert decoded.reason is not None
                lines.append(
                    dead_letter_line(_json_object(payload), payload, decoded.reason)
                )
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


def _json_object(payload: bytes) -> dict[str, Any] | None:
    """The payload as a JSON object, or None when it is not one."""
    try:
        value = json.loads(payload)
    except ValueError:  # also UnicodeDecodeError
        return None
    return value if isinstance(value, dict) else None


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
            ValidateEventsFn(self._now)
        ).with_output_types(pa.Table).with_outputs(DEAD_LETTERS, main="valid")
