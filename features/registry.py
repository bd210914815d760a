"""The model's features, defined once.

Every feature the trainer embeds or reads is declared here; the training
example schema (:mod:`features.examples`), the pipeline's output columns, the
Feast views and TorchRec's embedding configs are all derived from these lists,
and tests hold them to that.

Id features are embedded through tables of ``num_embeddings`` rows. Vocabulary
features map a value to its 1-based vocabulary id (0 = missing). Large id
spaces (users, ads, items) are folded into their table by :func:`hash_bucket`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from features import vocab


@dataclass(frozen=True, kw_only=True)
class SparseFeature:
    """A non-sequential categorical feature: one id per example.

    Args:
        name: column name in the training examples (and Feast field name).
        num_embeddings: rows of its embedding table (ids are in
            ``[0, num_embeddings)``).
        doc: what it is.
    """

    name: str
    num_embeddings: int
    doc: str


@dataclass(frozen=True, kw_only=True)
class DenseFeature:
    """A non-sequential float feature (float32 column)."""

    name: str
    doc: str


@dataclass(frozen=True, kw_only=True)
class SequenceFeature:
    """One per-event attribute of the user's behaviour sequence (jagged).

    Args:
        name: list column name (``seq_*``).
        num_embeddings: rows of its embedding table.
        doc: what each element is.
    """

    name: str
    num_embeddings: int
    doc: str


def _vocab_size(values: tuple[str, ...]) -> int:
    return len(values) + 1  # + id 0, "missing"


SPARSE_FEATURES: Final[tuple[SparseFeature, ...]] = (
    SparseFeature(name="user_id", num_embeddings=1_000_003, doc="hashed user id"),
    SparseFeature(name="ad_id", num_embeddings=500_009, doc="hashed ad id"),
    SparseFeature(
        name="advertiser_id", num_embeddings=100_003, doc="hashed advertiser id"
    ),
    SparseFeature(name="campaign_id", num_embeddings=200_003, doc="hashed campaign id"),
    SparseFeature(
        name="user_age_bucket",
        num_embeddings=len(vocab.AGE_BUCKET_BOUNDS) + 1,
        doc="age bucket (see vocab.AGE_BUCKET_BOUNDS)",
    ),
    SparseFeature(
        name="user_gender", num_embeddings=_vocab_size(vocab.GENDERS), doc="gender"
    ),
    SparseFeature(
        name="user_location", num_embeddings=10_007, doc="hashed location string"
    ),
    SparseFeature(
        name="user_device", num_embeddings=_vocab_size(vocab.DEVICES), doc="device"
    ),
    SparseFeature(
        name="ad_format", num_embeddings=_vocab_size(vocab.AD_FORMATS), doc="format"
    ),
    SparseFeature(
        name="ad_objective",
        num_embeddings=_vocab_size(vocab.AD_OBJECTIVES),
        doc="campaign objective",
    ),
    SparseFeature(
        name="ad_creative_category",
        num_embeddings=_vocab_size(vocab.CATEGORIES),
        doc="declared creative category",
    ),
    SparseFeature(name="domain", num_embeddings=_vocab_size(vocab.DOMAINS), doc="app"),
    SparseFeature(
        name="surface", num_embeddings=_vocab_size(vocab.SURFACES), doc="surface"
    ),
    SparseFeature(
        name="hour_of_day", num_embeddings=25, doc="UTC hour of the impression + 1"
    ),
)

COUNTER_ENTITIES: Final = ("user", "ad", "advertiser")
COUNTER_ACTIONS: Final = ("impression", "click", "conversion")
COUNTER_WINDOWS: Final = ("1h", "1d", "7d")

DENSE_FEATURES: Final[tuple[DenseFeature, ...]] = tuple(
    DenseFeature(
        name=f"{entity}_{action}_count_{window}",
        doc=f"{action}s of this {entity} in the {window} before the impression",
    )
    for entity in COUNTER_ENTITIES
    for action in COUNTER_ACTIONS
    for window in COUNTER_WINDOWS
)

TIME_BUCKETS: Final = 40

SEQUENCE_FEATURES: Final[tuple[SequenceFeature, ...]] = (
    SequenceFeature(
        name="seq_item_id",
        num_embeddings=1_000_003,
        doc="hashed item key (ad or content, see sequence_item_key)",
    ),
    SequenceFeature(
        name="seq_action", num_embeddings=_vocab_size(vocab.ACTIONS), doc="action"
    ),
    SequenceFeature(
        name="seq_domain", num_embeddings=_vocab_size(vocab.DOMAINS), doc="app"
    ),
    SequenceFeature(
        name="seq_surface", num_embeddings=_vocab_size(vocab.SURFACES), doc="surface"
    ),
    SequenceFeature(
        name="seq_category",
        num_embeddings=_vocab_size(vocab.CATEGORIES),
        doc="category of the ad (declared) or content",
    ),
    SequenceFeature(
        name="seq_time_bucket",
        num_embeddings=TIME_BUCKETS + 1,
        doc="log2 bucket of the seconds between the event and the impression",
    ),
)


def hash_bucket(ids: npt.ArrayLike, num_embeddings: int) -> npt.NDArray[np.int64]:
    """Fold non-negative int64 ids into ``[0, num_embeddings)``.

    A multiplicative (Fibonacci) hash rather than a plain modulo, so ids that
    share a stride (all campaign ids of one advertiser, say) still spread.

    Example:
        >>> hash_bucket([0, 1, 2**40], 10).tolist()
        [0, 0, 6]
    """
    x = np.asarray(ids, dtype=np.uint64)
    with np.errstate(over="ignore"):
        mixed = x * np.uint64(0x9E3779B97F4A7C15)
    mixed ^= mixed >> np.uint64(29)
    return (mixed % np.uint64(num_embeddings)).astype(np.int64)


def sequence_item_key(
    ad_id: npt.ArrayLike, content_id: npt.ArrayLike, is_ad: npt.ArrayLike
) -> npt.NDArray[np.int64]:
    """One key space for the two kinds of items a timeline holds.

    Ads get even keys (``2 * ad_id``), content odd ones (``2 * content_id + 1``),
    so an ad and a content item with the same number never collide.

    Example:
        >>> sequence_item_key([7, 0], [0, 7], [True, False]).tolist()
        [14, 15]
    """
    ad = np.asarray(ad_id, dtype=np.int64)
    content = np.asarray(content_id, dtype=np.int64)
    return np.where(np.asarray(is_ad, dtype=bool), 2 * ad, 2 * content + 1)


def time_bucket(seconds_before: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Log2 bucket (1..TIME_BUCKETS) of how long before the impression an event was.

    Example:
        >>> time_bucket([0, 1, 3, 3600]).tolist()
        [1, 2, 3, 12]
    """
    s = np.maximum(np.asarray(seconds_before, dtype=np.float64), 0.0)
    bucket = 1 + np.floor(np.log2(1.0 + s)).astype(np.int64)
    return np.minimum(bucket, TIME_BUCKETS)


