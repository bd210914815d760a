"""Copies of an event: which one counts, wherever events are deduplicated.

``event_id`` is the idempotency key: every record carrying one event_id is a
copy of one event, whatever user, time or shard it arrives under, and the
batch job, the streaming job and the reference keep exactly one copy of it.
Which copy is a function of the copies alone, never of their arrival order,
file, partition or shard:

- the **winning copy** is the first in ``(event_time, user_id, digest)``
  order, where the digest (:func:`copy_digests`) is the hex SHA-256 of the
  event's canonical bytes, its wire form as :func:`canonical_event_bytes`
  writes it (fields in :data:`~features.events.EVENT_COLUMNS` order,
  ``event_time`` in epoch ms); copies equal in all three are identical, so
  any of them is the winner. A digest rather than the bytes themselves, so
  that the streaming job's id stage can order copies from a fixed-size key;
- every other copy is a duplicate, counted in ``duplicates_removed``, whether
  it is an exact copy (a retry) or differs (another user, time or field):
  the key says they are one event, and a differing copy is not an invalid
  record, so it is not dead-lettered. Counts balance as ``events_valid =
  events_distinct + duplicates_removed``.

Why the earliest copy: the streaming job takes a copy in until it is the
allowed lateness behind the watermark (later it is dead-lettered as late), so
by the time anything a copy at ``t`` can change is released (once the
watermark has passed ``t`` plus the lateness), every copy that could beat it,
one at or before ``t``, has arrived. Within the contract's lateness rule the
streaming job therefore keeps the same copies as the batch job.

The streaming job remembers an id until the watermark passes its winning
copy's time plus the allowed lateness plus :data:`DUPLICATE_HORIZON_MS`,
which bounds its state: a copy up to the horizon after the winner has
arrived by then or is late. Copies of one event_id further apart than that
are outside the contract (the batch job and the reference still keep one;
the streaming job may keep both).
"""

from __future__ import annotations

import hashlib
from typing import Final

import pyarrow as pa

from features.events import EVENT_COLUMNS, events_to_jsonl

DUPLICATE_HORIZON_MS: Final = 86_400_000
"""How far (event time) after its winning copy a copy of an event_id is still
recognized by the streaming job: one day covers a producer's retries and a
replay of a day's log, and bounds the ids its state holds."""


def canonical_event_bytes(events: pa.Table) -> list[bytes]:
    """The canonical bytes of each event (what the digest of a copy is taken of).

    Args:
        events: rows with at least the :data:`~features.events.EVENT_COLUMNS`
            in :data:`~features.events.EVENT_SCHEMA` types (other columns,
            such as a Kafka record time, are not part of the event).

    Example:
        >>> from features.events import EVENT_SCHEMA
        >>> row = {name: None for name in EVENT_SCHEMA.names}
        >>> row |= {"schema_version": 1, "event_id": "e1", "event_time": 5,
        ...         "user_id": 2, "domain": "d", "surface": "s", "action": "a"}
        >>> canonical_event_bytes(pa.Table.from_pylist([row], EVENT_SCHEMA))[0][:40]
        b'{"schema_version":1,"event_id":"e1","eve'
    """
    if events.num_rows == 0:
        return []
    lines = events_to_jsonl(events.select(list(EVENT_COLUMNS))).splitlines()
    return [line.encode("utf-8") for line in lines]


def copy_digests(events: pa.Table) -> list[str]:
    """The digest of each event (hex SHA-256 of its canonical bytes), the
    last key of the order between copies.

    Example:
        >>> from features.events import EVENT_SCHEMA
        >>> row = {name: None for name in EVENT_SCHEMA.names}
        >>> row |= {"schema_version": 1, "event_id": "e1", "event_time": 5,
        ...         "user_id": 2, "domain": "d", "surface": "s", "action": "a"}
        >>> len(copy_digests(pa.Table.from_pylist([row], EVENT_SCHEMA))[0])
        64
    """
    return [hashlib.sha256(line).hexdigest() for line in canonical_event_bytes(events)]
