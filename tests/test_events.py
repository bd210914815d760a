"""The event contract: every kind of bad input gets a clear reason."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fuzz_decoders import sample_events
from features import vocab
from features.event_table import validate_event_table
from features.events import (
    EVENT_COLUMNS,
    EVENT_FIELDS,
    EVENT_SCHEMA,
    MAX_CLOCK_SKEW_MS,
    decode_event,
    encode_event,
    encode_event_table,
    events_from_records,
    validate_event,
)
from features.fields import MAX_STRING_CHARS

NOW = 1_790_000_000_000  # 2026-09-21, a fixed clock for the tests

IMPRESSION, CLICK, LIKE = sample_events(NOW)


def with_(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**base, **changes}


def without(base: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in base.items() if k != name}


@pytest.mark.parametrize("record", [IMPRESSION, LIKE, CLICK])
def test_valid_events_pass(record: dict[str, Any]) -> None:
    assert validate_event(record, now=NOW) is None


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (without(IMPRESSION, "user_id"), "missing required field 'user_id'"),
        (
            with_(IMPRESSION, user_id="42"),
            "field 'user_id' must be an integer, got str",
        ),
        (
            with_(IMPRESSION, user_id=True),
            "field 'user_id' must be an integer, got bool",
        ),
        (
            with_(IMPRESSION, user_id=4.2),
            "field 'user_id' must be an integer, got float",
        ),
        (
            with_(IMPRESSION, domain="tiktok"),
            "field 'domain' has unknown value 'tiktok'",
        ),
        (
            with_(IMPRESSION, action="purchase"),
            "field 'action' has unknown value 'purchase'",
        ),
        (with_(IMPRESSION, event_id=""), "field 'event_id' must not be empty"),
        (
            with_(IMPRESSION, event_time=-5),
            "field 'event_time' is -5, below the minimum",
        ),
        (with_(IMPRESSION, event_time="2026-09-21T10:00:00"), "UTC offset"),
        (
            with_(IMPRESSION, event_time=NOW + MAX_CLOCK_SKEW_MS + 1),
            "is in the future",
        ),
        (with_(IMPRESSION, schema_version=2), "field 'schema_version' is 2, above"),
        (with_(IMPRESSION, colour="red"), "unknown field(s) 'colour'"),
        (
            with_(IMPRESSION, surface="inbox"),
            "surface 'inbox' does not belong to domain 'instagram'",
        ),
        (with_(IMPRESSION, ad_id=None), "ad action 'impression' is missing 'ad_id'"),
        (
            with_(IMPRESSION, content_id=5),
            "ad action 'impression' must not carry 'content_id'",
        ),
        (with_(LIKE, content_id=None), "organic action 'like' is missing 'content_id'"),
        (
            with_(LIKE, ad_format="image"),
            "organic action 'like' must not carry 'ad_format'",
        ),
        (with_(CLICK, impression_id=None), "'click' is missing 'impression_id'"),
        (
            with_(IMPRESSION, impression_id="e-0"),
            "'impression' must not carry 'impression_id'",
        ),
        (["not", "an", "object"], "an event must be a JSON object, got list"),
    ],
)
def test_invalid_events_get_their_reason(record: Any, reason: str) -> None:
    got = validate_event(record, now=NOW)
    assert got is not None
    assert reason in got


def test_iso_times_with_offsets_are_accepted() -> None:
    iso = dt.datetime.fromtimestamp((NOW - 1000) / 1000, dt.UTC).isoformat()
    assert validate_event(with_(IMPRESSION, event_time=iso), now=NOW) is None
    decoded = decode_event(
        json.dumps(with_(IMPRESSION, event_time=iso)).encode(), now=NOW
    )
    assert decoded.event is not None
    assert decoded.event["event_time"] == NOW - 1000  # normalized to epoch ms


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"event_id": "x"', "not JSON"),
        (b"", "not JSON"),
        (
            json.dumps(with_(IMPRESSION, domain="snapchat")).encode(),
            "unknown value 'snapchat'",
        ),
    ],
)
def test_decode_never_raises_on_bad_bytes(payload: bytes, reason: str) -> None:
    decoded = decode_event(payload, now=NOW)
    assert decoded.event is None
    assert decoded.reason is not None
    assert reason in decoded.reason


def test_wire_round_trip_single_and_vectorized() -> None:
    records = [IMPRESSION, LIKE, CLICK]
    table = events_from_records(records)
    vectorized = encode_event_table(table)
    assert [json.loads(p) for p in vectorized] == [
        json.loads(encode_event(r)) for r in records
    ]
    decoded = [decode_event(p, now=NOW).event for p in vectorized]
    assert decoded == records


# --- the vectorized validator must agree with the per-record one, row for row ---


_VALID_PAIRS = [(d, s) for d, ss in vocab.SURFACES_BY_DOMAIN.items() for s in ss]


def _mutations() -> st.SearchStrategy[dict[str, Any]]:
    """Well-typed events (they fit EVENT_SCHEMA), valid or with rule violations.

    Each knob picks a valid value most of the time, so both valid rows and rows
    breaking one or two rules are common.
    """
    nullable = [f.name for f in EVENT_FIELDS if f.nullable]
    return st.fixed_dictionaries(
        {
            "base": st.sampled_from([IMPRESSION, LIKE, CLICK]),
            "pair": st.sampled_from(
                [
                    *_VALID_PAIRS,
                    ("myspace", "feed"),
                    ("instagram", "inbox"),
                    ("facebook", ""),
                ]
            ),
            "action": st.sampled_from(vocab.ACTIONS),
            "nulls": st.sets(st.sampled_from(nullable), max_size=2),
            "fill_content": st.booleans(),
            "time": st.sampled_from(
                [NOW - 1, NOW - 5, -1, NOW + 2 * MAX_CLOCK_SKEW_MS]
            ),
            "user": st.sampled_from([0, 5, 6, -3]),
            # The string length limit: at it, over it, in a vocabulary field.
            "long": st.sampled_from(
                [
                    {},
                    {},
                    {"impression_id": "i" * MAX_STRING_CHARS},
                    {"impression_id": "i" * (MAX_STRING_CHARS + 1)},
                    {"surface": "é" * (MAX_STRING_CHARS + 5)},
                ]
            ),
        }
    ).map(_apply)


def _apply(m: dict[str, Any]) -> dict[str, Any]:
    record = dict(m["base"])
    record["domain"], record["surface"] = m["pair"]
    if m["action"] in vocab.AD_ACTIONS and record["action"] in vocab.AD_ACTIONS:
        record["action"] = m["action"]
    elif (
        m["action"] in vocab.ORGANIC_ACTIONS
        and record["action"] in vocab.ORGANIC_ACTIONS
    ):
        record["action"] = m["action"]
    record.update(event_time=m["time"], user_id=m["user"])
    for name in m["nulls"]:
        record[name] = None
    if m["fill_content"]:
        record["content_id"] = 1
    record.update(m["long"])
    return record


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_mutations(), min_size=1, max_size=20))
def test_table_validator_matches_record_validator(
    records: list[dict[str, Any]],
) -> None:
    for i, record in enumerate(records):
        record["event_id"] = f"e-{i}"
    table = pa.Table.from_pylist(records, schema=EVENT_SCHEMA)
    valid, rejected = validate_event_table(table, now=NOW)
    assert valid.num_rows + rejected.num_rows == table.num_rows
    expected = {r["event_id"]: validate_event(r, now=NOW) for r in records}
    got = dict(
        zip(
            rejected["event_id"].to_pylist(),
            rejected["reason"].to_pylist(),
            strict=True,
        )
    )
    for event_id in valid["event_id"].to_pylist():
        assert expected[event_id] is None
    for event_id, reason in got.items():
        assert reason == expected[event_id]


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
def test_the_generated_mix_holds_valid_and_invalid_rows() -> None:
    """Guards the property test above against only ever seeing one kind."""
    records = [_mutations().example() for _ in range(200)]
    verdicts = [validate_event(r, now=NOW) is None for r in records]
    assert 0.1 < sum(verdicts) / len(verdicts) < 0.9


def test_table_with_the_wrong_schema_names_the_column() -> None:
    table = events_from_records([IMPRESSION]).drop_columns(["surface"])
    with pytest.raises(ValueError, match="missing column 'surface'"):
        validate_event_table(table, now=NOW)
    retyped = events_from_records([IMPRESSION]).set_column(
        EVENT_COLUMNS.index("user_id"), "user_id", pa.array(["42"])
    )
    with pytest.raises(ValueError, match="column 'user_id' is string, expected int64"):
        validate_event_table(retyped, now=NOW)


def test_bytes_that_are_not_utf8_get_the_reason_of_a_lone_surrogate() -> None:
    """A Parquet string column can hold bytes that are not UTF-8 (Arrow does
    not check them on reading); a JSON string can hold a lone surrogate. Both
    are text no writer can encode: the two validators give one reason."""
    record = with_(IMPRESSION, event_id="\ud800")
    expected = validate_event(record, now=NOW)
    assert expected == "field 'event_id' is not valid UTF-8 text"
    good = events_from_records([IMPRESSION])
    ids = good.column("event_id").combine_chunks()
    raw = b"\xed\xa0\x80"  # the surrogate in CESU-8
    bad_ids = pa.Array.from_buffers(
        pa.string(),
        1,
        [None, pa.array([0, len(raw)], pa.int32()).buffers()[1], pa.py_buffer(raw)],
    )
    assert ids.type == bad_ids.type
    index = EVENT_COLUMNS.index("event_id")
    table = good.set_column(index, good.schema.field(index), bad_ids)
    valid, rejected = validate_event_table(table, now=NOW)
    assert valid.num_rows == 0
    assert rejected["reason"].to_pylist() == [expected]
    # Its wire form keeps the bytes the file held.
    assert raw in encode_event_table(table)[0]