_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


def string_bucket(
    values: pa.Array | pa.ChunkedArray, num_embeddings: int
) -> npt.NDArray[np.int64]:
    """Fold strings of an open vocabulary (locations) into ``[1, num_embeddings)``.

    FNV-1a over the UTF-8 bytes, vectorized over the array one byte position
    at a time (strings here are short). Null and empty strings map to 0, the
    "missing" id. Stable across processes and platforms, unlike ``hash()``.

    Example:
        >>> string_bucket(pa.array(["US-07", None, ""]), 100).tolist()
        [57, 0, 0]
    """
    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    array = array.cast(pa.string()).fill_null("")
    n = len(array)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)[
        array.offset : array.offset + n + 1
    ]
    data_buffer = array.buffers()[2]
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)
        if data_buffer is not None
        else np.zeros(0, dtype=np.uint8)
    )
    lengths = np.diff(offsets)
    hashes = np.full(n, _FNV_OFFSET, dtype=np.uint64)
    for position in range(int(lengths.max()) if n else 0):
        live = lengths > position
        byte = data[offsets[:-1][live] + position].astype(np.uint64)
        with np.errstate(over="ignore"):
            hashes[live] = (hashes[live] ^ byte) * _FNV_PRIME
    buckets = 1 + (hashes % np.uint64(num_embeddings - 1)).astype(np.int64)
    return np.where(lengths > 0, buckets, 0)
