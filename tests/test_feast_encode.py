"""The vectorized encoder writes exactly the bytes Feast's converter does.

Every expected value is Feast's own: ``python_values_to_proto_values`` (what
its materialization calls) then ``SerializeToString``, ``serialize_entity_key``
and ``extract_text_and_num``.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
from feast.infra.key_encoding_utils import serialize_entity_key
from feast.infra.online_stores.helpers import extract_text_and_num
from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from feast.type_map import python_values_to_proto_values
from feast.value_type import ValueType
from google.protobuf.timestamp_pb2 import Timestamp

from pipelines.feast import encode as feast_encode

RNG = np.random.default_rng(3)
EDGE_INTS = [0, 1, -1, 127, 128, 16383, 16384, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)]


def feast_bytes(column: pa.Array, value_type: ValueType) -> list[bytes]:
    values = python_values_to_proto_values(
        column.to_numpy(zero_copy_only=False), value_type
    )
    return [v.SerializeToString() for v in values]


def int_column(dtype: str, n: int = 400) -> pa.Array:
    info = np.iinfo(dtype)
    edges = [x for x in EDGE_INTS if info.min <= x <= info.max]
    # Magnitudes of every varint length, both signs.
    bits = RNG.integers(0, info.bits - 1, n)
    values = RNG.integers(0, 2, n) * 2 - 1
    values = values * (2 ** bits.astype(np.float64)).astype(np.int64).clip(max=info.max)
    return pa.array(np.concatenate([edges, values]).astype(dtype))


def list_column(items: pa.Array, *, empty: bool) -> pa.Array:
    n = len(items)
    cuts = np.sort(RNG.integers(0, n, 40))
    if not empty:
        cuts = np.unique(np.concatenate([cuts, [0, n]]))
    offsets = np.concatenate([[0], cuts, [n]]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), items)


COLUMNS = {
    "int64": (int_column("int64"), ValueType.INT64),
    "int32": (int_column("int32"), ValueType.INT32),
    "float": (pa.array(RNG.normal(size=300).astype(np.float32)), ValueType.FLOAT),
    "double": (pa.array(RNG.normal(size=300) * 1e300), ValueType.DOUBLE),
    "bool": (pa.array(RNG.integers(0, 2, 50).astype(bool)), ValueType.BOOL),
    "string": (pa.array(["", "a", "é" * 70, "x" * 300]), ValueType.STRING),
    "int64_list": (list_column(int_column("int64"), empty=False), ValueType.INT64_LIST),
    "int64_list_empty": (
        list_column(int_column("int64"), empty=True),
        ValueType.INT64_LIST,
    ),
    "int32_list": (list_column(int_column("int32"), empty=True), ValueType.INT32_LIST),
    "long_int64_lists": (
        pa.ListArray.from_arrays(
            pa.array(np.arange(0, 256 * 21, 256, dtype=np.int32)),
            pa.array(RNG.integers(0, 2**50, 256 * 20)),
        ),
        ValueType.INT64_LIST,
    ),
    "float_list": (
        list_column(pa.array(RNG.normal(size=200).astype(np.float32)), empty=True),
        ValueType.FLOAT_LIST,
    ),
    "double_list": (
        list_column(pa.array(RNG.normal(size=200)), empty=False),
        ValueType.DOUBLE_LIST,
    ),
    # Feast's converter handles these (nulls, NaN): same bytes by construction,
    # and the vectorized path must not claim them.
    "int64_with_null": (pa.array([1, None, 3]), ValueType.INT64),
    "float_with_nan": (pa.array([1.0, np.nan], pa.float32()), ValueType.FLOAT),
    "list_with_null": (pa.array([[1, 2], None, []]), ValueType.INT64_LIST),
}
FALLBACK = {"int64_with_null", "float_with_nan", "list_with_null"}


@pytest.mark.parametrize("name", sorted(COLUMNS))
def test_values_are_feasts_bytes(name: str) -> None:
    column, value_type = COLUMNS[name]
    assert feast_encode.vectorizable(column, value_type) == (name not in FALLBACK)
    got = feast_encode.encode_values(column, value_type).to_pylist()
    assert got == feast_bytes(column, value_type)
    # A slice (a batch of a larger table) starts at a nonzero offset.
    start = len(column) // 3
    part = column.slice(start, len(column) - start - 1)
    got = feast_encode.encode_values(part, value_type).to_pylist()
    assert got == feast_bytes(part, value_type)


@pytest.mark.parametrize("name", sorted(COLUMNS))
def test_value_texts_are_feasts(name: str) -> None:
    column, value_type = COLUMNS[name]
    values = python_values_to_proto_values(
        column.to_numpy(zero_copy_only=False), value_type
    )
    want = [extract_text_and_num(v, False)[0] for v in values]
    assert feast_encode.value_texts(column, value_type) == want


def test_entity_keys_are_feasts() -> None:
    ids = int_column("int64")
    got = feast_encode.encode_entity_keys(
        {"user_id": ids}, {"user_id": ValueType.INT64}
    ).to_pylist()
    want = [
        serialize_entity_key(
            EntityKeyProto(
                join_keys=["user_id"], entity_values=[ValueProto(int64_val=i)]
            ),
            entity_key_serialization_version=3,
        )
        for i in ids.to_pylist()
    ]
    assert got == want
    # Two keys (Feast's serializer sorts them): the fallback.
    two = {"b": pa.array([1, 2]), "a": pa.array(["x", "y"])}
    types = {"b": ValueType.INT64, "a": ValueType.STRING}
    got = feast_encode.encode_entity_keys(two, types).to_pylist()
    assert got[1] == serialize_entity_key(
        EntityKeyProto(
            join_keys=["b", "a"],
            entity_values=[ValueProto(int64_val=2), ValueProto(string_val="y")],
        ),
        entity_key_serialization_version=3,
    )


def test_batch_times_are_microseconds() -> None:
    times = pa.array([1_790_000_000_123, -1], pa.timestamp("ms", tz="UTC"))
    batch = pa.RecordBatch.from_pydict(
        {
            "user_id": pa.array([1, 2]),
            "t": times,
            "f": pa.array([1.5, 2.5], pa.float32()),
        }
    )
    rows = feast_encode.encode_batch(
        batch,
        {"f": ValueType.FLOAT},
        {"user_id": ValueType.INT64},
        "t",
        with_texts=True,
    )
    assert rows.event_us.tolist() == [1_790_000_000_123_000, -1000]
    assert rows.created_us is None
    assert rows.texts == {"f": ["1.5", "2.5"]}
    assert len(rows) == 2


def test_timestamps_are_feasts() -> None:
    """Feast's Redis store: ``Timestamp.FromDatetime`` of the event time."""
    micros = np.array([0, 1, 999_999, 1_000_000, 1_790_000_000_123_456, -1, -1_500_000])
    got = feast_encode.encode_timestamps(micros).to_pylist()
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    want = []
    for us in micros.tolist():
        ts = Timestamp()
        ts.FromDatetime(epoch + dt.timedelta(microseconds=us))
        want.append(ts.SerializeToString())
    assert got == want


