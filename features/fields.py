"""Declarative field specs: one definition gives the Arrow schema and validation.

Every record type of the contract (raw event, user, ad, content, training
example) is a tuple of :class:`FieldSpec`. From it we derive

- the Arrow schema writers and readers use (:func:`arrow_schema`), and
- a validator for one decoded record (:func:`check_fields`) that returns the
  reason a record is invalid instead of coercing it.

Keeping both in one place is what stops the Parquet files, the Kafka messages
and the validation rules from drifting apart.

Limits every field of every record type has, whatever its spec says:

- an integer fits its Arrow type (``int64``: -2**63 .. 2**63-1; ``int16``:
  -32768 .. 32767), so a valid record always fits its table;
- a string is valid Unicode that UTF-8 can encode (no lone surrogates: a JSON
  ``"\\ud800"`` escape decodes to one) and at most :data:`MAX_STRING_CHARS`
  characters long, ISO-8601 time strings included.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

import pyarrow as pa

MAX_STRING_CHARS: Final = 256
"""The longest string a field may hold, in characters (code points): ids and
vocabulary values are far shorter, and a bound keeps reasons and tables small."""

MAX_SHOWN_CHARS: Final = 64
"""How much of a value a reason quotes."""

INT_RANGES: Final = {
    pa.int64(): (-(2**63), 2**63 - 1),
    pa.int32(): (-(2**31), 2**31 - 1),
    pa.int16(): (-(2**15), 2**15 - 1),
}
"""The values each integer Arrow type of the contract can hold."""


class Kind(Enum):
    """The logical type of a field; each maps to one Arrow type."""

    INT = "int"
    FLOAT = "float"
    STRING = "string"
    TIMESTAMP = "timestamp"
    INT_LIST = "int_list"
    FLOAT_LIST = "float_list"


@dataclass(frozen=True, kw_only=True)
class FieldSpec:
    """One field of a record type.

    Args:
        name: column / JSON key.
        kind: logical type.
        arrow_type: the Arrow type used on disk and on the wire.
        nullable: whether null (or a missing key) is allowed.
        allowed: for strings, the closed vocabulary the value must belong to.
        min_value: inclusive lower bound for numbers.
        max_value: inclusive upper bound for numbers.
        doc: what the field means (shown in the README's contract table).
    """

    name: str
    kind: Kind
    arrow_type: pa.DataType
    nullable: bool = False
    allowed: tuple[str, ...] | None = None
    min_value: float | None = None
    max_value: float | None = None
    doc: str = ""

    def arrow_field(self) -> pa.Field:
        """The Arrow field, carrying the doc string as metadata."""
        metadata = {"doc": self.doc} if self.doc else None
        return pa.field(self.name, self.arrow_type, self.nullable, metadata)


TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")


def int_field(name: str, doc: str, **kw: Any) -> FieldSpec:
    """An int64 field (ids and counts)."""
    return FieldSpec(name=name, kind=Kind.INT, arrow_type=pa.int64(), doc=doc, **kw)


def small_int_field(name: str, doc: str, **kw: Any) -> FieldSpec:
    """An int16 field (versions, small codes)."""
    return FieldSpec(name=name, kind=Kind.INT, arrow_type=pa.int16(), doc=doc, **kw)


def string_field(name: str, doc: str, **kw: Any) -> FieldSpec:
    """A UTF-8 string field, optionally from a closed vocabulary (``allowed``)."""
    return FieldSpec(name=name, kind=Kind.STRING, arrow_type=pa.string(), doc=doc, **kw)


def time_field(name: str, doc: str, **kw: Any) -> FieldSpec:
    """A UTC timestamp with millisecond precision."""
    return FieldSpec(
        name=name, kind=Kind.TIMESTAMP, arrow_type=TIMESTAMP_TYPE, doc=doc, **kw
    )


def arrow_schema(fields: tuple[FieldSpec, ...], name: str) -> pa.Schema:
    """The Arrow schema of a record type, with its name in the metadata."""
    return pa.schema([f.arrow_field() for f in fields], metadata={"record": name})


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def to_epoch_ms(value: Any) -> int | None:
    """Milliseconds since the epoch for the timestamp forms we accept, else None.

    Accepted: an int (epoch milliseconds), a timezone-aware ``datetime``, or an
    ISO-8601 string with an explicit offset (``Z`` or ``+hh:mm``). Naive times
    are rejected: guessing their zone is the silent coercion the contract
    forbids.

    Example:
        >>> to_epoch_ms("1970-01-01T00:00:01Z"), to_epoch_ms("1970-01-01T00:00:01")
        (1000, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            return None
        try:
            return (value - _EPOCH) // dt.timedelta(milliseconds=1)
        except OverflowError:  # an offset that moves year 1 or 9999 out of range
            return None
    return None


def text_reason(name: str, value: str) -> str | None:
    """Why a string cannot be a field's value (not UTF-8 text, too long), or None.

    The table validator (:func:`features.event_table.validate_event_table`) gives
    the same reasons, so they are worded for both.
    """
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"field '{name}' is not valid UTF-8 text"
    if len(value) > MAX_STRING_CHARS:
        return length_reason(name, len(value))
    return None


def length_reason(name: str, length: int) -> str:
    """The reason a string of ``length`` characters is too long."""
    return (
        f"field '{name}' has {length} characters, more than the "
        f"{MAX_STRING_CHARS} allowed"
    )


def shown(value: Any) -> str:
    """``repr`` of a value, cut to :data:`MAX_SHOWN_CHARS` characters.

    ``repr`` escapes what is not printable, lone surrogates included, so a
    reason is always valid text, and short whatever the value was.
    """
    text = repr(value)
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    return f"{text[:MAX_SHOWN_CHARS]}... ({len(text)} characters)"


def _int_shown(value: int) -> str:
    """An integer for a reason: its digits while they are few (Python refuses
    to write out one of thousands of digits, and a reason stays short)."""
    if value.bit_length() <= 128:
        return repr(value)
    digits = math.floor(value.bit_length() * math.log10(2)) + 1
    return f"an integer of about {digits} digits"


def check_value(spec: FieldSpec, value: Any) -> str | None:
    """The reason ``value`` is not valid for ``spec``, or None when it is."""
    if value is None:
        return None if spec.nullable else f"missing required field '{spec.name}'"
    kind = spec.kind
    if kind is Kind.INT:
        # bool is an int subclass in Python; JSON true is not an id.
        if isinstance(value, bool) or not isinstance(value, int):
            return f"field '{spec.name}' must be an integer, got {type(value).__name__}"
        bounds = INT_RANGES.get(spec.arrow_type)
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            return (
                f"field '{spec.name}' is {_int_shown(value)}, outside the "
                f"{spec.arrow_type} range"
            )
        number: float = value
    elif kind is Kind.FLOAT:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"field '{spec.name}' must be a number, got {type(value).__name__}"
        if not math.isfinite(value):
            return f"field '{spec.name}' must be finite, got {value}"
        number = value
    elif kind is Kind.STRING:
        if not isinstance(value, str):
            return f"field '{spec.name}' must be a string, got {type(value).__name__}"
        reason = text_reason(spec.name, value)
        if reason is not None:
            return reason
        if spec.allowed is not None and value not in spec.allowed:
            return f"field '{spec.name}' has unknown value {value!r}"
        if not value:
            return f"field '{spec.name}' must not be empty"
        return None
    elif kind is Kind.TIMESTAMP:
        if isinstance(value, str):
            reason = text_reason(spec.name, value)
            if reason is not None:
                return reason
        millis = to_epoch_ms(value)
        if millis is None:
            return (
                f"field '{spec.name}' must be epoch milliseconds or an ISO-8601 "
                f"time with a UTC offset, got {shown(value)}"
            )
        low, high = INT_RANGES[pa.int64()]
        if not low <= millis <= high:
            shown_time = _int_shown(value) if isinstance(value, int) else shown(value)
            return f"field '{spec.name}' is {shown_time}, outside the int64 range"
        number = millis
    else:  # list kinds
        if not isinstance(value, list):
            return f"field '{spec.name}' must be a list, got {type(value).__name__}"
        return None
    if spec.min_value is not None and number < spec.min_value:
        return f"field '{spec.name}' is {value!r}, below the minimum {spec.min_value}"
    if spec.max_value is not None and number > spec.max_value:
        return f"field '{spec.name}' is {value!r}, above the maximum {spec.max_value}"
    return None


def check_fields(
    fields: tuple[FieldSpec, ...], record: Mapping[str, Any]
) -> str | None:
    """The first reason ``record`` breaks a field spec, or None.

    Unknown keys are an error too: a producer sending a field we do not know is
    usually a producer on a newer schema, which must bump the version.
    """
    known = {f.name for f in fields}
    unknown = sorted(set(record) - known)
    if unknown:
        # A hostile record may hold thousands of keys, each long.
        listed = ", ".join(shown(key) for key in unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        return f"unknown field(s) {listed}{more}"
    for spec in fields:
        reason = check_value(spec, record.get(spec.name))
        if reason is not None:
            return reason
    return None
