"""The feature job's outputs: Feast feature tables and the files on disk.

Every producer of features (the Beam job ``pipelines/build.py`` and the
single-process reference ``pipelines/core/reference.py``) writes exactly these
tables and this layout; a test holds the two to the same content. Schemas are
derived from :mod:`features.registry`, never typed twice.

Feature tables (Feast sources: one row per entity version, the time from
which it holds in ``event_timestamp``; Feast's point-in-time join at time
``t`` takes, per entity, the latest row with ``event_timestamp <= t``):

- ``user_profile``: a row per users-table row; ``event_timestamp`` =
  ``updated_at``; the user sparse ids exactly as examples compute them.
- ``ad_profile``: a row per ads-table row; ``event_timestamp`` =
  ``updated_at``; advertiser and campaign ids, and ``ad_format`` /
  ``ad_objective`` / ``ad_creative_category`` vocabulary ids *from the ads
  table* (an example takes format and objective from its impression event,
  which in valid data agree with the ads table).
- ``user_counters``, ``ad_counters``, ``advertiser_counters``: one row per
  (entity, distinct time of an ad event of that entity), i.e. every time an
  impression, click or conversion of that user / ad / advertiser happened,
  holding the entity's 9 counters over ``[event_timestamp - window,
  event_timestamp)``. Every impression time of an entity is such a time, so
  Feast's point-in-time join at an impression's time ``t`` finds the row at
  exactly ``t`` and returns **exactly the example's counters**. Between two
  rows the values are stale (windows keep sliding); they are exact only at
  the entity's event times.
- ``user_sequence``: periodic snapshots of the recent history: one row per
  (user, UTC hour in which the user had at least one event), with
  ``event_timestamp`` = the **end** of that hour, holding the last
  :data:`USER_SEQUENCE_LENGTH` timeline events strictly before it (oldest
  first) as list columns: ``seq_event_time_ms`` (epoch ms, for time buckets
  at serving time) and the timeline's ``seq_*`` values (``seq_item_id`` the
  raw item key, as in timelines). A snapshot only holds events before its own
  timestamp, so the point-in-time join never leaks; at time ``t`` it returns
  the history up to the last full hour boundary before ``t`` in which the
  user was active (not the exact window of an example, which comes from the
  timeline).

Counters are float32, like the examples' dense columns, so a Feast lookup and
an example compare equal bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final

import pyarrow as pa
import pyarrow.parquet as pq

from features.events import SCHEMA_VERSION
from features.examples import TIMELINE_SCHEMA
from features.fields import TIMESTAMP_TYPE
from features.registry import (
    COUNTER_ACTIONS,
    COUNTER_ENTITIES,
    COUNTER_WINDOWS,
    DENSE_FEATURES,
    SPARSE_FEATURES,
)

USER_SEQUENCE_LENGTH: Final = 64
"""Events per ``user_sequence`` snapshot."""

EVENT_TIMESTAMP: Final = "event_timestamp"
"""The Feast ``timestamp_field`` of every feature table."""

OUTPUT_LAYOUT: Final = """\
Files under the feature job's --output DIR (Beam job and reference alike):

  examples/date=YYYY-MM-DD/part-*.parquet
      training examples, exactly training_example_schema() (no seq_* columns),
      hive-partitioned by the UTC day of event_time (the impression time);
      the reference writes one part-0 per day, rows sorted by example_id.
  timelines/part-*.parquet
      exactly TIMELINE_SCHEMA, one row per user with at least one valid event;
      the reference writes part-0, rows sorted by user_id.
  feature_tables/<name>/part-*.parquet
      a folder per FEATURE_TABLES entry (user_profile, ad_profile,
      user_counters, ad_counters, advertiser_counters, user_sequence), of at
      least one part, each in exactly the table's schema; all rows of an
      entity lie in one part, sorted there by (entity id, event_timestamp)
      (read_feature_table reads a table whole in that order); the reference
      writes part-0.
  dead_letters/part-*.jsonl
      one line per rejected event, features.deadletter.DeadLetter.to_json():
      source (file or topic), partition (null for files), offset (1-based
      line or row, or Kafka offset), reason (the validator's), set_aside_ms,
      payload_length, payload_sha256, truncated, and the original bytes as
      "payload" (UTF-8 text) or "payload_base64"; a Parquet row's payload is
      its event wire JSON.
  summary.json
      {"counts": {...}} with the integer counts below, plus "now_ms" (the
      validation clock) and "layout_version".

Counts (they add up):
  events_read       = events_valid + events_dead_lettered
  events_valid      = events_distinct + duplicates_removed
  events_distinct   = timeline_events (every distinct valid event is in
                      exactly one timeline)
  impressions       = examples (distinct valid impressions)
  timelines         = users with at least one distinct valid event

Row order across part files is unspecified: compare outputs after sorting by
the key columns above. Number and names of part files may differ.
"""

LAYOUT_VERSION: Final = 3
"""Version of this layout: the tables above and the dead-letter lines of
:mod:`features.deadletter`."""

COUNT_NAMES: Final = (
    "events_read",
    "events_valid",
    "events_dead_lettered",
    "duplicates_removed",
    "events_distinct",
    "timeline_events",
    "timelines",
    "impressions",
    "examples",
)
"""The keys of ``summary.json``'s ``counts`` (see :data:`OUTPUT_LAYOUT`)."""


@dataclass(frozen=True)
class FeatureTable:
    """One Feast feature table.

    Args:
        name: file stem and Feast feature view name.
        entity: the entity's join key column.
        schema: the table's Arrow schema (entity, ``event_timestamp``, features).
        doc: what a row holds.
    """

    name: str
    entity: str
    schema: pa.Schema
    doc: str

    @property
    def feature_names(self) -> tuple[str, ...]:
        """The feature columns (everything but the key and the timestamp)."""
        return tuple(
            n for n in self.schema.names if n not in (self.entity, EVENT_TIMESTAMP)
        )


def _meta(doc: str) -> dict[str, str]:
    return {"doc": doc}


def _schema(name: str, entity: str, features: list[pa.Field]) -> pa.Schema:
    return pa.schema(
        [
            pa.field(entity, pa.int64(), False, _meta("entity key")),
            pa.field(
                EVENT_TIMESTAMP,
                TIMESTAMP_TYPE,
                False,
                _meta("from when the row's values hold"),
            ),
            *features,
        ],
        metadata={"record": name, "schema_version": str(SCHEMA_VERSION)},
    )


def counter_names(entity: str) -> tuple[str, ...]:
    """The 9 counter columns of one entity, in registry order.

    Example:
        >>> counter_names("ad")[:2]
        ('ad_impression_count_1h', 'ad_impression_count_1d')
    """
    names = tuple(
        f"{entity}_{action}_count_{window}"
        for action in COUNTER_ACTIONS
        for window in COUNTER_WINDOWS
    )
    known = {f.name for f in DENSE_FEATURES}
    assert set(names) <= known, "counter names drifted from the registry"
    return names


def _sparse_fields(names: tuple[str, ...]) -> list[pa.Field]:
    by_name = {f.name: f for f in SPARSE_FEATURES}
    return [pa.field(n, pa.int64(), False, _meta(by_name[n].doc)) for n in names]


USER_PROFILE_FEATURES: Final = tuple(
    f.name
    for f in SPARSE_FEATURES
    if f.name.startswith("user_") and f.name != "user_id"
)
AD_PROFILE_FEATURES: Final = (
    "advertiser_id",
    "campaign_id",
    *(
        f.name
        for f in SPARSE_FEATURES
        if f.name.startswith("ad_") and f.name != "ad_id"
    ),
)

_DENSE_DOC: Final = {f.name: f.doc for f in DENSE_FEATURES}

_SEQUENCE_FIELDS: Final = [
    pa.field(
        "seq_event_time_ms",
        pa.list_(pa.int64()),
        False,
        _meta("epoch ms of each event, ascending"),
    ),
    *(f for f in TIMELINE_SCHEMA if f.name.startswith("seq_")),
]


def _build_tables() -> dict[str, FeatureTable]:
    tables = [
        FeatureTable(
            "user_profile",
            "user_id",
            _schema("user_profile", "user_id", _sparse_fields(USER_PROFILE_FEATURES)),
            "user attributes, one row per users-table version",
        ),
        FeatureTable(
            "ad_profile",
            "ad_id",
            _schema("ad_profile", "ad_id", _sparse_fields(AD_PROFILE_FEATURES)),
            "ad attributes, one row per ads-table version",
        ),
    ]
    for entity in COUNTER_ENTITIES:
        name = f"{entity}_counters"
        fields = [
            pa.field(n, pa.float32(), False, _meta(_DENSE_DOC[n]))
            for n in counter_names(entity)
        ]
        tables.append(
            FeatureTable(
                name,
                f"{entity}_id",
                _schema(name, f"{entity}_id", fields),
                f"{entity} counters at each ad event time of the {entity}",
            )
        )
    tables.append(
        FeatureTable(
            "user_sequence",
            "user_id",
            _schema("user_sequence", "user_id", _SEQUENCE_FIELDS),
            f"last {USER_SEQUENCE_LENGTH} events before the end of each active hour",
        )
    )
    return {t.name: t for t in tables}


FEATURE_TABLES: Final[Mapping[str, FeatureTable]] = MappingProxyType(_build_tables())
"""Every feature table by name, in the order above."""


def table_folder(features_dir: Path, name: str) -> Path:
    """The folder of table ``name``'s parts under a feature job's output."""
    return features_dir / "feature_tables" / name


def table_parts(folder: Path) -> list[Path]:
    """The Parquet parts of a table folder, in name order; names starting
    with ``.`` or ``_`` (a part being written) are not parts, as for Arrow's
    datasets."""
    return sorted(
        path
        for path in folder.glob("*.parquet")
        if not path.name.startswith((".", "_"))
    )


def read_feature_table(features_dir: Path, name: str) -> pa.Table:
    """Table ``name`` whole, in its schema, sorted by (entity, event_timestamp).

    An entity's rows all lie in one part, in that order, so a stable sort of
    the parts' rows keeps the order of rows with equal keys.

    Raises:
        FileNotFoundError: the folder holds no part.
    """
    spec = FEATURE_TABLES[name]
    folder = table_folder(features_dir, name)
    parts = table_parts(folder)
    if not parts:
        raise FileNotFoundError(f"no feature table {name!r}: no parts in {folder}")
    table = pa.concat_tables([pq.read_table(part).cast(spec.schema) for part in parts])
    return table.sort_by([(spec.entity, "ascending"), (EVENT_TIMESTAMP, "ascending")])
