"""Arrow columns to Feast's online-store bytes, a whole column at a time.

Feast's materialization turns every value into a ``ValueProto`` object one at
a time (``feast.utils._convert_arrow_to_proto``), then each online store
serializes it again; for a 256-long behaviour sequence that is most of the
time. This module writes the protobuf wire format of whole columns with numpy
and pyarrow instead, producing exactly the bytes of
``ValueProto.SerializeToString()`` (and of ``serialize_entity_key``), so the
online stores' tables and hashes hold what Feast's own path writes and
``get_online_features`` reads them as its own. ``tests/test_feast_encode.py``
holds every supported type to Feast's converter byte for byte.

Covered without Python objects per value: int64 / int32 / float / double /
bool / string scalars and int64 / int32 / float / double lists, without nulls
(an empty list is fine). Anything else, or a column with a null or a NaN
(Feast writes an empty ``Value`` for those), goes through Feast's own
converter, column by column, so the result is always Feast's.

Wire format used (proto3, ``feast/types/Value.proto``): a scalar is its field
tag and varint / fixed bytes; a list is the tag of ``*_list_val`` (length
delimited), the list message's length, and inside it field 1 packed (tag
``0x0a``, byte length, the varints or fixed values back to back).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from feast.infra.key_encoding_utils import serialize_entity_key
from feast.infra.online_stores.helpers import extract_text_and_num
from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from feast.type_map import python_values_to_proto_values
from feast.value_type import ValueType

# --- byte rows: one variable-length byte string per row, as an Arrow array ----

_EMPTY: Final = pa.scalar(b"", pa.large_binary())


def byte_rows(data: np.ndarray, offsets: np.ndarray) -> pa.LargeBinaryArray:
    """Rows ``data[offsets[i]:offsets[i + 1]]`` as an Arrow array (no copy)."""
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(),
        len(offsets) - 1,
        [None, pa.py_buffer(offsets.astype(np.int64, copy=False)), pa.py_buffer(data)],
    )


def join_rows(*parts: pa.Array) -> pa.LargeBinaryArray:
    """Row-wise concatenation of byte rows (Arrow's kernel, in C++)."""
    if len(parts) == 1:
        return parts[0]
    return pc.binary_join_element_wise(*parts, _EMPTY)


def constant_rows(value: bytes, n: int) -> pa.LargeBinaryArray:
    """``value`` in each of ``n`` rows."""
    data = np.tile(np.frombuffer(value, np.uint8), n)
    return byte_rows(data, np.arange(n + 1, dtype=np.int64) * len(value))


def fixed_rows(tag: bytes, values: np.ndarray) -> pa.LargeBinaryArray:
    """Per row ``tag`` then the value's little-endian bytes (fixed32 / fixed64)."""
    raw = np.ascontiguousarray(values).view(np.uint8).reshape(len(values), -1)
    width = len(tag) + raw.shape[1]
    rows = np.empty((len(values), width), np.uint8)
    rows[:, : len(tag)] = np.frombuffer(tag, np.uint8)
    rows[:, len(tag) :] = raw
    return byte_rows(rows.reshape(-1), np.arange(len(values) + 1) * width)


# --- varints ---------------------------------------------------------------------


def varint_sizes(values: np.ndarray) -> np.ndarray:
    """Bytes of each value's varint (values as uint64: negatives take 10)."""
    sizes = np.ones(len(values), np.uint8)
    for k in range(1, 10):
        longer = values >= np.uint64(1 << (7 * k))
        if not longer.any():
            break
        sizes += longer.view(np.uint8)
    return sizes


def _word_tables(width: int) -> tuple[np.ndarray, np.ndarray]:
    """For varints built in ``width``-byte words: per varint length s, its
    continuation bits as one little-endian word, and which of the word's
    bytes it keeps."""
    dtype = np.dtype(f"<u{width}")
    continuation = np.array(
        [
            sum(0x80 << (8 * k) for k in range(s - 1)) if 0 < s <= width else 0
            for s in range(11)
        ],
        dtype,
    )
    keep = np.arange(width)[None, :] < np.arange(11)[:, None]
    return continuation, keep.view(dtype).ravel()


# Varints of up to 4 bytes (values below 2**28: ids, codes, small counts) are
# built in uint32 words, up to 8 bytes (below 2**56) in uint64 words.
_WORDS: Final = {4: _word_tables(4), 8: _word_tables(8)}


def encode_varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varints of ``values`` (uint64) back to back, and each one's end offset.

    Up to 8 bytes each (values below 2**56): each varint is built in a word
    (7 bits per byte, continuation bits from its length; uint32 words when
    all fit in 4 bytes, half the memory traffic), then the words' leading
    bytes are kept: one strided copy when every varint has the same length,
    else the kept bytes' positions. Longer ones (negative numbers take 10):
    byte ``k`` of every varint is scattered in one pass, varints shorter than
    ``k + 1`` bytes sending theirs to a scratch byte.
    """
    sizes = varint_sizes(values)
    ends = np.cumsum(sizes, dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    widest = int(sizes.max()) if len(sizes) else 0
    if widest <= 1:  # all below 128: the values are the bytes
        return values.astype(np.uint8), ends
    if widest <= 8:
        width = 4 if widest <= 4 else 8
        continuation, keep = _WORDS[width]
        word = np.dtype(f"<u{width}").type
        narrow = values.astype(word, copy=False)
        words = narrow & word(0x7F)
        part = np.empty_like(words)
        for k in range(1, widest):
            np.left_shift(narrow, word(k), out=part)
            part &= word(0x7F << (8 * k))
            words |= part
        words |= continuation[sizes]
        data = words.view(np.uint8)
        if total == widest * len(values):  # one length: the first bytes of each
            return data.reshape(-1, width)[:, :widest].ravel(), ends
        return data[np.flatnonzero(keep[sizes].view(bool))], ends
    starts = ends - sizes
    out = np.empty(total + 1, np.uint8)
    for k in range(widest):
        byte = (values >> np.uint64(7 * k)).astype(np.uint8)
        byte &= np.uint8(0x7F)
        if k + 1 < widest:
            byte |= (sizes > k + 1).view(np.uint8) << np.uint8(7)
        out[np.where(sizes > k, starts + k, total)] = byte
    return out[:total], ends


def varint_rows(values: np.ndarray) -> pa.LargeBinaryArray:
    """One varint per row."""
    data, ends = encode_varints(values)
    return byte_rows(data, np.concatenate([[0], ends]))


def as_uint64(values: np.ndarray) -> np.ndarray:
    """What protobuf varint-encodes for an int32/int64 (sign-extended, two's
    complement)."""
    return values.astype(np.int64, copy=False).view(np.uint64)


def _tag(field: int, wire_type: int) -> bytes:
    data, _ = encode_varints(np.array([field << 3 | wire_type], np.uint64))
    return data.tobytes()


# --- Value columns -----------------------------------------------------------------

_VARINT, _FIXED64, _DELIMITED, _FIXED32 = 0, 1, 2, 5

# ValueProto's oneof fields (feast/types/Value.proto).
_SCALAR_FIELDS: Final = {
    ValueType.STRING: 2,
    ValueType.INT32: 3,
    ValueType.INT64: 4,
    ValueType.DOUBLE: 5,
    ValueType.FLOAT: 6,
    ValueType.BOOL: 7,
}
_LIST_FIELDS: Final = {
    ValueType.INT32_LIST: 13,
    ValueType.INT64_LIST: 14,
    ValueType.DOUBLE_LIST: 15,
    ValueType.FLOAT_LIST: 16,
}
_ARROW_TYPES: Final[dict[ValueType, Callable[[pa.DataType], bool]]] = {
    ValueType.STRING: lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
    ValueType.INT32: pa.types.is_int32,
    ValueType.INT64: pa.types.is_int64,
    ValueType.DOUBLE: pa.types.is_float64,
    ValueType.FLOAT: pa.types.is_float32,
    ValueType.BOOL: pa.types.is_boolean,
}
_ITEM_TYPES: Final = {
    ValueType.INT32_LIST: ValueType.INT32,
    ValueType.INT64_LIST: ValueType.INT64,
    ValueType.DOUBLE_LIST: ValueType.DOUBLE,
    ValueType.FLOAT_LIST: ValueType.FLOAT,
}


def _has_nan(values: pa.Array) -> bool:
    if not pa.types.is_floating(values.type) or len(values) == 0:
        return False
    return bool(pc.any(pc.is_nan(values)).as_py())


def vectorizable(column: pa.Array, value_type: ValueType) -> bool:
    """Whether :func:`encode_values` writes ``column`` itself (else Feast does)."""
    if column.null_count:
        return False
    if value_type in _SCALAR_FIELDS:
        return _ARROW_TYPES[value_type](column.type) and not _has_nan(column)
    if value_type in _LIST_FIELDS:
        if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
            return False
        items = column.flatten()
        return (
            _ARROW_TYPES[_ITEM_TYPES[value_type]](items.type)
            and not items.null_count
            and not _has_nan(items)
        )
    return False


def _scalar_rows(column: pa.Array, value_type: ValueType) -> pa.LargeBinaryArray:
    field = _SCALAR_FIELDS[value_type]
    n = len(column)
    if value_type == ValueType.STRING:
        text = column.cast(pa.large_string())
        lengths = pc.binary_length(text).to_numpy().astype(np.uint64)
        return join_rows(
            constant_rows(_tag(field, _DELIMITED), n),
            varint_rows(lengths),
            text.cast(pa.large_binary()),
        )
    if value_type == ValueType.FLOAT:
        return fixed_rows(_tag(field, _FIXED32), column.to_numpy().astype("<f4"))
    if value_type == ValueType.DOUBLE:
        return fixed_rows(_tag(field, _FIXED64), column.to_numpy().astype("<f8"))
    values = column.to_numpy(zero_copy_only=False)
    return join_rows(
        constant_rows(_tag(field, _VARINT), n), varint_rows(as_uint64(values))
    )


def _list_rows(column: pa.Array, value_type: ValueType) -> pa.LargeBinaryArray:
    n = len(column)
    offsets = column.offsets.to_numpy().astype(np.int64)
    items = column.flatten().to_numpy()  # the rows' items, back to back
    offsets -= offsets[0]
    if value_type in (ValueType.FLOAT_LIST, ValueType.DOUBLE_LIST):
        width = 4 if value_type == ValueType.FLOAT_LIST else 8
        data = items.astype("<f4" if width == 4 else "<f8").view(np.uint8)
        payload_offsets = offsets * width
    else:
        data, ends = encode_varints(as_uint64(items))
        payload_offsets = np.concatenate([[0], ends])[offsets]
    payload = byte_rows(data, payload_offsets)
    payload_len = np.diff(payload_offsets).astype(np.uint64)
    # The list message: field 1, packed, omitted when the list is empty.
    inner_len = np.where(
        payload_len > 0, 1 + varint_sizes(payload_len) + payload_len, 0
    ).astype(np.uint64)
    outer_tag = constant_rows(_tag(_LIST_FIELDS[value_type], _DELIMITED), n)
    if not payload_len.all():
        # Some lists are empty: per row, the packed field's header or nothing.
        header = pa.array(
            [b"\x0a" + _varint_bytes(int(x)) if x else b"" for x in payload_len],
            pa.large_binary(),
        )
        return join_rows(outer_tag, varint_rows(inner_len), header, payload)
    return join_rows(
        outer_tag,
        varint_rows(inner_len),
        constant_rows(b"\x0a", n),
        varint_rows(payload_len),
        payload,
    )


def _varint_bytes(value: int) -> bytes:
    data, _ = encode_varints(np.array([value], np.uint64))
    return data.tobytes()


def encode_values(column: pa.Array, value_type: ValueType) -> pa.LargeBinaryArray:
    """``ValueProto(...).SerializeToString()`` of every row of ``column``,
    as Feast's converter would make it for a feature of ``value_type``."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not vectorizable(column, value_type):
        return pa.array(
            [v.SerializeToString() for v in feast_values(column, value_type)],
            pa.large_binary(),
        )
    if value_type in _SCALAR_FIELDS:
        return _scalar_rows(column, value_type)
    return _list_rows(column, value_type)


def feast_values(column: pa.Array, value_type: ValueType) -> list[ValueProto]:
    """Feast's own conversion of a column (what its materialization does)."""
    return python_values_to_proto_values(
        column.to_numpy(zero_copy_only=False), value_type
    )


def value_texts(column: pa.Array, value_type: ValueType) -> list[str | None]:
    """What Feast's SQL stores put in ``value_text`` for each row
    (``extract_text_and_num``: the scalar as ``str``, lists none)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    n = len(column)
    if value_type in _LIST_FIELDS:
        return [None] * n
    if vectorizable(column, value_type):
        if value_type in (ValueType.INT32, ValueType.INT64, ValueType.STRING):
            return column.cast(pa.string()).to_pylist()  # type: ignore[no-any-return]
        if value_type == ValueType.BOOL:
            return ["True" if v else "False" for v in column.to_pylist()]
        # str() of the float protobuf hands back (float32 widened to double).
        return [str(v) for v in column.to_numpy().astype(np.float64).tolist()]
    return [extract_text_and_num(v, False)[0] for v in feast_values(column, value_type)]


# --- entity keys ---------------------------------------------------------------------


def encode_entity_keys(
    columns: Mapping[str, pa.Array],
    join_keys: Mapping[str, ValueType],
    entity_key_serialization_version: int = 3,
) -> pa.LargeBinaryArray:
    """``serialize_entity_key`` of each row's entity key.

    A single int64 join key (every view here) is vectorized: a constant
    prefix (key count, name, value type, length) then the 8 value bytes.
    Other keys go through Feast's serializer.
    """
    names = list(join_keys)
    if (
        entity_key_serialization_version >= 3
        and len(names) == 1
        and join_keys[names[0]] == ValueType.INT64
        and pa.types.is_int64(columns[names[0]].type)
        and not columns[names[0]].null_count
    ):
        name = names[0].encode("utf8")
        prefix = (
            struct.pack("<II", 1, ValueType.STRING.value)
            + struct.pack("<I", len(name))
            + name
            + struct.pack("<II", ValueType.INT64.value, 8)
        )
        values = np.asarray(columns[names[0]].to_numpy(), dtype="<i8")
        return fixed_rows(prefix, values)
    per_key = {k: feast_values(columns[k], join_keys[k]) for k in names}
    n = len(columns[names[0]])
    keys = [
        serialize_entity_key(
            EntityKeyProto(
                join_keys=names, entity_values=[per_key[k][i] for k in names]
            ),
            entity_key_serialization_version=entity_key_serialization_version,
        )
        for i in range(n)
    ]
    return pa.array(keys, pa.large_binary())


def encode_timestamps(micros: np.ndarray) -> pa.LargeBinaryArray:
    """Serialized ``google.protobuf.Timestamp`` per row (what Feast's Redis
    store keeps under ``_ts:<view>``): seconds and nanos, zero fields omitted.
    """
    seconds = np.floor_divide(micros, 1_000_000)
    nanos = (micros - seconds * 1_000_000) * 1000
    n = len(micros)
    parts = []
    for tag, values in ((b"\x08", seconds), (b"\x10", nanos)):
        field = join_rows(constant_rows(tag, n), varint_rows(as_uint64(values)))
        parts.append(pc.if_else(pa.array(values != 0), field, _EMPTY))
    return join_rows(*parts)


# --- Redis protocol ------------------------------------------------------------------


def resp_bulk(rows: pa.Array) -> pa.LargeBinaryArray:
    """Each row as a RESP bulk string (``$<length>\\r\\n<bytes>\\r\\n``): the
    arguments of a Redis command, written by Arrow instead of one by one."""
    rows = rows.cast(pa.large_binary())
    lengths = pc.binary_length(rows).cast(pa.string()).cast(pa.large_binary())
    dollar = pa.scalar(b"$", pa.large_binary())
    crlf = pa.scalar(b"\r\n", pa.large_binary())
    return pc.binary_join_element_wise(dollar, lengths, crlf, rows, crlf, _EMPTY)


def resp_bulk_bytes(*args: bytes | str | int) -> bytes:
    """RESP bulk strings of a few scalar arguments."""
    out = []
    for arg in args:
        raw = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


def row_slices(rows: pa.LargeBinaryArray) -> tuple[np.ndarray, memoryview]:
    """Offsets and data of byte rows, so a run of rows is one buffer slice."""
    _, offsets, data = rows.buffers()
    starts = np.frombuffer(offsets, np.int64)[rows.offset : rows.offset + len(rows) + 1]
    return starts, memoryview(data)


# --- a batch of view rows ----------------------------------------------------------


@dataclass(frozen=True)
class EncodedRows:
    """View rows ready for an online store, in Feast's serialized form.

    Args:
        entity_keys: ``serialize_entity_key`` per row.
        event_us: event time per row, microseconds since the epoch (UTC);
            Feast keeps datetimes, so microseconds are all it stores.
        created_us: created time per row, or None (the source has none).
        values: feature name -> serialized ``ValueProto`` per row.
        texts: feature name -> ``value_text`` per row (only when asked for).
    """

    entity_keys: pa.LargeBinaryArray
    event_us: np.ndarray
    created_us: np.ndarray | None
    values: dict[str, pa.LargeBinaryArray]
    texts: dict[str, list[str | None]]

    def __len__(self) -> int:
        return len(self.entity_keys)


def _microseconds(column: pa.Array) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not pa.types.is_timestamp(column.type):
        raise TypeError(f"expected a timestamp column, got {column.type}")
    # Truncating (floor) to microseconds, as Feast's datetimes do.
    ns = column.cast(pa.timestamp("ns", tz="UTC")).cast(pa.int64()).to_numpy()
    micros: np.ndarray = np.floor_divide(ns, 1000)
    return micros


def encode_batch(
    batch: pa.RecordBatch | pa.Table,
    features: Mapping[str, ValueType],
    join_keys: Mapping[str, ValueType],
    timestamp_field: str,
    created_timestamp_column: str | None = None,
    *,
    entity_key_serialization_version: int = 3,
    with_texts: bool = False,
) -> EncodedRows:
    """Encode one batch of a view's rows (the columns Feast would convert).

    Args:
        batch: the rows (one per entity, as materialization writes them).
        features: feature name -> Feast value type (the view's schema).
        join_keys: join key -> value type.
        timestamp_field: the source's event time column.
        created_timestamp_column: the source's created time column, if any.
        entity_key_serialization_version: the repo's (3).
        with_texts: also compute ``value_text`` (SQLite store).
    """
    columns = {name: batch.column(name) for name in batch.schema.names}
    missing = [c for c in [*features, *join_keys] if c not in columns]
    if missing:
        raise ValueError(f"columns {missing} not found in the batch")
    return EncodedRows(
        entity_keys=encode_entity_keys(
            columns, join_keys, entity_key_serialization_version
        ),
        event_us=_microseconds(columns[timestamp_field]),
        created_us=(
            _microseconds(columns[created_timestamp_column])
            if created_timestamp_column
            else None
        ),
        values={n: encode_values(columns[n], t) for n, t in features.items()},
        texts=(
            {n: value_texts(columns[n], t) for n, t in features.items()}
            if with_texts
            else {}
        ),
    )
