"""Arrow columns as numpy arrays: integers, vocabulary ids, dictionary codes.

The conversions every stage of the feature job makes at its edges, in one
place so that the batch job, the streaming job and the reference read a
column the same way.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

IntArray = npt.NDArray[np.int64]


def to_int64(values: pa.ChunkedArray | pa.Array, fill: int = 0) -> IntArray:
    """An integer or timestamp column as int64 numpy (nulls as ``fill``)."""
    if pa.types.is_timestamp(values.type):
        values = pc.cast(values, pa.int64())
    return np.asarray(pc.fill_null(values, fill).to_numpy(), dtype=np.int64)


def vocabulary_codes(
    values: pa.ChunkedArray | pa.Array, vocabulary: tuple[str, ...]
) -> IntArray:
    """1-based vocabulary id of each string (0 = null or not in the vocabulary)."""
    index = pc.index_in(values, value_set=pa.array(vocabulary, pa.string()))
    return to_int64(index, -1) + 1


def concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    """Concatenate pieces of one schema (zero-copy: the result is chunked)."""
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables)


def dictionary_codes(values: pa.ChunkedArray | pa.Array) -> IntArray:
    """Each value's index among the distinct values, in order of first
    appearance (Arrow's dictionary encoding).

    Example:
        >>> dictionary_codes(pa.array(["b", "a", "b"])).tolist()
        [0, 1, 0]
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return np.asarray(pc.dictionary_encode(values).indices.to_numpy(), dtype=np.int64)
