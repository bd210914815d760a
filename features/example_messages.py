"""The Kafka message of training examples: a batch of examples plus the
timeline segments their windows need, as Arrow IPC.

Producers (the feature job's ``PublishExamples``) and consumers (the trainer)
agree on this codec and nothing else. One message holds two Arrow IPC
streams, framed so a reader can check everything before trusting a byte::

    offset  size  field
    0       4     magic b"GEMX"
    4       2     frame layout version (uint16, little-endian)
    6       8     length E of the examples stream (uint64, little-endian)
    14      4     CRC-32 (zlib) of bytes 0-13 and of everything from 18 on
    18      E     examples: IPC stream, training_example_schema()
    18 + E  rest  segments: IPC stream, TIMELINE_SEGMENT_SCHEMA

The checksum is verified before any Arrow decoding: CRC-32 catches every
error burst of up to 32 bits, so one flipped byte anywhere in the message
(header included) is a reason, never a clean decode of altered examples.

Each needed timeline segment appears once per message (one row per user), so
a message costs its examples plus each user's recent events once, not one
window per example (see :func:`features.windows.timeline_segments`). The
segments were cut for a window length, carried in the segments stream's
schema metadata (``max_seq_len``): a consumer reads windows of at most that
many events (the minimum of its own length and the producer's).

Kafka record: key = the user shard (so one user's examples stay in order in
one partition), headers ``schema-version`` (the contract's
:data:`~features.events.SCHEMA_VERSION`, which the tables follow),
``content-type`` and ``event-time-ms``, the earliest impression time of the
message's examples (epoch ms, decimal), which a consumer reading several
partitions merges them by without decoding a body (:func:`message_headers`,
:func:`header_event_time`). Decoding never raises on bad
input: a garbage, truncated, corrupted or foreign message comes back with a
reason for the dead-letter record (:func:`decode_example_message`).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from features.arrow_ipc import ipc_to_table, table_to_ipc
from features.events import SCHEMA_VERSION
from features.examples import TIMELINE_SEGMENT_SCHEMA, training_example_schema

MAGIC: Final = b"GEMX"
MESSAGE_VERSION: Final = 2
"""Version of the frame layout (the table above); 2 is the checksummed frame."""
CONTENT_TYPE: Final = "application/vnd.gem.examples+arrow"
SCHEMA_HEADER: Final = "schema-version"
CONTENT_TYPE_HEADER: Final = "content-type"
EVENT_TIME_HEADER: Final = "event-time-ms"

_PREFIX: Final = struct.Struct("<4sHQ")
_CHECKSUM: Final = struct.Struct("<I")
_HEADER_SIZE: Final = _PREFIX.size + _CHECKSUM.size


def _crc(prefix: bytes | memoryview, body: bytes | memoryview) -> int:
    return zlib.crc32(body, zlib.crc32(prefix))


@dataclass(frozen=True)
class DecodedMessage:
    """A decoded message, or why it could not be decoded.

    Attributes:
        examples: the examples (``training_example_schema()``), or None.
        segments: the timeline segments (TIMELINE_SEGMENT_SCHEMA), or None.
        reason: why the message was rejected; None when it is valid.
        max_seq_len: the window length the segments were cut for, or None.
    """

    examples: pa.Table | None
    segments: pa.Table | None
    reason: str | None
    max_seq_len: int | None = None

    @property
    def ok(self) -> bool:
        """True when the message decoded."""
        return self.reason is None


def message_headers(examples: pa.Table | None = None) -> list[tuple[str, bytes]]:
    """The Kafka headers of an example message; with its ``examples``, also
    their earliest impression time (``event-time-ms``)."""
    headers = [
        (SCHEMA_HEADER, str(SCHEMA_VERSION).encode()),
        (CONTENT_TYPE_HEADER, CONTENT_TYPE.encode()),
    ]
    if examples is not None and examples.num_rows:
        earliest = pc.min(examples.column("event_time").cast(pa.int64())).as_py()
        headers.append((EVENT_TIME_HEADER, str(earliest).encode()))
    return headers


def header_event_time(headers: list[tuple[str, bytes]] | None) -> int | None:
    """The ``event-time-ms`` header as epoch ms; None when absent or not an
    integer (a message from a producer that does not stamp it)."""
    for key, value in headers or ():
        if key == EVENT_TIME_HEADER:
            try:
                return int(value.decode("ascii"))
            except (AttributeError, UnicodeDecodeError, ValueError):
                return None
    return None


_WINDOW_KEY: Final = b"max_seq_len"


def encode_example_message(
    examples: pa.Table, segments: pa.Table, *, max_seq_len: int
) -> bytes:
    """One message from examples and the segments their windows need.

    Args:
        examples: rows in ``training_example_schema()`` (column order and
            types exactly; metadata is replaced by the contract's).
        segments: rows in TIMELINE_SEGMENT_SCHEMA.
        max_seq_len: the window length ``segments`` were cut for
            (:func:`features.windows.timeline_segments`).

    Raises:
        ValueError: a table is not in its schema (a producer bug, not data).

    Example:
        >>> data = encode_example_message(
        ...     training_example_schema().empty_table(),
        ...     TIMELINE_SEGMENT_SCHEMA.empty_table(), max_seq_len=256)
        >>> decoded = decode_example_message(data)
        >>> decoded.ok, decoded.max_seq_len
        (True, 256)
    """
    example_schema = training_example_schema()
    for name, table, schema in (
        ("examples", examples, example_schema),
        ("segments", segments, TIMELINE_SEGMENT_SCHEMA),
    ):
        if not table.schema.equals(schema, check_metadata=False):
            raise ValueError(f"{name} are not in the contract schema")
    if max_seq_len < 1:
        raise ValueError(f"max_seq_len must be at least 1, got {max_seq_len}")
    first = table_to_ipc(examples.replace_schema_metadata(example_schema.metadata))
    segment_metadata = {
        **(TIMELINE_SEGMENT_SCHEMA.metadata or {}),
        _WINDOW_KEY: str(max_seq_len).encode(),
    }
    second = table_to_ipc(segments.replace_schema_metadata(segment_metadata))
    return frame_streams(first, second)


def frame_streams(examples_stream: bytes, segments_stream: bytes) -> bytes:
    """The framed message of two already-written IPC streams (the layout above).

    For producers that write the streams themselves, and for tests that
    build a message around foreign streams.
    """
    prefix = _PREFIX.pack(MAGIC, MESSAGE_VERSION, len(examples_stream))
    body = examples_stream + segments_stream
    return prefix + _CHECKSUM.pack(_crc(prefix, body)) + body


def _read(data: bytes, schema: pa.Schema, what: str) -> tuple[pa.Table | None, str]:
    """An IPC stream in exactly ``schema``, or (None, reason)."""
    try:
        table = ipc_to_table(data)
        # Full validation: corrupted offsets must be a reason here, not a
        # crash later in whoever reads the lists.
        table.validate(full=True)
    except (pa.ArrowException, ValueError, OSError) as error:
        return None, f"{what}: not an Arrow IPC stream ({error})"
    if not table.schema.equals(schema, check_metadata=False):
        return None, f"{what}: schema differs from the contract"
    return table, ""


def decode_example_message(
    data: bytes | None, headers: list[tuple[str, bytes]] | None = None
) -> DecodedMessage:
    """Decode one message; never raises on bad input.

    Args:
        data: the Kafka record value.
        headers: the record's headers; when given, a ``schema-version``
            header other than the contract's schema version is rejected too.

    Returns:
        The tables, or a reason (e.g. ``"unknown schema version 9"``).

    Example:
        >>> decode_example_message(b"garbage").reason
        'too short for a message header (7 bytes)'
    """
    if headers is not None:
        versions = [v for k, v in headers if k == SCHEMA_HEADER]
        if versions and versions[0] != str(SCHEMA_VERSION).encode():
            shown = versions[0].decode("utf-8", "replace")
            return DecodedMessage(None, None, f"unknown schema-version header {shown}")
    if data is None:
        return DecodedMessage(None, None, "empty message (no value)")
    if len(data) < _HEADER_SIZE:
        return DecodedMessage(
            None, None, f"too short for a message header ({len(data)} bytes)"
        )
    magic, version, length = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        return DecodedMessage(None, None, f"not an example message (magic {magic!r})")
    if version != MESSAGE_VERSION:
        return DecodedMessage(None, None, f"unknown frame version {version}")
    view = memoryview(data)
    (stored,) = _CHECKSUM.unpack_from(data, _PREFIX.size)
    actual = _crc(view[: _PREFIX.size], view[_HEADER_SIZE:])
    if stored != actual:
        return DecodedMessage(
            None,
            None,
            f"checksum mismatch: header says CRC-32 {stored:08x}, "
            f"the {len(data)} bytes give {actual:08x} (corrupted in transit or "
            "at rest)",
        )
    end = _HEADER_SIZE + length
    if end > len(data):
        return DecodedMessage(
            None, None, f"truncated: examples need {length} bytes, {len(data)} total"
        )
    examples, reason = _read(
        data[_HEADER_SIZE:end], training_example_schema(), "examples"
    )
    if examples is None:
        return DecodedMessage(None, None, reason)
    segments, reason = _read(data[end:], TIMELINE_SEGMENT_SCHEMA, "segments")
    if segments is None:
        return DecodedMessage(None, None, reason)
    window = (segments.schema.metadata or {}).get(_WINDOW_KEY, b"")
    if not window.isdigit() or int(window) < 1:
        return DecodedMessage(
            None, None, "segments: no valid max_seq_len in their metadata"
        )
    return DecodedMessage(
        examples.replace_schema_metadata(training_example_schema().metadata),
        segments.replace_schema_metadata(TIMELINE_SEGMENT_SCHEMA.metadata),
        None,
        int(window),
    )
