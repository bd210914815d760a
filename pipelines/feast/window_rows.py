"""The rows of a materialization window, read from a Parquet feature table.

Per entity, the latest row in the window, found from the key and time
columns alone (:func:`latest_rows`: what Feast's offline store pulls, without
Dask, whose hashing pickled every sequence cell several times); then the
feature columns streamed in batches of a few MB (:func:`window_batches`),
never the whole table: decoding a large sequence table at once costs more
kernel time, faulting in fresh memory, than the decoding itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def latest_rows(
    parquet: pq.ParquetFile,
    entity: str,
    start: datetime,
    end: datetime,
    timestamp_field: str,
) -> np.ndarray:
    """Which rows of a feature table materialization writes: per entity, the
    latest row with ``start <= t <= end`` (ties: the last in the file), as a
    boolean mask over the file's rows.

    Reads only the key and time columns; the feature columns are streamed
    afterwards (:func:`window_batches`), never held whole.
    """
    table = parquet.read(columns=[entity, timestamp_field])
    times = table.column(timestamp_field)
    inside = pc.and_(
        pc.greater_equal(times, pa.scalar(start, times.type)),
        pc.less_equal(times, pa.scalar(end, times.type)),
    )
    rows = np.flatnonzero(inside.to_numpy(zero_copy_only=False))
    keys = table.column(entity).to_numpy()[rows]
    ms = times.cast(pa.int64()).to_numpy()[rows]
    # The feature job writes rows sorted by (entity, time); sort only if not.
    ordered = bool(
        np.all((keys[1:] > keys[:-1]) | ((keys[1:] == keys[:-1]) & (ms[1:] >= ms[:-1])))
    )
    if not ordered:
        order = np.lexsort((ms, keys))  # stable: ties keep their file order
        rows, keys = rows[order], keys[order]
    last = np.append(keys[1:] != keys[:-1], True) if keys.size else keys.astype(bool)
    keep = np.zeros(table.num_rows, bool)
    keep[rows[last]] = True
    return keep


def batch_rows(
    parquet: pq.ParquetFile, columns: list[str], most: int, target_bytes: int
) -> int:
    """Rows per batch: about ``target_bytes`` of decoded ``columns`` (from the
    file's metadata), at most ``most``."""
    meta = parquet.metadata
    if meta.num_rows == 0:
        return most
    wanted = set(columns)
    decoded = sum(
        chunk.total_uncompressed_size
        for group in range(meta.num_row_groups)
        for chunk in map(meta.row_group(group).column, range(meta.num_columns))
        if chunk.path_in_schema.split(".")[0] in wanted
    )
    per_row = max(1, decoded // meta.num_rows)
    return int(min(most, max(64, target_bytes // per_row)))


def window_batches(
    parquet: pq.ParquetFile, columns: list[str], keep: np.ndarray, rows: int
) -> Iterator[pa.RecordBatch]:
    """The kept rows of ``columns``, streamed in batches of about ``rows``."""
    if not keep.any():
        return
    pending: list[pa.RecordBatch] = []
    held = 0
    offset = 0
    for batch in parquet.iter_batches(batch_size=rows, columns=columns):
        mask = keep[offset : offset + batch.num_rows]
        offset += batch.num_rows
        if not mask.all():
            if not mask.any():
                continue
            batch = batch.filter(pa.array(mask))
        if not pending and batch.num_rows >= rows // 2:
            yield batch
            continue
        # A filtered window: gather small pieces into batches of ~`rows`.
        pending.append(batch)
        held += batch.num_rows
        if held >= rows:
            yield pa.Table.from_batches(pending).combine_chunks().to_batches()[0]
            pending, held = [], 0
    if pending:
        yield pa.Table.from_batches(pending).combine_chunks().to_batches()[0]
