"""The model's inputs as plain arrays, computed one way for training and serving.

The trainer turns Arrow examples into a ``Batch`` through these functions
(:mod:`trainer.data.inputs`), and the scoring service turns online feature
rows into the same arrays, so an id is hashed, a counter squashed and a time
bucketed identically on both sides.

The flat layout every exported serving program takes (``B`` candidates, ``F``
sparse features, ``S`` sequence features, ``N`` history events in all)::

    sparse       (F, B) int64    one id per (feature, candidate), registry
                                 order, already in its table
    seq_values   (S, N) int64    per sequence feature, the histories packed
                                 oldest first, already in their tables
    seq_lengths  (B,)   int64    history length of each candidate
    dense        (B, D) float32  log1p of the counters, registry order
    domain       (B,)   int64    0-based index into vocab.DOMAINS

numpy only: any process loads it cheaply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import numpy as np
import numpy.typing as npt

from features.registry import (
    DENSE_FEATURES,
    SEQUENCE_FEATURES,
    SPARSE_FEATURES,
    hash_bucket,
    time_bucket,
)

SPARSE_NAMES: Final = tuple(f.name for f in SPARSE_FEATURES)
SEQUENCE_NAMES: Final = tuple(f.name for f in SEQUENCE_FEATURES)
DENSE_NAMES: Final = tuple(f.name for f in DENSE_FEATURES)

HASHED_FEATURES: Final = frozenset(
    {"user_id", "ad_id", "advertiser_id", "campaign_id", "seq_item_id"}
)
"""Raw ids folded into their tables; every other id must already be in range."""

TABLE_ROWS: Final = {f.name: f.num_embeddings for f in SPARSE_FEATURES} | {
    f.name: f.num_embeddings for f in SEQUENCE_FEATURES
}

_HOUR_MS: Final = 3_600_000


def feature_ids(name: str, values: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Ids of feature ``name`` in its table: hashed, or checked in range.

    Raises:
        ValueError: an id outside its table (the producer broke the
            contract; clipping it would read some other row's embedding).

    Example:
        >>> feature_ids("surface", [1, 2]).tolist()
        [1, 2]
    """
    rows = TABLE_ROWS[name]
    if name in HASHED_FEATURES:
        return hash_bucket(values, rows)
    ids = np.asarray(values, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= rows):
        bad = ids[(ids < 0) | (ids >= rows)][:5].tolist()
        raise ValueError(f"{name} ids {bad} outside its table [0, {rows})")
    return ids


def sparse_ids(
    columns: Mapping[str, npt.ArrayLike], rows: int
) -> npt.NDArray[np.int64]:
    """The (F, B) sparse ids from one column per sparse feature."""
    out = np.empty((len(SPARSE_NAMES), rows), dtype=np.int64)
    for i, name in enumerate(SPARSE_NAMES):
        out[i] = feature_ids(name, columns[name])
    return out


def sequence_ids(
    values: Mapping[str, npt.ArrayLike], events: int
) -> npt.NDArray[np.int64]:
    """The (S, N) sequence ids from one flat column per sequence feature."""
    out = np.empty((len(SEQUENCE_NAMES), events), dtype=np.int64)
    for i, name in enumerate(SEQUENCE_NAMES):
        out[i] = feature_ids(name, values[name])
    return out


def dense_inputs(
    columns: Mapping[str, npt.ArrayLike], rows: int
) -> npt.NDArray[np.float32]:
    """The (B, D) dense input: log1p of each counter, float32 throughout."""
    out = np.empty((rows, len(DENSE_NAMES)), dtype=np.float32)
    for i, name in enumerate(DENSE_NAMES):
        out[:, i] = np.asarray(columns[name], dtype=np.float32)
    np.log1p(out, out=out)
    return out


def hour_of_day(event_time_ms: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """UTC hour of each time + 1 (0 is the missing id).

    Example:
        >>> hour_of_day([0, 3_600_000 * 25]).tolist()
        [1, 2]
    """
    return (np.asarray(event_time_ms, dtype=np.int64) // _HOUR_MS) % 24 + 1


def sequence_time_buckets(
    event_times_ms: npt.ArrayLike, now_ms: npt.ArrayLike
) -> npt.NDArray[np.int32]:
    """``seq_time_bucket`` of each event seen from ``now_ms`` (one per event,
    or one for all): :func:`features.registry.time_bucket` of the seconds
    between, as a float (milliseconds are not rounded first)."""
    now = np.asarray(now_ms, dtype=np.int64)
    seconds = (now - np.asarray(event_times_ms, dtype=np.int64)) / 1000.0
    return time_bucket(seconds).astype(np.int32)
