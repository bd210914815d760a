"""Feast feature views, one per feature table, generated from the contract.

Every view's schema is derived from its table's Arrow schema in
:data:`features.feature_tables.FEATURE_TABLES` (:func:`feast_dtype` maps each
column type), so a column added to the contract appears here without being
typed again; ``tests/test_feast_repo.py`` holds the views, the pipeline's
columns and the trainer's feature names to the same set.

No view expires (:data:`NO_EXPIRY`): the contract's point-in-time rule is
"the latest row with ``event_timestamp <= t``", whatever its age (a profile
row holds until the next version). Feast's ttl of 0 would mean the same for
retrieval, but ``materialize-incremental`` would then start only a year back
and leave older profiles out of the online store.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

import pyarrow as pa
from entities import ENTITIES
from feast import FeatureView, Field
from feast.data_source import DataSource
from feast.types import (
    Array,
    Bool,
    FeastType,
    Float32,
    Float64,
    Int32,
    Int64,
    String,
    UnixTimestamp,
)
from sources import SOURCES

from features.feature_tables import EVENT_TIMESTAMP, FEATURE_TABLES, FeatureTable

NO_EXPIRY: Final = timedelta(days=100 * 365)
"""Longer than the epoch is old: nothing ever falls out of a view."""

_SCALARS: Final[dict[pa.DataType, FeastType]] = {
    pa.int64(): Int64,
    pa.int32(): Int32,
    pa.float32(): Float32,
    pa.float64(): Float64,
    pa.string(): String,
    pa.bool_(): Bool,
}


def feast_dtype(arrow_type: pa.DataType) -> FeastType:
    """The Feast type of a contract column (lists become ``Array``).

    Raises:
        TypeError: a type the contract does not use (add it here on purpose).
    """
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        inner = feast_dtype(arrow_type.value_type)
        if isinstance(inner, Array):
            raise TypeError(f"nested lists have no Feast type: {arrow_type}")
        return Array(inner)
    if pa.types.is_timestamp(arrow_type):
        return UnixTimestamp
    if arrow_type in _SCALARS:
        return _SCALARS[arrow_type]
    raise TypeError(f"no Feast type for Arrow type {arrow_type}")


def _doc(field: pa.Field) -> str:
    return (field.metadata or {}).get(b"doc", b"").decode()


def make_view(table: FeatureTable, source: DataSource) -> FeatureView:
    """The feature view of one feature table (schema = the table's columns)."""
    schema = [
        Field(name=f.name, dtype=feast_dtype(f.type), description=_doc(f))
        for f in table.schema
        if f.name != EVENT_TIMESTAMP
    ]
    return FeatureView(
        name=table.name,
        entities=[ENTITIES[table.entity]],
        ttl=NO_EXPIRY,
        schema=schema,
        source=source,
        online=True,
        description=table.doc,
        tags={"contract": "features.feature_tables"},
    )


def make_views(sources: dict[str, DataSource]) -> dict[str, FeatureView]:
    """Every feature view, by table name, reading the given sources."""
    return {name: make_view(t, sources[name]) for name, t in FEATURE_TABLES.items()}


VIEWS: Final = make_views(SOURCES)

user_profile_fv = VIEWS["user_profile"]
ad_profile_fv = VIEWS["ad_profile"]
user_counters_fv = VIEWS["user_counters"]
ad_counters_fv = VIEWS["ad_counters"]
advertiser_counters_fv = VIEWS["advertiser_counters"]
user_sequence_fv = VIEWS["user_sequence"]
