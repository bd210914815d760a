"""Properties of every decoder and validator of outside bytes, on hostile input.

The contract each one keeps (``benchmarks/fuzz_decoders.py`` fuzzes the same
checks for a million inputs): it returns a value or a reason and never
raises; what it accepts, its consumers can use. tests/test_events.py and
tests/test_example_messages.py cover well-formed input and its named
reasons; these go after the edges: deep nesting, huge numbers, surrogates,
NaN, long strings, wrong types, bit flips, bytes that are not UTF-8.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fuzz_decoders import (
    FUZZ_NOW_MS,
    ByteSource,
    check_decoded_event,
    check_decoded_message,
    check_evidence,
    event_row,
    example_message_seeds,
    jsonl_batch,
    load_check,
    teacher_seeds,
)
from features.deadletter import DeadLetter
from features.dimensions import validate_ad, validate_content, validate_user
from features.event_table import validate_event_table
from features.events import EVENT_SCHEMA, decode_event, validate_event
from features.example_messages import (
    decode_example_message,
    frame_streams,
    message_headers,
)
from pipelines.batch.validate import ValidateEventsFn
from tests.test_events import IMPRESSION
from trainer.distill.records import decode_teacher_message, teacher_message_headers


def hostile(max_examples: int) -> settings:
    """Settings for slow, large inputs on a shared 2-core machine."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


VALID_EVENT: dict[str, Any] = {**IMPRESSION, "event_time": FUZZ_NOW_MS - 60_000}

# Every code point, lone surrogates included (a JSON "\ud800" escape decodes
# to one).
any_text = st.text(st.characters(exclude_categories=()), max_size=40)
long_text = st.integers(200, 5000).map(lambda n: "é" * n)
huge_ints = st.one_of(
    st.integers(),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**400]),
)
json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    huge_ints,
    st.floats(allow_nan=True, allow_infinity=True),
    any_text,
    long_text,
)
json_values = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4)
    ),
    max_leaves=12,
)


def _to_wire(value: Any, how: str) -> bytes:
    """A JSON-ish value as a producer might send it, well-formed or not."""
    if how == "ascii":  # \ud800 escapes, NaN and Infinity as bare words
        return json.dumps(value).encode()
    # Raw code points; lone surrogates as CESU-8 bytes, which are not UTF-8.
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


@st.composite
def hostile_events(draw: st.DrawFn) -> bytes:
    """A valid event with some fields replaced, keys added, or nesting."""
    record = dict(VALID_EVENT)
    for name in draw(st.sets(st.sampled_from(sorted(record)), max_size=4)):
        record[name] = draw(json_values)
    if draw(st.booleans()):
        record[draw(any_text)] = draw(json_values)
    wire = _to_wire(record, draw(st.sampled_from(["ascii", "raw"])))
    depth = draw(st.sampled_from([0, 0, 20, 3000]))
    if depth:  # nested arrays as one field's value
        wire = wire[:-1] + b',"deep":' + b"[" * depth + b"]" * depth + b"}"
    return wire


digits = st.integers(19, 6000).map(lambda n: b"9" * n)


@hostile(100)
@given(
    st.one_of(
        st.binary(max_size=300),
        hostile_events(),
        json_values.map(lambda v: _to_wire(v, "ascii")),
        digits.map(lambda d: b'{"user_id": ' + d + b"}"),
        st.integers(1, 100_000).map(lambda n: b"[" * n),
        st.sampled_from([b"NaN", b"-Infinity", b'"\\ud800"', b"\xed\xa0\x80"]),
    )
)
def test_decode_event_keeps_its_contract(payload: bytes) -> None:
    # Event xor reason, the reason is UTF-8 text (not the catch-all's), and
    # an accepted event validates, converts to Arrow and round-trips.
    check_decoded_event(decode_event(payload, now=FUZZ_NOW_MS))


@hostile(100)
@given(st.sets(st.sampled_from(sorted(VALID_EVENT)), max_size=3), st.data())
def test_wrong_types_are_reasons(names: set[str], data: st.DataObject) -> None:
    record = dict(VALID_EVENT)
    for name in names:
        record[name] = data.draw(json_values)
    reason = validate_event(record, now=FUZZ_NOW_MS)
    if reason is None:
        check_decoded_event(decode_event(json.dumps(record).encode(), now=FUZZ_NOW_MS))
    else:
        reason.encode("utf-8")


