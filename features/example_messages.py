"""The Kafka message of training examples: a batch of examples plus the
timeline segments their windows need, as Arrow IPC.

Producers (the feature job's ``PublishExamples``) and consumers (the trainer)
agree on this codec and nothing else. One message holds two Arrow IPC
streams, framed so a reader can check everything before trusting a byte::

    offset  size  field
    0       4     magic b"GEMX"
    4       2     message schema version (uint16, little-endian)
    6       8     length E of the examples stream (uint64, little-endian)
    14      E     examples: IPC stream, training_example_schema()
    14 + E  rest  segments: IPC stream, TIMELINE_SEGMENT_SCHEMA

Each needed timeline segment appears once per message (one row per user), so
a message costs its examples plus each user's recent events once, not one
window per example (see :func:`features.windows.timeline_segments`). The
segments were cut for a window length, carried in the segments stream's
schema metadata (``max_seq_len``): a consumer reads windows of at most that
many events (the minimum of its own length and the producer's).

Kafka record: key = the user shard (so one user's examples stay in order in
one partition), headers ``schema-version`` and ``content-type``
(:func:`message_headers`). Decoding never raises on bad input: a garbage,
truncated or foreign message comes back with a reason for the dead-letter
record (:func:`decode_example_message`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import pyarrow as pa

from features.events import SCHEMA_VERSION
from features.examples import TIMELINE_SEGMENT_SCHEMA, training_example_schema

MAGIC: Final = b"GEMX"
MESSAGE_VERSION: Final = SCHEMA_VERSION
"""Version of the message layout and of the schemas it carries."""
CONTENT_TYPE: Final = "application/vnd.gem.examples+arrow"
SCHEMA_HEADER: Final = "schema-version"
CONTENT_TYPE_HEADER: Final = "content-type"

_HEADER: Final = struct.Struct("<4sHQ")


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


def message_headers() -> list[tuple[str, bytes]]:
    """The Kafka headers every example message carries."""
    return [
        (SCHEMA_HEADER, str(MESSAGE_VERSION).encode()),
        (CONTENT_TYPE_HEADER, CONTENT_TYPE.encode()),
    ]


def _stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


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
    first = _stream(examples.replace_schema_metadata(example_schema.metadata))
    segment_metadata = {
        **(TIMELINE_SEGMENT_SCHEMA.metadata or {}),
        _WINDOW_KEY: str(max_seq_len).encode(),
    }
    second = _stream(segments.replace_schema_metadata(segment_metadata))
    return _HEADER.pack(MAGIC, MESSAGE_VERSION, len(first)) + first + second


def _read(data: bytes, schema: pa.Schema, what: str) -> tuple[pa.Table | None, str]:
    """An IPC stream in exactly ``schema``, or (None, reason)."""
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
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
            header other than :data:`MESSAGE_VERSION` is rejected too.

    Returns:
        The tables, or a reason (e.g. ``"unknown schema version 9"``).

    Example:
        >>> decode_example_message(b"garbage").reason
        'too short for a message header (7 bytes)'
    """
    if headers is not None:
        versions = [v for k, v in headers if k == SCHEMA_HEADER]
        if versions and versions[0] != str(MESSAGE_VERSION).encode():
            shown = versions[0].decode("utf-8", "replace")
            return DecodedMessage(None, None, f"unknown schema-version header {shown}")
    if data is None:
        return DecodedMessage(None, None, "empty message (no value)")
    if len(data) < _HEADER.size:
        return DecodedMessage(
            None, None, f"too short for a message header ({len(data)} bytes)"
        )
    magic, version, length = _HEADER.unpack_from(data)
    if magic != MAGIC:
        return DecodedMessage(None, None, f"not an example message (magic {magic!r})")
    if version != MESSAGE_VERSION:
        return DecodedMessage(None, None, f"unknown schema version {version}")
    end = _HEADER.size + length
    if end > len(data):
        return DecodedMessage(
            None, None, f"truncated: examples need {length} bytes, {len(data)} total"
        )
    examples, reason = _read(
        data[_HEADER.size : end], training_example_schema(), "examples"
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
