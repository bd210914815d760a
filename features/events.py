"""The raw interaction event: schema, wire format and validation.

One event is one thing a user did or saw: an ad impression, a click or
conversion that follows it, or an organic engagement with content. User and ad
attributes are *not* copied into events; they live in the dimension tables
(:mod:`features.dimensions`), as in real logging systems.

Wire format (Kafka, JSONL): one UTF-8 JSON object per event, ``event_time`` in
epoch milliseconds (an ISO-8601 string with an explicit offset is accepted).
File format: Parquet with :data:`EVENT_SCHEMA`.

Rules beyond each field's type (checked by :func:`validate_event` and, for
whole Arrow tables, by :func:`features.event_table.validate_event_table`):

- the surface belongs to the event's domain;
- ad actions (impression, click, conversion) carry ad, advertiser, campaign,
  ad format and objective, and no content id; organic actions carry a content
  id and no ad fields;
- clicks and conversions name the impression they are attributed to
  (``impression_id``); impressions and organic events do not;
- the event time is not before :data:`MIN_EVENT_TIME_MS` nor more than
  :data:`MAX_CLOCK_SKEW_MS` ahead of the validator's clock.

Limits on what a reader accepts from outside (:func:`decode_event` checks
them before anything is built from the bytes, so no input costs more than
they allow, and none makes a reader raise):

- a message is at most :data:`MAX_EVENT_BYTES` bytes (64 KiB; an event is a
  few hundred);
- JSON nests at most :data:`MAX_NESTING_DEPTH` levels (an event is one flat
  object), checked by a scan of the brackets before the parser recurses;
- a JSON integer has at most :data:`MAX_NUMBER_DIGITS` digits (int64 needs
  19); ``NaN`` and ``Infinity`` are not JSON and are refused; a float such
  as ``1e400`` parses (to infinity) and then fails its field's type;
- integers fit their column (ids: 0 .. 2**63-1, the int64 maximum);
- strings are valid UTF-8 text (no lone surrogates, whether sent as raw
  CESU-8 bytes, which are not UTF-8, or as a ``\\ud800`` escape) of at most
  :data:`~features.fields.MAX_STRING_CHARS` (256) characters.

:func:`validate_event` (a mapping) and
:func:`~features.event_table.validate_event_table` (an Arrow table, where a
Parquet file's strings may hold invalid UTF-8 and integers are in range by
type) apply the same rules with the same reasons.

Duplicates: ``event_id`` is the idempotency key. Valid records that share one
are copies of one event, whatever user, time, file or partition they came
under; every job keeps exactly one of them, the winning copy (the first in
``(event_time, user_id, digest)`` order), and counts the others in
``duplicates_removed``, differing copies included (they are valid records, so
they are not dead-lettered). :mod:`features.duplicates` defines the order and
the horizon within which the streaming job recognizes copies.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import pandas as pd
import pyarrow as pa

from features import vocab
from features.fields import (
    FieldSpec,
    arrow_schema,
    check_fields,
    int_field,
    small_int_field,
    string_field,
    time_field,
    to_epoch_ms,
)

SCHEMA_VERSION: Final = 1
"""Version of the event contract; on every record and every Kafka message."""

MIN_EVENT_TIME_MS: Final = 788_918_400_000  # 1995-01-01T00:00:00Z
"""Earliest plausible event (MovieLens 100k starts in 1997)."""

MAX_CLOCK_SKEW_MS: Final = 3_600_000
"""How far ahead of the validator's clock an event time may be (1 hour)."""

MAX_EVENT_BYTES: Final = 65_536
"""The largest wire message :func:`decode_event` parses."""

MAX_NESTING_DEPTH: Final = 16
"""How deep JSON arrays and objects may nest in a message."""

MAX_NUMBER_DIGITS: Final = 20
"""The most digits a JSON integer may have (int64 values have at most 19)."""

# Attribution windows: a click counts for an impression if it happens within
# CLICK_WINDOW after it; a conversion if within CONVERSION_WINDOW after the
# impression. The generator draws delays inside these windows; the feature
# pipeline labels with them.
CLICK_WINDOW: Final = dt.timedelta(minutes=30)
CONVERSION_WINDOW: Final = dt.timedelta(days=1)

AD_FIELDS: Final = ("ad_id", "advertiser_id", "campaign_id", "ad_format", "objective")

