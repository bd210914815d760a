"""Validation of whole Arrow tables of events, vectorized.

:func:`validate_event_table` applies the rules of
:func:`features.events.validate_event` to a table already in
:data:`~features.events.EVENT_SCHEMA` (types hold by construction; a Parquet
file's strings may still hold invalid UTF-8), column by column, and gives
the same reason for every row (a test holds the two together).
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features import vocab
from features.events import (
    AD_FIELDS,
    EVENT_FIELDS,
    EVENT_SCHEMA,
    MAX_CLOCK_SKEW_MS,
    SURFACE_PAIRS,
    future_reason,
    now_ms,
)
from features.fields import MAX_STRING_CHARS, length_reason


def validate_event_table(
    table: pa.Table, *, now: int | None = None
) -> tuple[pa.Table, pa.Table]:
    """Split a table of events into valid rows and rejected rows with reasons.

    The vectorized counterpart of :func:`validate_event` for tables already in
    :data:`EVENT_SCHEMA` (so types hold by construction); it applies the same
    rules and, row for row, gives the same reasons (a test holds the two
    together). ``len(valid) + len(rejected) == len(table)``.

    Returns:
        ``(valid, rejected)``; ``rejected`` has an extra string column
        ``reason``.
    """
    reasons = event_table_reasons(table, now=now)
    unflagged = pd.isna(reasons)
    bad_rows = ~unflagged
    # Usually every row is valid: no copy of the table then.
    valid = table if unflagged.all() else table.filter(pa.array(unflagged))
    rejected = table.filter(pa.array(bad_rows)).append_column(
        "reason", pa.array(reasons[bad_rows].tolist(), pa.string())
    )
    return valid, rejected


def event_table_reasons(table: pa.Table, *, now: int | None = None) -> Any:
    """The reason each row of ``table`` is invalid (None where it is valid),
    as a numpy object array: :func:`validate_event_table` row by row, for
    readers that must say which rows they set aside.
    """
    if table.schema.remove_metadata() != EVENT_SCHEMA.remove_metadata():
        raise ValueError(
            "table does not have the event schema; differences: "
            + _schema_diff(table.schema, EVENT_SCHEMA)
        )
    n = table.num_rows
    reasons = np.full(n, None, dtype=object)
    # Rows without a reason yet: a bool mask, much cheaper to test than
    # ``reasons == None`` on the object array for every rule.
    unflagged = np.ones(n, dtype=bool)

    def flag(mask: pa.Array | pa.ChunkedArray, reason: Any) -> None:
        """Record ``reason`` for rows where ``mask`` holds and none is set yet."""
        # Most rules match no row: a bitmap test skips the numpy conversion.
        if not pc.any(mask).as_py():
            return
        hits = np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False))
        hits &= unflagged
        if not hits.any():
            return
        unflagged[hits] = False
        if callable(reason):
            idx = np.flatnonzero(hits)
            reasons[idx] = [reason(int(i)) for i in idx]
        else:
            reasons[hits] = reason

    col = table.column
    # Field rules, in the same order as validate_event's check_fields.
    for spec in EVENT_FIELDS:
        values = col(spec.name)
        if not spec.nullable:
            flag(pc.is_null(values), f"missing required field '{spec.name}'")
        if spec.kind.value == "string":
            flag(
                _invalid_utf8(values),
                f"field '{spec.name}' is not valid UTF-8 text",
            )
            lengths = pc.utf8_length(values)
            flag(
                pc.greater(lengths, MAX_STRING_CHARS),
                lambda i, s=spec, n=lengths: length_reason(s.name, n[i].as_py()),
            )
        if spec.allowed is not None:
            allowed = pa.array(spec.allowed, pa.string())
            # is_in() is false (not null) for a null input, so a null in a
            # nullable vocabulary column would read as an unknown value.
            bad = pc.and_(
                pc.is_valid(values),
                pc.invert(pc.is_in(values, value_set=allowed)),
            )
            flag(
                bad,
                lambda i, s=spec, v=values: (
                    f"field '{s.name}' has unknown value {v[i].as_py()!r}"
                ),
            )
        # An empty value outside a vocabulary without "" was flagged as
        # unknown just above: the rule can only match without a vocabulary.
        if spec.kind.value == "string" and (spec.allowed is None or "" in spec.allowed):
            flag(pc.equal(values, ""), f"field '{spec.name}' must not be empty")
        if spec.min_value is not None or spec.max_value is not None:
            numeric = (
                pc.cast(values, pa.int64())
                if spec.kind.value == "timestamp"
                else values
            )
            for bound, cmp, word in (
                (spec.min_value, pc.less, "below the minimum"),
                (spec.max_value, pc.greater, "above the maximum"),
            ):
                if bound is None:
                    continue
                flag(
                    cmp(numeric, pa.scalar(int(bound), numeric.type)),
                    lambda i, s=spec, v=values, b=bound, w=word: (
                        f"field '{s.name}' is {_record_value(v[i])!r}, {w} {b}"
                    ),
                )
    limit = (now_ms() if now is None else now) + MAX_CLOCK_SKEW_MS
    times = pc.cast(col("event_time"), pa.int64())
    flag(
        pc.greater(times, limit),
        lambda i: future_reason(times[i].as_py(), limit),
    )
    _flag_cross_field(table, flag)
    return reasons


def _invalid_utf8(values: pa.ChunkedArray) -> pa.Array:
    """Rows of a string column whose bytes are not UTF-8.

    Arrow does not check the bytes of a Parquet string column when it reads
    it; a full validation of each chunk does, and only a chunk that fails it
    is looked at row by row.
    """
    flags = np.zeros(len(values), dtype=bool)
    start = 0
    for chunk in values.chunks:
        try:
            chunk.validate(full=True)
        except pa.ArrowInvalid:
            raws = chunk.cast(pa.binary()).to_pylist()
            flags[start : start + len(chunk)] = [_not_utf8(raw) for raw in raws]
        start += len(chunk)
    return pa.array(flags)


def _not_utf8(raw: bytes | None) -> bool:
    if raw is None:
        return False
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _record_value(scalar: pa.Scalar) -> Any:
    """A table value as validate_event sees it in a JSON record."""
    if pa.types.is_timestamp(scalar.type):
        # Epoch milliseconds straight from the integer: a time outside
        # Python's calendar (years 1 to 9999) has no datetime.
        return scalar.cast(pa.int64()).as_py()
    return scalar.as_py()


def _flag_cross_field(table: pa.Table, flag: Any) -> None:
    """The cross-field rules of :func:`features.events.validate_event`,
    vectorized, rule for rule."""
    col = table.column
    domain, surface, action = col("domain"), col("surface"), col("action")
    # (domain, surface) pairs by vocabulary index: a lookup in a small table
    # instead of joining two strings per row; a value outside the pairs'
    # vocabulary (or null) indexes the last row / column, never allowed.
    domain_index = _index_or_last(domain, _PAIR_DOMAINS)
    surface_index = _index_or_last(surface, _PAIR_SURFACES)
    flag(
        pa.array(~_PAIR_ALLOWED[domain_index, surface_index]),
        lambda i: (
            f"surface {surface[i].as_py()!r} does not belong to domain "
            f"{domain[i].as_py()!r}"
        ),
    )
    is_ad = pc.is_in(action, value_set=pa.array(vocab.AD_ACTIONS))
    is_organic = pc.invert(is_ad)
    for name in AD_FIELDS:
        flag(
            pc.and_(is_ad, pc.is_null(col(name))),
            lambda i, n=name: f"ad action {action[i].as_py()!r} is missing '{n}'",
        )
    flag(
        pc.and_(is_ad, pc.is_valid(col("content_id"))),
        lambda i: f"ad action {action[i].as_py()!r} must not carry 'content_id'",
    )
    flag(
        pc.and_(is_organic, pc.is_null(col("content_id"))),
        lambda i: f"organic action {action[i].as_py()!r} is missing 'content_id'",
    )
    for name in AD_FIELDS:
        flag(
            pc.and_(is_organic, pc.is_valid(col(name))),
            lambda i, n=name: (
                f"organic action {action[i].as_py()!r} must not carry '{n}'"
            ),
        )
    needs = pc.is_in(action, value_set=pa.array(["click", "conversion"]))
    has = pc.is_valid(col("impression_id"))
    flag(
        pc.and_(needs, pc.invert(has)),
        lambda i: f"{action[i].as_py()!r} is missing 'impression_id'",
    )
    flag(
        pc.and_(has, pc.invert(needs)),
        lambda i: f"{action[i].as_py()!r} must not carry 'impression_id'",
    )


_PAIR_DOMAINS: Final = tuple(sorted({d for d, _ in SURFACE_PAIRS}))
_PAIR_SURFACES: Final = tuple(sorted({s for _, s in SURFACE_PAIRS}))


def _pair_table() -> Any:
    """``allowed[domain index, surface index]``, with a last row and column
    (values outside the vocabulary) that allow nothing."""
    allowed = np.zeros((len(_PAIR_DOMAINS) + 1, len(_PAIR_SURFACES) + 1), bool)
    for domain, surface in SURFACE_PAIRS:
        allowed[_PAIR_DOMAINS.index(domain), _PAIR_SURFACES.index(surface)] = True
    return allowed


_PAIR_ALLOWED: Final = _pair_table()


def _index_or_last(values: pa.ChunkedArray, vocabulary: tuple[str, ...]) -> Any:
    """Index of each value in ``vocabulary``; ``len(vocabulary)`` when absent."""
    index = pc.index_in(values, value_set=pa.array(vocabulary, pa.string()))
    filled = pc.fill_null(index, len(vocabulary))
    return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=np.int64)


def _schema_diff(actual: pa.Schema, expected: pa.Schema) -> str:
    """Human-readable list of missing, extra and retyped columns."""
    got = {f.name: f.type for f in actual}
    want = {f.name: f.type for f in expected}
    parts = [f"missing column '{n}'" for n in want if n not in got]
    parts += [f"unexpected column '{n}'" for n in got if n not in want]
    parts += [
        f"column '{n}' is {got[n]}, expected {want[n]}"
        for n in want
        if n in got and got[n] != want[n]
    ]
    parts += [
        f"column '{f.name}' nullability differs"
        for f in expected
        if f.name in got and actual.field(f.name).nullable != f.nullable
    ]
    return "; ".join(parts) or "column order differs"
