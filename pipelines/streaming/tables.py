"""Schemas and Arrow helpers of the streaming job's state and messages.

Keyed state holds Arrow tables as uncompressed IPC bytes: the runner encodes
state with its coder on every write, and an uncompressed IPC stream is read
back zero-copy, so a stage pays for its state in memcpy, not in pickling.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

from features.arrow_ipc import ipc_to_table, table_to_ipc
from features.events import EVENT_SCHEMA
from features.feature_tables import counter_names
from pipelines.core.columns import IntArray, to_int64

PUSH: Final = "push"
"""The tagged output of the stateful stages that carries online rows for Feast."""

STREAM_EVENT_SCHEMA: Final = EVENT_SCHEMA.append(
    pa.field("published_ms", pa.int64(), False, {"doc": "Kafka record time (ms)"})
)
"""Valid events as the reader emits them: the event plus when it was published
(the Kafka record timestamp), which the freshness figures start from."""

ENTITY_EVENT_SCHEMA: Final = pa.schema(
    [
        pa.field("event_id", pa.string(), False),
        pa.field("entity_id", pa.int64(), False),
        pa.field("time_ms", pa.int64(), False),
        pa.field("action", pa.int64(), False),  # 1-based COUNTER_ACTIONS code
        pa.field("user_id", pa.int64(), False),
        pa.field("published_ms", pa.int64(), False),
        pa.field("digest", pa.string(), False),  # features.duplicates
    ]
)
"""An ad event as an ad / advertiser shard keeps it (the digest tells its
copies apart, :mod:`pipelines.streaming.event_ids`)."""

DROPPED_SCHEMA: Final = pa.schema(
    [
        pa.field("user_id", pa.int64(), False),
        pa.field("dropped", pa.int64(), False),
    ]
)
"""Per user: timeline events already evicted from state (the cut's offset)."""


def answer_schema(kind: str) -> pa.Schema:
    """What an entity shard sends back: an impression's ``kind`` counters."""
    return pa.schema(
        [pa.field("example_id", pa.string(), False)]
        + [pa.field(name, pa.float32(), False) for name in counter_names(kind)]
    )


def state_bytes(table: pa.Table) -> bytes:
    """A table as uncompressed IPC (cheap to write, zero-copy to read)."""
    return table_to_ipc(table, compression=None)


def state_table(data: bytes) -> pa.Table:
    """Inverse of :func:`state_bytes` (also reads compressed IPC)."""
    return ipc_to_table(data)


def concatenated(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    """Decoded state chunks as one table of ``schema`` (empty when none)."""
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables).combine_chunks()


MAX_CHUNKS: Final = 32
"""A stage compacts a bag at its next timer once it holds more chunks than this."""


def due_for_compaction(chunks: int) -> bool:
    """Whether a stage's timer should compact a bag of ``chunks`` chunks
    (drop what no output needs any more, rewrite the rest as one chunk).

    Keeping more than needed is harmless (the next compaction drops it),
    while a compaction works over the whole state and moves all of it
    through the runner; once per :data:`MAX_CHUNKS` additions, its cost
    follows what arrived since the last one, and a bag holds at most that
    much beyond its need.
    """
    return chunks > MAX_CHUNKS


def ceil_to(values: IntArray, granularity: int) -> IntArray:
    """Round times up to a multiple of ``granularity`` (ms)."""
    return -(-values // granularity) * granularity


def times_ms(table: pa.Table, column: str = "event_time") -> IntArray:
    """A timestamp or int column as epoch-ms int64."""
    return to_int64(table.column(column))