def test_resp_bulk_strings() -> None:
    rows = pa.array([b"", b"ab\r\n", b"x" * 300], pa.large_binary())
    assert feast_encode.resp_bulk(rows).to_pylist() == [
        b"$0\r\n\r\n",
        b"$4\r\nab\r\n\r\n",
        b"$300\r\n" + b"x" * 300 + b"\r\n",
    ]
    assert feast_encode.resp_bulk_bytes(b"k", 12, "é") == (
        b"$1\r\nk\r\n$2\r\n12\r\n$2\r\n\xc3\xa9\r\n"
    )
    offsets, data = feast_encode.row_slices(feast_encode.resp_bulk(rows).slice(1))
    assert bytes(data[offsets[0] : offsets[-1]]) == (
        b"$4\r\nab\r\n\r\n$300\r\n" + b"x" * 300 + b"\r\n"
    )


@pytest.mark.parametrize(
    "values",
    [
        RNG.integers(0, 100, 500),  # one byte each
        RNG.integers(0, 2**28, 500),  # up to 4 bytes: uint32 words
        RNG.integers(2**21, 2**28, 500),  # all exactly 4 bytes: strided copy
        1_790_000_000_000 + RNG.integers(0, 86_400_000, 500),  # all 6 (epoch ms)
        RNG.integers(0, 2**56, 500),  # up to 8 bytes: uint64 words
        RNG.integers(-(2**62), 2**62, 500),  # negatives: 10 bytes
    ],
    ids=["1", "le4", "eq4", "eq6", "le8", "neg"],
)
def test_varints_are_protobufs(values: np.ndarray) -> None:
    from google.protobuf.internal.encoder import _VarintBytes

    unsigned = feast_encode.as_uint64(values.astype(np.int64))
    data, ends = feast_encode.encode_varints(unsigned)
    expected = [_VarintBytes(int(v)) for v in unsigned]
    assert data.tobytes() == b"".join(expected)
    assert ends.tolist() == np.cumsum([len(e) for e in expected]).tolist()
