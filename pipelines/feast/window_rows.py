"""The rows of a materialization window, read from a Parquet feature table
(one file, or the parts of a table folder).

Per entity, the latest row in the window, found from the key and time
columns alone (:func:`latest_rows`: what Feast's offline store pulls, without
Dask, whose hashing pickled every sequence cell several times); then the
feature columns streamed in batches of a few MB (:func:`window_batches`),
never the whole table: decoding a large sequence table at once costs more
kernel time, faulting in fresh memory, than the decoding itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def latest_rows(
    parts: Sequence[pq.ParquetFile],
    entity: str,
    start: datetime,
    end: datetime,
    timestamp_field: str,
) -> list[np.ndarray]:
    """Which rows of a feature table materialization writes: per entity, the
    latest row with ``start <= t <= end`` (ties: the last in part order, then
    file order), as one boolean mask per part of the table.

    Reads only the key and time columns; the feature columns are streamed
    afterwards (:func:`window_batches`), never held whole.
    """
    found = [
        _latest_in_part(part, entity, start, end, timestamp_field) for part in parts
    ]
    masks = [np.zeros(part.metadata.num_rows, bool) for part in parts]
    if len(parts) > 1:
        # The feature job puts each entity in one part; another writer need
        # not, so the parts' latest rows are compared (one per entity each).
        rows = np.concatenate([f[0] for f in found])
        keys = np.concatenate([f[1] for f in found])
        ms = np.concatenate([f[2] for f in found])
        owner = np.repeat(np.arange(len(parts)), [f[0].size for f in found])
        order = np.lexsort((ms, keys))  # stable: ties keep the part order
        rows, keys, owner = rows[order], keys[order], owner[order]
        last = _last_of_each(keys)
        for index, mask in enumerate(masks):
            mask[rows[last & (owner == index)]] = True
    elif parts:
        masks[0][found[0][0]] = True
    return masks


def _latest_in_part(
    parquet: pq.ParquetFile,
    entity: str,
    start: datetime,
    end: datetime,
    timestamp_field: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per entity, the latest row of one part in the window: (rows, keys,
    times in ms), by key."""
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
        rows, keys, ms = rows[order], keys[order], ms[order]
    last = _last_of_each(keys)
    return rows[last], keys[last], ms[last]


def _last_of_each(keys: np.ndarray) -> np.ndarray:
    """Mask of the last position of each run of equal ``keys`` (sorted)."""
    return np.append(keys[1:] != keys[:-1], True) if keys.size else keys.astype(bool)


def batch_rows(
    parts: Sequence[pq.ParquetFile], columns: list[str], most: int, target_bytes: int
) -> int:
    """Rows per batch: about ``target_bytes`` of decoded ``columns`` (from the
    parts' metadata), at most ``most``."""
    total_rows = sum(part.metadata.num_rows for part in parts)
    if total_rows == 0:
        return most
    wanted = set(columns)
    decoded = sum(
        chunk.total_uncompressed_size
        for meta in (part.metadata for part in parts)
        for group in range(meta.num_row_groups)
        for chunk in map(meta.row_group(group).column, range(meta.num_columns))
        if chunk.path_in_schema.split(".")[0] in wanted
    )
    per_row = max(1, decoded // total_rows)
    return int(min(most, max(64, target_bytes // per_row)))


def window_batches(
    parts: Sequence[pq.ParquetFile],
    columns: list[str],
    keep: Sequence[np.ndarray],
    rows: int,
) -> Iterator[pa.RecordBatch]:
    """The kept rows of ``columns`` (``keep``: a mask per part, as
    :func:`latest_rows` gives), streamed in batches of about ``rows``."""
    pending: list[pa.RecordBatch] = []
    held = 0
    for parquet, part_keep in zip(parts, keep, strict=True):
        if not part_keep.any():
            continue
        offset = 0
        for batch in parquet.iter_batches(batch_size=rows, columns=columns):
            mask = part_keep[offset : offset + batch.num_rows]
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