@hostile(100)
@given(st.binary(min_size=1, max_size=80))
def test_table_validator_agrees_with_record_validator_at_the_edges(
    data: bytes,
) -> None:
    # Rows that fit EVENT_SCHEMA with extreme values (int64 limits, times far
    # outside datetime's years, long and non-ASCII strings): the same
    # verdict and reason from both validators, row for row.
    source = ByteSource(data)
    rows = [event_row(source, f"e-{i}") for i in range(source.int(1, 4))]
    try:
        table = pa.Table.from_pylist(rows, schema=EVENT_SCHEMA)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return
    valid, rejected = validate_event_table(table, now=FUZZ_NOW_MS)
    expected = [validate_event(row, now=FUZZ_NOW_MS) for row in rows]
    assert rejected.column("reason").to_pylist() == [
        reason for reason in expected if reason is not None
    ]
    assert valid.equals(table.filter(pa.array([r is None for r in expected])))


@hostile(100)
@given(st.lists(st.binary(max_size=8), min_size=1, max_size=3), st.data())
def test_table_validator_rejects_strings_that_are_not_utf8(
    cells: list[bytes], data: st.DataObject
) -> None:
    # A Parquet file's string column is not checked as UTF-8 when read.
    rows = [dict(VALID_EVENT, event_id=f"e-{i}") for i in range(len(cells))]
    table = pa.Table.from_pylist(rows, schema=EVENT_SCHEMA)
    column = data.draw(st.sampled_from(["event_id", "domain", "surface", "action"]))
    raw = pa.array(cells, pa.binary()).view(pa.string())
    index = table.schema.get_field_index(column)
    table = table.set_column(index, table.schema.field(index), raw)
    valid, rejected = validate_event_table(table, now=FUZZ_NOW_MS)
    assert valid.num_rows + rejected.num_rows == table.num_rows
    for cell, reason in zip(cells, _reasons_by_row(table, rejected), strict=True):
        try:
            cell.decode("utf-8")
        except UnicodeDecodeError:
            assert reason == f"field '{column}' is not valid UTF-8 text"


def _reasons_by_row(table: pa.Table, rejected: pa.Table) -> list[str | None]:
    by_id = dict(
        zip(
            rejected.column("event_id").cast(pa.binary()).to_pylist(),
            rejected.column("reason").to_pylist(),
            strict=True,
        )
    )
    ids = table.column("event_id").cast(pa.binary()).to_pylist()
    return [by_id.get(raw) for raw in ids]


@hostile(30)
@given(st.binary(min_size=1, max_size=120))
def test_parquet_files_of_foreign_column_types_are_read_row_by_row(
    data: bytes,
) -> None:
    # Ids as uint64 or floats, naive or nanosecond times, binary or dictionary
    # strings: each row valid or one dead letter, or the file refused by name.
    load_check_cached("parquet_file")(data)


@functools.cache
def _validator() -> ValidateEventsFn:
    return ValidateEventsFn(FUZZ_NOW_MS)


@hostile(60)
@given(st.lists(st.one_of(hostile_events(), st.binary(max_size=60)), max_size=6))
def test_jsonl_batches_balance_and_dead_letters_are_json(lines: list[bytes]) -> None:
    batch = jsonl_batch(b"\n".join(lines), "hostile.jsonl")
    if batch is None:
        return
    valid, dead, read = _validator().compute(batch)
    assert read == len(batch.payloads)
    assert (0 if valid is None else valid.num_rows) + len(dead) == read
    originals = dict(zip(batch.offsets, batch.payloads, strict=True))
    for line in dead:
        # Valid JSON naming the line, with its original bytes.
        check_evidence(line, "hostile.jsonl", originals)