EVENT_FIELDS: Final[tuple[FieldSpec, ...]] = (
    small_int_field(
        "schema_version",
        "event contract version",
        min_value=SCHEMA_VERSION,
        max_value=SCHEMA_VERSION,
    ),
    string_field("event_id", "unique id of the event; the idempotency key"),
    time_field(
        "event_time", "when the event happened (UTC)", min_value=MIN_EVENT_TIME_MS
    ),
    int_field("user_id", "the user", min_value=0),
    string_field("domain", "app the event happened in", allowed=vocab.DOMAINS),
    string_field("surface", "place within the app", allowed=vocab.SURFACES),
    string_field("action", "what happened", allowed=vocab.ACTIONS),
    int_field("ad_id", "the ad (ad actions only)", nullable=True, min_value=0),
    int_field(
        "advertiser_id",
        "the ad's advertiser (ad actions only)",
        nullable=True,
        min_value=0,
    ),
    int_field(
        "campaign_id",
        "the ad's campaign (ad actions only)",
        nullable=True,
        min_value=0,
    ),
    string_field(
        "ad_format",
        "creative format (ad actions only)",
        nullable=True,
        allowed=vocab.AD_FORMATS,
    ),
    string_field(
        "objective",
        "advertiser's campaign objective (ad actions only)",
        nullable=True,
        allowed=vocab.AD_OBJECTIVES,
    ),
    string_field(
        "impression_id",
        "event_id of the impression a click or conversion is attributed to",
        nullable=True,
    ),
    int_field(
        "content_id",
        "organic content engaged with (organic actions only)",
        nullable=True,
        min_value=0,
    ),
)

EVENT_SCHEMA: Final = arrow_schema(EVENT_FIELDS, "event")
EVENT_COLUMNS: Final = tuple(f.name for f in EVENT_FIELDS)

SURFACE_PAIRS: Final = frozenset(
    (domain, surface)
    for domain, surfaces in vocab.SURFACES_BY_DOMAIN.items()
    for surface in surfaces
)


def now_ms() -> int:
    """The validator's clock, in epoch milliseconds."""
    return time.time_ns() // 1_000_000


def _cross_field_reason(record: Mapping[str, Any]) -> str | None:
    """Rules that tie fields together (see the module docstring)."""
    domain, surface, action = record["domain"], record["surface"], record["action"]
    if (domain, surface) not in SURFACE_PAIRS:
        return f"surface {surface!r} does not belong to domain {domain!r}"
    if action in vocab.AD_ACTIONS:
        for name in AD_FIELDS:
            if record.get(name) is None:
                return f"ad action {action!r} is missing '{name}'"
        if record.get("content_id") is not None:
            return f"ad action {action!r} must not carry 'content_id'"
    else:
        if record.get("content_id") is None:
            return f"organic action {action!r} is missing 'content_id'"
        for name in AD_FIELDS:
            if record.get(name) is not None:
                return f"organic action {action!r} must not carry '{name}'"
    needs_impression = action in ("click", "conversion")
    has_impression = record.get("impression_id") is not None
    if needs_impression and not has_impression:
        return f"{action!r} is missing 'impression_id'"
    if has_impression and not needs_impression:
        return f"{action!r} must not carry 'impression_id'"
    return None


def validate_event(record: Mapping[str, Any], *, now: int | None = None) -> str | None:
    """The reason a decoded event is invalid, or None when it is valid.

    Args:
        record: the event as a mapping (a decoded JSON object or a table row).
        now: the clock to compare event times with, in epoch milliseconds;
            defaults to the wall clock.

    Example:
        >>> validate_event({"event_id": "e1"})
        "missing required field 'schema_version'"
    """
    if not isinstance(record, Mapping):
        return f"an event must be a JSON object, got {type(record).__name__}"
    reason = check_fields(EVENT_FIELDS, record)
    if reason is not None:
        return reason
    event_ms = to_epoch_ms(record["event_time"])
    assert event_ms is not None  # check_fields accepted it
    limit = (now_ms() if now is None else now) + MAX_CLOCK_SKEW_MS
    if event_ms > limit:
        return future_reason(record["event_time"], limit)
    return _cross_field_reason(record)


@dataclass(frozen=True)
class DecodedEvent:
    """The result of decoding one wire message: the event or the reason not."""

    event: dict[str, Any] | None
    reason: str | None


class _LimitError(ValueError):
    """A limit of the module docstring, hit while parsing; carries the reason."""


def _bounded_int(digits: str) -> int:
    """``parse_int`` for json.loads: refuse integers beyond the digit limit
    before Python's conversion (quadratic in the digits) runs."""
    count = len(digits) - digits.startswith("-")
    if count > MAX_NUMBER_DIGITS:
        raise _LimitError(
            f"integer of {count} digits, more than the {MAX_NUMBER_DIGITS} allowed"
        )
    return int(digits)


def _no_constant(name: str) -> float:
    """``parse_constant`` for json.loads: NaN and Infinity are not JSON."""
    raise _LimitError(f"not JSON: {name} is not a JSON number")


