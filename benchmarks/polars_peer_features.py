"""The Polars peer's feature steps: from valid events to every output table.

Each step is one rule of :mod:`features.examples` (the spec) written as
Polars expressions, in the same terms as the reference
(:mod:`pipelines.core.reference_steps`):

- dedupe (:func:`distinct_events`): the winning copy of each ``event_id``,
  the first in ``(event_time, user_id, digest)`` order; the digest
  (:func:`features.duplicates.copy_digests`, a SHA-256 of the canonical wire
  bytes) is taken only of copies that tie on time and user and still differ;
- timelines: one ``group_by`` of the events in ``(user, time, id)`` order;
  ``seq_category`` by ``join_asof`` on the ads table (ad events) and a join
  on the contents table (organic ones);
- counters: per entity, the ad events' counts per ``(entity, time)`` and
  ``rolling`` windows closed on the left (``[t - w, t)``); the feature
  tables are those rows, and an example's counters are the row at its own
  impression time;
- labels: a join of clicks / conversions to impressions on
  ``impression_id``; user and ad attributes by ``join_asof``;
- ``user_sequence``: the last events before each active hour's end: each
  snapshot's rows of the timeline-ordered events (``int_ranges``, exploded),
  gathered and grouped back into lists.

``user_location`` is :func:`features.registry.string_bucket` (FNV-1a, a numpy
kernel over the string bytes, which Polars has no expression for), applied to
the users table only.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from benchmarks.polars_peer_rules import TIME_MS
from features import vocab
from features.duplicates import copy_digests
from features.events import EVENT_COLUMNS, EVENT_SCHEMA, SCHEMA_VERSION
from features.examples import TIMELINE_SCHEMA, training_example_schema
from features.feature_tables import (
    AD_PROFILE_FEATURES,
    EVENT_TIMESTAMP,
    FEATURE_TABLES,
    USER_PROFILE_FEATURES,
    USER_SEQUENCE_LENGTH,
    counter_names,
)
from features.registry import (
    COUNTER_ACTIONS,
    COUNTER_ENTITIES,
    SPARSE_FEATURES,
    string_bucket,
)
from pipelines.core.counters import WINDOWS_MS
from pipelines.core.examples import LABEL_WINDOWS_MS

HOUR_MS: Final = 3_600_000
T: Final = TIME_MS
"""Epoch ms of ``event_time`` (or ``updated_at``), the key of every join."""

_LOCATION_BUCKETS: Final = next(
    f.num_embeddings for f in SPARSE_FEATURES if f.name == "user_location"
)


def codes(name: str, vocabulary: tuple[str, ...]) -> pl.Expr:
    """1-based vocabulary id of each value (0: null or unknown)."""
    return (
        pl.col(name)
        .replace_strict(
            list(vocabulary),
            list(range(1, len(vocabulary) + 1)),
            default=0,
            return_dtype=pl.Int64,
        )
        .fill_null(0)
    )


def _is_ad() -> pl.Expr:
    return pl.col("action").is_in(list(vocab.AD_ACTIONS))


# --- dedupe ------------------------------------------------------------------


def distinct_events(valid: pl.DataFrame) -> pl.DataFrame:
    """Each event_id once (its winning copy), sorted by (event_time, event_id)."""
    copies = pl.col("event_id").is_duplicated()
    # Only the few ids with copies are looked at; the rest pass as they are.
    multi = valid.with_row_index("_row").filter(copies)
    # The copies tied with an id's first on (time, user); identical ones are one.
    first = multi.filter(pl.col(T) == pl.col(T).min().over("event_id"))
    first = first.filter(pl.col("user_id") == pl.col("user_id").min().over("event_id"))
    lead = first.unique(subset=list(EVENT_COLUMNS), keep="first", maintain_order=True)
    conflicted = lead.filter(copies)
    if conflicted.height:
        arrow = conflicted.select(EVENT_COLUMNS).to_arrow().cast(EVENT_SCHEMA)
        won = (
            conflicted.with_columns(_digest=pl.Series(copy_digests(arrow)))
            .sort("_digest")
            .unique("event_id", keep="first")
            .drop("_digest")
        )
        lead = pl.concat([lead.filter(~copies), won])
    winners = lead.get_column("_row").implode()
    keep = ~copies | pl.int_range(pl.len(), dtype=pl.UInt32).is_in(winners)
    return valid.filter(keep).sort([T, "event_id"])


# --- timelines ---------------------------------------------------------------


def ad_frame(ads: pl.DataFrame) -> pl.DataFrame:
    """Ads table rows with the ad profile's ids, in table order."""
    # Ids and times as the reference reads them: a null is 0.
    return ads.select(
        pl.col("ad_id").fill_null(0),
        pl.col("updated_at").dt.epoch("ms").fill_null(0).alias(T),
        pl.col("advertiser_id").fill_null(0),
        pl.col("campaign_id").fill_null(0),
        codes("ad_format", vocab.AD_FORMATS).alias("ad_format"),
        codes("objective", vocab.AD_OBJECTIVES).alias("ad_objective"),
        codes("creative_category", vocab.CATEGORIES).alias("ad_creative_category"),
    )