def _no_constant(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


@functools.cache
def _example_messages() -> tuple[bytes, ...]:
    return tuple(example_message_seeds())


def _flip_a_bit(data: st.DataObject, messages: Sequence[bytes]) -> tuple[int, bytes]:
    """One of ``messages`` with one bit flipped, both drawn; and that bit."""
    message = data.draw(st.sampled_from(messages))
    bit = data.draw(st.integers(0, len(message) * 8 - 1))
    flipped = bytearray(message)
    flipped[bit // 8] ^= 1 << (bit % 8)
    return bit, bytes(flipped)


@hostile(150)
@given(st.data())
def test_any_bit_flip_in_an_example_message_is_rejected(data: st.DataObject) -> None:
    bit, flipped = _flip_a_bit(data, _example_messages())
    decoded = decode_example_message(flipped, message_headers())
    check_decoded_message(decoded)
    assert not decoded.ok, f"bit {bit} flipped and the message still decodes"


@hostile(150)
@given(st.binary(max_size=400), st.binary(max_size=400), st.data())
def test_framed_garbage_never_raises(
    examples: bytes, segments: bytes, data: st.DataObject
) -> None:
    # A valid frame and checksum around streams that are not Arrow, or are a
    # valid message's streams cut and spliced.
    if data.draw(st.booleans()):
        message = data.draw(st.sampled_from(_example_messages()))
        cut = data.draw(st.integers(18, len(message)))
        examples, segments = message[18:cut], examples + message[cut:]
    check_decoded_message(
        decode_example_message(frame_streams(examples, segments), message_headers())
    )


@hostile(100)
@given(st.binary(max_size=300))
def test_teacher_messages_never_raise(data: bytes) -> None:
    table, reason = decode_teacher_message(data, teacher_message_headers())
    assert (table is None) != (reason is None)


@hostile(100)
@given(st.data())
def test_any_bit_flip_in_a_teacher_message_is_rejected(data: st.DataObject) -> None:
    bit, flipped = _flip_a_bit(data, teacher_seeds())
    table, reason = decode_teacher_message(flipped, teacher_message_headers())
    assert table is None, f"bit {bit} flipped and the rows still decode"
    assert reason


def test_every_valid_teacher_message_is_usable() -> None:
    # The student daemon feeds accepted rows to its cache: none may break it,
    # an empty message included.
    for message in teacher_seeds():
        load_check_cached("teacher_message")(message)


@hostile(200)
@given(
    source=st.text(max_size=30),
    partition=st.none() | st.integers(0, 2**31 - 1),
    offset=st.integers(0, 2**63 - 1),
    reason=st.text(max_size=60),
    payload=st.binary(max_size=600),
    cut=st.integers(0, 700),
)
def test_dead_letters_round_trip_through_json(
    source: str,
    partition: int | None,
    offset: int,
    reason: str,
    payload: bytes,
    cut: int,
) -> None:
    letter = DeadLetter(
        source=source,
        partition=partition,
        offset=offset,
        reason=reason,
        payload=payload,
    )
    for each in (letter, letter.truncated_to(cut)):
        line = each.to_json()
        assert line.isascii()
        assert "\n" not in line
        json.loads(line, parse_constant=_no_constant)
        assert DeadLetter.from_json(line) == each
    short = letter.truncated_to(cut)
    assert (short.payload_length, short.payload_sha256) == (
        len(payload),
        letter.payload_sha256,
    )
    assert payload.startswith(short.payload)
    assert short.truncated == (len(payload) > cut)


@hostile(200)
@given(st.dictionaries(any_text | st.sampled_from(["user_id", "ad_id"]), json_values))
def test_dimension_validators_never_raise(record: dict[str, Any]) -> None:
    for validate in (validate_user, validate_ad, validate_content):
        reason = validate(record)
        assert reason is None or reason.encode("utf-8")


@hostile(40)
@given(st.lists(st.one_of(hostile_events(), st.binary(max_size=60)), max_size=6))
def test_the_streaming_reader_balances_its_poll(lines: list[bytes]) -> None:
    # ReadTopicFn's poll of one partition, a message per line: events plus
    # dead letters (strict JSON) equal the messages read.
    load_check_cached("stream_event")(b"\n".join(lines))


@hostile(60)
@given(st.data())
def test_the_trainer_sets_aside_what_it_cannot_train_on(data: st.DataObject) -> None:
    # KafkaSource._decode (decode, make_batch, dead letter) on valid frames
    # around damaged streams: the daemon's consumer thread must not die.
    message = bytearray(data.draw(st.sampled_from(_example_messages())))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(18, len(message) - 1))
        message[at] = data.draw(st.integers(0, 255))
    load_check_cached("trainer_example_record")(bytes(message))


@functools.cache
def load_check_cached(target: str) -> Any:
    return load_check(target)