def _nesting_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text``, strings ignored.

    One pass, whatever the text holds (it may not be JSON at all).
    """
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def decode_event(payload: bytes, *, now: int | None = None) -> DecodedEvent:
    """Decode and validate one wire message (UTF-8 JSON).

    Never raises: oversized, undecodable or too deeply nested bytes, bad JSON
    and invalid events all come back with ``event=None`` and a reason for the
    dead-letter record (limits: the module docstring).

    Example:
        >>> decode_event(b"\\xff").reason
        'not UTF-8: invalid start byte at byte 0'
    """
    try:
        return _decode_event(payload, now)
    except Exception as error:  # the contract: a reason, never an exception
        return DecodedEvent(None, f"undecodable event ({type(error).__name__})")


def _decode_event(payload: bytes, now: int | None) -> DecodedEvent:
    if len(payload) > MAX_EVENT_BYTES:
        return DecodedEvent(
            None,
            f"message of {len(payload)} bytes, more than the {MAX_EVENT_BYTES} allowed",
        )
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as error:
        return DecodedEvent(None, f"not UTF-8: {error.reason} at byte {error.start}")
    # Counting brackets is cheap; only a message with many is scanned, so
    # that the parser never recurses deeper than the limit.
    if text.count("[") + text.count("{") > MAX_NESTING_DEPTH:
        depth = _nesting_depth(text)
        if depth > MAX_NESTING_DEPTH:
            return DecodedEvent(
                None,
                f"JSON nested {depth} levels deep, more than the "
                f"{MAX_NESTING_DEPTH} allowed",
            )
    try:
        record = json.loads(text, parse_int=_bounded_int, parse_constant=_no_constant)
    except _LimitError as refused:
        return DecodedEvent(None, str(refused))
    except json.JSONDecodeError as error:
        return DecodedEvent(None, f"not JSON: {error.msg} at char {error.pos}")
    except RecursionError:  # nesting the bracket scan missed (it cannot)
        return DecodedEvent(None, "JSON nested too deeply")
    reason = validate_event(record, now=now)
    if reason is not None:
        return DecodedEvent(None, reason)
    # One time representation downstream: epoch milliseconds.
    record["event_time"] = to_epoch_ms(record["event_time"])
    return DecodedEvent(record, None)


def encode_event(record: Mapping[str, Any]) -> bytes:
    """Wire form of one event (compact UTF-8 JSON, event_time in epoch ms)."""
    out = dict(record)
    millis = to_epoch_ms(out.get("event_time"))
    if millis is not None:
        out["event_time"] = millis
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode()


def events_to_jsonl(table: pa.Table) -> str:
    """The wire form of every event of a table as JSON lines, vectorized.

    No per-event ``json.dumps``: pandas' encoder does the whole table. Integer
    columns go through pandas' nullable dtypes so ids stay integers next to
    nulls (a float64 ``12.0`` would fail validation); times become epoch ms.
    """
    if table.num_rows == 0:
        return ""
    frame = table.select(list(EVENT_COLUMNS)).to_pandas(
        types_mapper={pa.int64(): pd.Int64Dtype(), pa.int16(): pd.Int16Dtype()}.get
    )
    text: str = frame.to_json(
        orient="records", lines=True, date_unit="ms", force_ascii=False
    )
    return text


def encode_event_table(table: pa.Table) -> list[bytes]:
    """Wire form of every event of a table, one message body per event.

    A string that is not UTF-8 (a Parquet file can hold one) is written as
    its bytes, so a rejected row's wire form keeps what the file held.
    """
    try:
        # "\n" only: str.splitlines also splits inside strings at U+0085, U+2028.
        lines = events_to_jsonl(table).split("\n")
        return [line.encode() for line in lines if line]
    except (ValueError, OverflowError, pa.ArrowException):
        # Bytes that are not UTF-8, a time outside pandas' or Python's range.
        return [_encode_row(table.slice(i, 1)) for i in range(table.num_rows)]


def _encode_row(row: pa.Table) -> bytes:
    """One row's wire form; strings that are not UTF-8 as their bytes."""
    try:
        return events_to_jsonl(row).rstrip("\n").encode()
    except (ValueError, OverflowError, pa.ArrowException):
        pass
    record: dict[str, Any] = {}
    for name in EVENT_COLUMNS:
        column = row.column(name)
        if pa.types.is_string(column.type):
            raw = column.cast(pa.binary())[0].as_py()
            # surrogateescape maps each undecodable byte to a code point
            # that encodes back to that byte.
            record[name] = (
                None if raw is None else raw.decode("utf-8", "surrogateescape")
            )
        elif pa.types.is_timestamp(column.type):
            record[name] = column.cast(pa.int64())[0].as_py()
        else:
            record[name] = column[0].as_py()
    text = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogateescape")


def events_from_records(records: list[dict[str, Any]]) -> pa.Table:
    """Validated, decoded events (as :func:`decode_event` returns them) to a table."""
    return pa.Table.from_pylist(records, schema=EVENT_SCHEMA)


def future_reason(value: Any, limit_ms: int) -> str:
    """The reason of an event time ``value`` past ``limit_ms``."""
    limit = dt.datetime.fromtimestamp(limit_ms / 1000, dt.UTC).isoformat()
    return f"event_time {value!r} is in the future (after {limit})"