def user_frame(users: pl.DataFrame) -> pl.DataFrame:
    """Users table rows with the example's user sparse ids, in table order."""
    age = pl.col("age").fill_null(-1)
    location = string_bucket(users.get_column("location").to_arrow(), _LOCATION_BUCKETS)
    return users.select(
        pl.col("user_id").fill_null(0),
        pl.col("updated_at").dt.epoch("ms").fill_null(0).alias(T),
        # age_bucket(): the number of bounds at or below the age.
        pl.sum_horizontal(
            [(age >= b).cast(pl.Int64) for b in vocab.AGE_BUCKET_BOUNDS]
        ).alias("user_age_bucket"),
        codes("gender", vocab.GENDERS).alias("user_gender"),
        pl.Series("user_location", location),
        codes("device", vocab.DEVICES).alias("user_device"),
    )


def as_of(
    queries: pl.DataFrame, table: pl.DataFrame, key: str, columns: list[str]
) -> pl.DataFrame:
    """``queries`` (in ``T`` order) with ``columns`` of the latest row of
    ``table`` per ``key`` with time <= the query's (0 where none); of rows
    with the same time, the later one of the table."""
    right = table.select(key, pl.col(T).alias("_at"), *columns).sort(
        "_at", maintain_order=True
    )
    joined = queries.sort(T, maintain_order=True).join_asof(
        right,
        left_on=T,
        right_on="_at",
        by=key,
        strategy="backward",
        # Both sides are sorted on time just above; Polars cannot check it
        # within ``by`` groups, and warns.
        check_sortedness=False,
    )
    return joined.drop("_at").with_columns(pl.col(columns).fill_null(0))


def timeline_events(
    distinct: pl.DataFrame, ads: pl.DataFrame, contents: pl.DataFrame
) -> pl.DataFrame:
    """Distinct events in (user, time, id) order with their ``seq_*`` values
    and ``_pos``, each one's index in its user's timeline.

    Args:
        distinct: :func:`distinct_events` (in time order, as ``join_asof``
            wants it).
        ads: :func:`ad_frame`.
        contents: the contents table.
    """
    # seq_category: an ad's as of the event; a content's by id (the table has
    # no versions: the last row of an id wins); organic events match no ad.
    content = contents.select(
        pl.col("content_id").fill_null(0),
        codes("content_category", vocab.CATEGORIES).alias("_content_category"),
    ).unique("content_id", keep="last")
    categorized = (
        as_of(distinct, ads, "ad_id", ["ad_creative_category"])
        .rename({"ad_creative_category": "_ad_category"})
        .join(content, on="content_id", how="left", maintain_order="left")
    )
    ad = _is_ad()
    ordered = categorized.sort(["user_id", T, "event_id"])
    return ordered.with_columns(
        seq_item_id=pl.when(ad)
        .then(2 * pl.col("ad_id"))
        .otherwise(2 * pl.col("content_id") + 1),
        seq_action=codes("action", vocab.ACTIONS),
        seq_domain=codes("domain", vocab.DOMAINS),
        seq_surface=codes("surface", vocab.SURFACES),
        seq_category=pl.when(ad)
        .then(pl.col("_ad_category"))
        .otherwise(pl.col("_content_category").fill_null(0)),
        _pos=pl.int_range(pl.len()).over("user_id"),
    ).drop("_ad_category", "_content_category")


def timelines_of(events: pl.DataFrame) -> pl.DataFrame:
    """TIMELINE_SCHEMA rows, one per user, sorted by user_id."""
    values = [f.name for f in TIMELINE_SCHEMA if f.name != "user_id"]
    return events.group_by("user_id", maintain_order=True).agg(values)


# --- counters ----------------------------------------------------------------


