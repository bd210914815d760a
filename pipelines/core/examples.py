"""Training examples from a user shard's distinct events (semantics:
:mod:`features.examples`).

Per impression, in the shard's timeline order:

- ids, domain, surface, ad format and objective from the impression;
- labels from the shard's clicks / conversions attributed to it (a user's
  follow-ups are that user's events, so they are in the same shard) within
  the attribution windows after ``t``;
- user and ad attributes by an as-of join on ``updated_at <= t``;
- ``timeline_cut``: the user's events with time ``< t``.

:func:`example_bases` is every column but the counters; :func:`join_counters`
adds those (:mod:`pipelines.core.counters`). Shared by the batch and the
streaming job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features import vocab
from features.events import CLICK_WINDOW, CONVERSION_WINDOW, SCHEMA_VERSION
from features.examples import training_example_schema
from features.feature_tables import FEATURE_TABLES
from features.registry import DENSE_FEATURES, SPARSE_FEATURES, string_bucket
from pipelines.core.asof import asof_index, per_table
from pipelines.core.columns import IntArray, to_int64, vocabulary_codes
from pipelines.core.timelines import user_offsets

LABEL_WINDOWS_MS: Final = {
    "click": int(CLICK_WINDOW.total_seconds() * 1000),
    "conversion": int(CONVERSION_WINDOW.total_seconds() * 1000),
}
_NUM_EMBEDDINGS: Final = {f.name: f.num_embeddings for f in SPARSE_FEATURES}
EXAMPLE_SCHEMA: Final = training_example_schema()
_DENSE_NAMES: Final = tuple(f.name for f in DENSE_FEATURES)
BASE_SCHEMA: Final = pa.schema(
    [f for f in EXAMPLE_SCHEMA if f.name not in _DENSE_NAMES]
)


def table_of(columns: Mapping[str, Any], schema: pa.Schema) -> pa.Table:
    """A table of ``schema`` from its columns by name (numpy arrays or Arrow
    columns, cast to the schema's types)."""
    arrays = [
        columns[f.name].combine_chunks().cast(f.type)
        if isinstance(columns[f.name], pa.ChunkedArray)
        else pa.array(columns[f.name], f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def impression_mask(events: pa.Table) -> IntArray:
    """Boolean mask of the impressions among a shard's events."""
    return np.asarray(pc.equal(events.column("action"), "impression"))


def labels(events: pa.Table, impressions: pa.Table, action: str) -> IntArray:
    """1 where an ``action`` event attributed to the impression falls within
    its window ``[t, t + window)``, else 0."""
    follow = events.filter(pc.equal(events.column("action"), action))
    label = np.zeros(impressions.num_rows, dtype=np.int8)
    if follow.num_rows == 0 or impressions.num_rows == 0:
        return label
    target = to_int64(
        pc.index_in(
            follow.column("impression_id"), value_set=impressions.column("event_id")
        ),
        -1,
    )
    known = target >= 0
    delay = (
        to_int64(follow.column("event_time"))[known]
        - to_int64(impressions.column("event_time"))[target[known]]
    )
    inside = (delay >= 0) & (delay < LABEL_WINDOWS_MS[action])
    label[target[known][inside]] = 1
    return label


def timeline_cuts(events: pa.Table, rows: IntArray) -> IntArray:
    """Events of the user strictly before each of ``rows`` (timeline-order indices)."""
    users = to_int64(events.column("user_id"))
    times = to_int64(events.column("event_time"))
    n = users.size
    offsets = user_offsets(users)
    user_start = np.repeat(offsets[:-1], np.diff(offsets))
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = (users[1:] != users[:-1]) | (times[1:] != times[:-1])
    run_start = np.maximum.accumulate(np.where(new_run, np.arange(n), 0))
    return (run_start - user_start)[rows]


def _lookup(codes: IntArray, rows: IntArray) -> IntArray:
    """``codes[rows]`` with 0 (missing) where ``rows`` is -1."""
    if codes.size == 0:
        return np.zeros(rows.size, dtype=np.int64)
    return np.where(rows >= 0, codes[np.maximum(rows, 0)], 0)


def user_attribute_codes(users: pa.Table) -> dict[str, IntArray]:
    """The user sparse ids of every users-table row, by feature name."""
    ages = to_int64(users.column("age"), -1)
    bounds = np.asarray(vocab.AGE_BUCKET_BOUNDS)
    return {
        # age_bucket(): 1 + index of the last bound <= age, 0 below the first.
        "user_age_bucket": np.searchsorted(bounds, ages, side="right").astype(np.int64),
        "user_gender": vocabulary_codes(users.column("gender"), vocab.GENDERS),
        "user_location": string_bucket(
            users.column("location"), _NUM_EMBEDDINGS["user_location"]
        ),
        "user_device": vocabulary_codes(users.column("device"), vocab.DEVICES),
    }


def ad_attribute_codes(ads: pa.Table) -> dict[str, IntArray]:
    """The ad sparse ids of every ads-table row, by feature name."""
    return {
        "advertiser_id": to_int64(ads.column("advertiser_id")),
        "campaign_id": to_int64(ads.column("campaign_id")),
        "ad_format": vocabulary_codes(ads.column("ad_format"), vocab.AD_FORMATS),
        "ad_objective": vocabulary_codes(ads.column("objective"), vocab.AD_OBJECTIVES),
        "ad_creative_category": vocabulary_codes(
            ads.column("creative_category"), vocab.CATEGORIES
        ),
    }


def profile_rows(name: str, table: pa.Table) -> pa.Table:
    """The ``user_profile`` / ``ad_profile`` feature rows of a dimension table."""
    spec = FEATURE_TABLES[name]
    codes = (
        user_attribute_codes(table)
        if name == "user_profile"
        else (ad_attribute_codes(table))
    )
    arrays = [
        table.column(spec.entity).combine_chunks(),
        table.column("updated_at").combine_chunks(),
        *(pa.array(codes[f], pa.int64()) for f in spec.feature_names),
    ]
    return pa.Table.from_arrays(arrays, schema=spec.schema)


def example_bases(events: pa.Table, users: pa.Table, ads: pa.Table) -> pa.Table:
    """Every example column but the counters, in the shard's impression order.

    Args:
        events: a user shard's distinct events in timeline order.
        users: the users table.
        ads: the ads table.

    Returns:
        BASE_SCHEMA, one row per impression (row i has ordinal i).
    """
    mask = impression_mask(events)
    rows = np.flatnonzero(mask)
    imp = events.filter(pa.array(mask))
    times = to_int64(imp.column("event_time"))
    user_ids = to_int64(imp.column("user_id"))
    user_rows = asof_index(users, "user_id", "updated_at").rows(user_ids, times)
    ad_rows = asof_index(ads, "ad_id", "updated_at").rows(
        to_int64(imp.column("ad_id")), times
    )
    user_codes = per_table(users, "user_codes", user_attribute_codes)
    ad_codes = per_table(ads, "ad_codes", ad_attribute_codes)
    columns: dict[str, Any] = {
        "schema_version": np.full(imp.num_rows, SCHEMA_VERSION, np.int16),
        "example_id": imp.column("event_id"),
        "event_time": imp.column("event_time"),
        "user_id": user_ids,
        "ad_id": imp.column("ad_id"),
        "advertiser_id": imp.column("advertiser_id"),
        "campaign_id": imp.column("campaign_id"),
        "label_click": labels(events, imp, "click"),
        "label_conversion": labels(events, imp, "conversion"),
        **{name: _lookup(codes, user_rows) for name, codes in user_codes.items()},
        "ad_format": vocabulary_codes(imp.column("ad_format"), vocab.AD_FORMATS),
        "ad_objective": vocabulary_codes(imp.column("objective"), vocab.AD_OBJECTIVES),
        "ad_creative_category": _lookup(ad_codes["ad_creative_category"], ad_rows),
        "domain": vocabulary_codes(imp.column("domain"), vocab.DOMAINS),
        "surface": vocabulary_codes(imp.column("surface"), vocab.SURFACES),
        "hour_of_day": (times // 3_600_000) % 24 + 1,
        "timeline_cut": timeline_cuts(events, rows),
    }
    return table_of(columns, BASE_SCHEMA)


def join_counters(base: pa.Table, counters: list[pa.Table]) -> pa.Table:
    """Examples from their bases and the counter pieces (ordinal + columns).

    Raises:
        ValueError: a counter is missing for some example (a bug upstream).
    """
    n = base.num_rows
    dense: dict[str, Any] = {}
    filled: dict[str, IntArray] = {}
    for piece in counters:
        ordinals = to_int64(piece.column("ordinal"))
        for name in piece.column_names[1:]:
            if name not in dense:
                dense[name] = np.zeros(n, dtype=np.float32)
                filled[name] = np.zeros(n, dtype=np.int64)
            dense[name][ordinals] = piece.column(name).to_numpy()
            filled[name][ordinals] += 1
    for name in _DENSE_NAMES:
        if n and (name not in filled or not np.all(filled[name] == 1)):
            raise ValueError(f"counter {name} not joined exactly once per example")
    arrays = []
    for field in EXAMPLE_SCHEMA:
        if field.name in _DENSE_NAMES:
            arrays.append(pa.array(dense.get(field.name, np.zeros(n)), pa.float32()))
        else:
            arrays.append(base.column(field.name))
    return pa.Table.from_arrays(arrays, schema=EXAMPLE_SCHEMA)
