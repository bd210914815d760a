"""The Kafka example-message codec: round trip, and garbage never crashes it."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from features.example_messages import (
    MAGIC,
    MESSAGE_VERSION,
    SCHEMA_HEADER,
    decode_example_message,
    encode_example_message,
    frame_streams,
    message_headers,
)
from features.examples import TIMELINE_SEGMENT_SCHEMA, training_example_schema


def _examples(n: int) -> pa.Table:
    schema = training_example_schema()
    columns = []
    for field in schema:
        if pa.types.is_string(field.type):
            columns.append(pa.array([f"e{i}" for i in range(n)]))
        elif pa.types.is_timestamp(field.type):
            columns.append(pa.array(np.arange(n) + 1_790_000_000_000).cast(field.type))
        else:
            columns.append(pa.array(np.arange(n) % 5, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _segments() -> pa.Table:
    rows = {
        "user_id": [1],
        "event_time": [[1_790_000_000_000]],
        "seq_item_id": [[14]],
        "seq_action": [[1]],
        "seq_domain": [[1]],
        "seq_surface": [[1]],
        "seq_category": [[3]],
        "segment_start": [0],
    }
    return pa.Table.from_pydict(rows, schema=TIMELINE_SEGMENT_SCHEMA)


def _frame(version: int, length: int, body: bytes) -> bytes:
    """A frame with a correct checksum around any header fields and body."""
    prefix = struct.pack("<4sHQ", MAGIC, version, length)
    return prefix + struct.pack("<I", zlib.crc32(body, zlib.crc32(prefix))) + body


def test_round_trip() -> None:
    message = encode_example_message(_examples(10), _segments(), max_seq_len=8)
    decoded = decode_example_message(message, message_headers())
    assert decoded.ok
    assert decoded.examples is not None
    assert decoded.examples.equals(_examples(10))
    assert decoded.segments is not None
    assert decoded.segments.equals(_segments())


def test_encode_rejects_foreign_tables() -> None:
    with pytest.raises(ValueError, match="examples"):
        encode_example_message(pa.table({"x": [1]}), _segments(), max_seq_len=8)


@pytest.mark.parametrize(
    ("data", "headers", "reason"),
    [
        (b"", None, "too short"),
        (b"XXXX" + bytes(20), None, "not an example message"),
        (_frame(99, 0, b""), None, "unknown frame version 99"),
        (_frame(1, 0, b""), None, "unknown frame version 1"),
        (_frame(MESSAGE_VERSION, 10**6, b""), None, "truncated"),
        (_frame(MESSAGE_VERSION, 3, b"abc"), None, "examples"),
        (_frame(MESSAGE_VERSION, 3, b"abc")[:-1] + b"x", None, "checksum mismatch"),
        (b"", [(SCHEMA_HEADER, b"7")], "unknown schema-version header 7"),
        (None, None, "empty message"),
    ],
)
def test_bad_messages_get_a_reason(
    data: bytes | None, headers: list[tuple[str, bytes]] | None, reason: str
) -> None:
    decoded = decode_example_message(data, headers)
    assert not decoded.ok
    assert decoded.reason is not None
    assert reason in decoded.reason


def test_wrong_schema_inside_is_rejected() -> None:
    good = encode_example_message(_examples(2), _segments(), max_seq_len=8)
    length = struct.unpack_from("<Q", good, 6)[0]
    sink = pa.BufferOutputStream()
    other = pa.table({"x": [1]})
    with pa.ipc.new_stream(sink, other.schema) as writer:
        writer.write_table(other)
    swapped = frame_streams(good[18 : 18 + length], bytes(sink.getvalue()))
    decoded = decode_example_message(swapped)
    assert decoded.reason == "segments: schema differs from the contract"


_GOOD = encode_example_message(_examples(3), _segments(), max_seq_len=8)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=200),
        st.integers(0, len(_GOOD) - 1).map(lambda n: _GOOD[:n]),
        st.tuples(st.integers(0, len(_GOOD) - 1), st.integers(1, 255)).map(
            lambda p: _GOOD[: p[0]] + bytes([_GOOD[p[0]] ^ p[1]]) + _GOOD[p[0] + 1 :]
        ),
    )
)
def test_garbage_never_crashes(data: bytes) -> None:
    decoded = decode_example_message(data)
    assert decoded.ok == (decoded.reason is None)
    if decoded.ok:
        assert decoded.examples is not None
        assert decoded.examples.schema.equals(
            training_example_schema(), check_metadata=False
        )


def test_segments_without_their_window_length_are_rejected() -> None:
    def stream(table: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return bytes(sink.getvalue())

    first, second = stream(_examples(2)), stream(_segments())
    decoded = decode_example_message(frame_streams(first, second))
    assert decoded.reason == "segments: no valid max_seq_len in their metadata"
    assert decode_example_message(_GOOD).max_seq_len == 8


def test_every_flipped_byte_is_caught() -> None:
    """One altered byte anywhere, header or body, never decodes cleanly."""
    for position in range(len(_GOOD)):
        for mask in (0x01, 0x80, 0xFF):
            data = bytearray(_GOOD)
            data[position] ^= mask
            decoded = decode_example_message(bytes(data))
            assert not decoded.ok, (position, mask)
            assert decoded.reason


def test_headers_carry_the_contract_schema_version() -> None:
    from features.events import SCHEMA_VERSION

    assert (SCHEMA_HEADER, str(SCHEMA_VERSION).encode()) in message_headers()
    assert decode_example_message(_GOOD, message_headers()).ok
