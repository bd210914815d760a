"""Shards: which shard a row belongs to, and a table split by shard.

Stable across processes and machines, so one user (or ad, or advertiser)
always lands in the same shard, output part and stateful key.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from features.registry import hash_bucket
from pipelines.core.columns import IntArray


def shard_of(ids: npt.ArrayLike, shards: int) -> IntArray:
    """Shard of each id: a stable multiplicative hash mod ``shards``.

    Stable across processes and machines (unlike Python's ``hash``), so the
    same user always lands in the same shard and output part.

    Example:
        >>> shard_of([1, 2, 3], 4).tolist()
        [2, 1, 0]
    """
    return hash_bucket(np.asarray(ids, dtype=np.int64), shards)


def split_by_shard(
    table: pa.Table, shards_of_rows: IntArray
) -> list[tuple[int, pa.Table]]:
    """Rows of ``table`` grouped by their shard, in row order within a shard."""
    if table.num_rows == 0:
        return []
    keys = shards_of_rows
    if keys.size and 0 <= keys.min() and keys.max() < np.iinfo(np.int16).max:
        # numpy sorts 16-bit integers by radix: several times faster than
        # the merge sort that a stable sort of int64 is.
        keys = keys.astype(np.int16)
    order = np.argsort(keys, kind="stable")
    sorted_shards = shards_of_rows[order]
    bounds = np.flatnonzero(np.diff(sorted_shards)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(order)]])
    taken = table.take(pa.array(order))
    return [
        (int(sorted_shards[lo]), taken.slice(int(lo), int(hi - lo)))
        for lo, hi in zip(starts, ends, strict=True)
    ]