def counter_tables(distinct: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """``<entity>_counters``: each entity's 9 counters at each distinct time
    of its ad events, sorted by (entity, time)."""
    ads = distinct.filter(_is_ad())
    tables = {}
    for entity in COUNTER_ENTITIES:
        key = f"{entity}_id"
        points = (
            ads.group_by(key, T)
            .agg((pl.col("action") == a).sum().alias(a) for a in COUNTER_ACTIONS)
            .sort(key, T)
        )
        sums = {}
        for window in WINDOWS_MS:
            # [t - window, t) at every point; Polars orders groups as it likes,
            # so the rows go back to (entity, time) order.
            rolled = (
                points.rolling(T, period=f"{window}i", closed="left", group_by=key)
                .agg(pl.col(a).sum() for a in COUNTER_ACTIONS)
                .sort(key, T)
            )
            sums |= {(a, window): rolled.get_column(a) for a in COUNTER_ACTIONS}
        names = iter(counter_names(entity))
        tables[entity] = points.select(key, T).with_columns(
            sums[a, w].cast(pl.Float32).alias(next(names))
            for a in COUNTER_ACTIONS
            for w in WINDOWS_MS
        )
    return tables


# --- examples ----------------------------------------------------------------


def _labels(distinct: pl.DataFrame, impressions: pl.DataFrame) -> list[pl.Expr]:
    """label_<objective> of each impression (by ``event_id``)."""
    labels = []
    for objective, window in LABEL_WINDOWS_MS.items():
        follow = distinct.filter(pl.col("action") == objective).select(
            "impression_id", pl.col(T).alias("_follow")
        )
        hits = (
            follow.join(
                impressions.select("event_id", T),
                left_on="impression_id",
                right_on="event_id",
            )
            .filter(pl.col("_follow") - pl.col(T) >= 0)
            .filter(pl.col("_follow") - pl.col(T) < window)
            .get_column("impression_id")
            .unique()
        )
        labels.append(
            pl.col("event_id")
            .is_in(hits.implode())
            .cast(pl.Int8)
            .alias(f"label_{objective}")
        )
    return labels


def examples_of(
    events: pl.DataFrame,
    users: pl.DataFrame,
    ads: pl.DataFrame,
    counters: dict[str, pl.DataFrame],
) -> pl.DataFrame:
    """One training example per distinct impression, sorted by example_id.

    Args:
        events: :func:`timeline_events` (``_pos`` gives the timeline cut).
        users, ads: :func:`user_frame`, :func:`ad_frame`.
        counters: :func:`counter_tables`.
    """
    # timeline_cut: the user's events before the first one at this time, the
    # position where each (user, time) run of the timeline order starts.
    starts = (pl.col("user_id") != pl.col("user_id").shift()) | (
        pl.col(T) != pl.col(T).shift()
    )
    cut = (
        pl.when(starts.fill_null(True))
        .then(pl.col("_pos"))
        .forward_fill()
        .alias("timeline_cut")
    )
    imps = events.with_columns(cut).filter(pl.col("action") == "impression")
    imps = imps.with_columns(_labels(events, imps))
    imps = as_of(imps, users, "user_id", list(USER_PROFILE_FEATURES))
    imps = as_of(imps, ads, "ad_id", ["ad_creative_category"])
    for entity in COUNTER_ENTITIES:
        key = f"{entity}_id"
        imps = imps.join(counters[entity], on=[key, T], how="left")
    imps = imps.with_columns(
        schema_version=pl.lit(SCHEMA_VERSION, pl.Int16),
        example_id=pl.col("event_id"),
        ad_format=codes("ad_format", vocab.AD_FORMATS),
        ad_objective=codes("objective", vocab.AD_OBJECTIVES),
        domain=codes("domain", vocab.DOMAINS),
        surface=codes("surface", vocab.SURFACES),
        hour_of_day=(pl.col(T) // HOUR_MS) % 24 + 1,
    )
    return imps.select(training_example_schema().names).sort("example_id")


# --- feature tables ----------------------------------------------------------


def user_sequence_of(events: pl.DataFrame) -> pl.DataFrame:
    """``user_sequence``: the last events before the end of each active
    (user, hour), sorted by (user, hour end).

    Args:
        events: :func:`timeline_events`.
    """
    events = events.with_columns(_at=pl.int_range(pl.len()))
    # Each snapshot's window, as rows [_start, _end) of ``events``: the
    # user's events up to the last one in the hour, at most the last
    # USER_SEQUENCE_LENGTH of them.
    hour_end = ((pl.col(T) // HOUR_MS + 1) * HOUR_MS).alias(T)
    snapshots = (
        events.group_by("user_id", hour_end)
        .agg(
            _end=pl.col("_at").max() + 1,
            _first=(pl.col("_at") - pl.col("_pos")).first(),
        )
        .sort("user_id", T)
        .with_columns(
            _start=pl.max_horizontal(
                pl.col("_end") - USER_SEQUENCE_LENGTH, pl.col("_first")
            )
        )
    )
    # A snapshot's hour holds an event of the user: no window is empty, so
    # every snapshot has rows below and keeps its place in the group_by.
    rows = snapshots.select(
        pl.int_range(pl.len()).alias("_snapshot"),
        pl.int_ranges("_start", "_end").alias("_row"),
    ).explode("_row")
    names = [f.name for f in TIMELINE_SCHEMA if f.name.startswith("seq_")]
    values = events.select(
        pl.col("event_time").dt.epoch("ms").alias("seq_event_time_ms"), *names
    )[rows.get_column("_row")]
    lists = (
        values.with_columns(rows.get_column("_snapshot"))
        .group_by("_snapshot", maintain_order=True)
        .agg(pl.all())
        .drop("_snapshot")
    )
    return snapshots.select("user_id", pl.col(T).alias(EVENT_TIMESTAMP)).hstack(lists)


def profile_table(frame: pl.DataFrame, name: str) -> pl.DataFrame:
    """``user_profile`` / ``ad_profile`` from :func:`user_frame` /
    :func:`ad_frame`, sorted (stably) by (entity, event_timestamp)."""
    spec = FEATURE_TABLES[name]
    features = USER_PROFILE_FEATURES if name == "user_profile" else AD_PROFILE_FEATURES
    return frame.select(spec.entity, pl.col(T).alias(EVENT_TIMESTAMP), *features).sort(
        spec.entity, EVENT_TIMESTAMP, maintain_order=True
    )
