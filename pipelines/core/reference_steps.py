"""The reference's steps: each one rule of :mod:`features.examples`, vectorized.

Plain pyarrow / pandas / numpy, written for clarity, no per-event Python;
:func:`pipelines.core.reference.build_reference` runs them in order. Choices
the spec leaves open, fixed here (the Beam jobs follow them):

- Validation comes first; duplicates are removed among *valid* rows: each
  ``event_id`` keeps its winning copy, the first in ``(event_time, user_id,
  digest)`` order, whatever user or file each copy came under
  (:mod:`features.duplicates`).
- "Distinct time order" is ``(event_time, event_id)``, event ids compared
  byte-wise (UTF-8, which is code point order).
- Labels: clicks / conversions are matched on ``impression_id`` alone (any
  user); one in the window is enough.
- As-of joins: ``updated_at <= t``; when an entity has two rows with the same
  ``updated_at`` the later row of the table wins. ``ad_creative_category`` is
  as of the impression; a timeline's ``seq_category`` as of each event for ad
  events, and from the contents table (no versions) for organic ones.
- Counter windows ``1h`` / ``1d`` / ``7d`` are 3,600,000 / 86,400,000 /
  604,800,000 ms; an entity's events are its ad events (impression, click,
  conversion) whose ``user_id`` / ``ad_id`` / ``advertiser_id`` is it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features import vocab
from features.events import SCHEMA_VERSION
from features.examples import TIMELINE_SCHEMA, training_example_schema
from features.feature_tables import (
    AD_PROFILE_FEATURES,
    EVENT_TIMESTAMP,
    FEATURE_TABLES,
    USER_PROFILE_FEATURES,
)
from features.fields import TIMESTAMP_TYPE
from features.registry import (
    COUNTER_ACTIONS,
    COUNTER_ENTITIES,
    sequence_item_key,
)
from pipelines.core.columns import to_int64, vocabulary_codes
from pipelines.core.counters import WINDOWS_MS, named_counts
from pipelines.core.event_copies import winning_copies
from pipelines.core.examples import (
    LABEL_WINDOWS_MS,
    ad_attribute_codes,
    user_attribute_codes,
)
from pipelines.core.ordering import timeline_order
from pipelines.core.timelines import sequence_rows
from pipelines.core.window_counter import WindowCounter

I64 = npt.NDArray[np.int64]

HOUR_MS: Final = 3_600_000
DAY_MS: Final = 86_400_000


def _as_of(key: I64, time_ms: I64, table: pd.DataFrame, key_name: str) -> pd.DataFrame:
    """The latest row of ``table`` with ``updated_at <= time_ms`` per query.

    Args:
        key, time_ms: (Q,) the queries.
        table: dimension rows with ``key_name``, ``updated_at`` (ms) and int
            attribute columns, in table order.
        key_name: the join key.

    Returns:
        (Q,) rows of the attribute columns, in query order; 0 where none.
    """
    left = pd.DataFrame({key_name: key, "t": time_ms, "_q": np.arange(key.size)})
    left = left.sort_values("t", kind="stable")
    # Stable sort: among equal updated_at, the later table row comes later,
    # and merge_asof takes the last match.
    right = table.sort_values("updated_at", kind="stable")
    joined = pd.merge_asof(
        left,
        right,
        left_on="t",
        right_on="updated_at",
        by=key_name,
        direction="backward",
        allow_exact_matches=True,
    )
    columns = [c for c in table.columns if c not in (key_name, "updated_at")]
    out = joined.sort_values("_q")[columns].fillna(0).astype(np.int64)
    return out.reset_index(drop=True)


def user_attribute_frame(users: pa.Table) -> pd.DataFrame:
    """Users table rows with the example's user sparse ids (table order)."""
    return pd.DataFrame(
        {
            "user_id": to_int64(users.column("user_id")),
            "updated_at": to_int64(users.column("updated_at")),
            **user_attribute_codes(users),
        }
    )


def ad_attribute_frame(ads: pa.Table) -> pd.DataFrame:
    """Ads table rows with the ad profile's ids (table order)."""
    return pd.DataFrame(
        {
            "ad_id": to_int64(ads.column("ad_id")),
            "updated_at": to_int64(ads.column("updated_at")),
            **ad_attribute_codes(ads),
        }
    )


@dataclass(frozen=True)
class DistinctEvents:
    """Distinct valid events sorted by (event_time, event_id), as arrays."""

    table: pa.Table  # EVENT_SCHEMA rows, sorted
    time: I64
    user: I64
    action: I64  # vocab.ACTIONS id
    ad: I64  # 0 for organic events (use is_ad)
    advertiser: I64
    is_ad: npt.NDArray[np.bool_]

    def entity(self, name: str) -> I64:
        """The user / ad / advertiser id column."""
        return {"user": self.user, "ad": self.ad, "advertiser": self.advertiser}[name]


def distinct_events(valid: pa.Table) -> DistinctEvents:
    """Each event_id once (its winning copy), in distinct time order."""
    keep = winning_copies(valid)
    distinct = valid if keep.all() else valid.filter(pa.array(keep))
    # Integer sort on time; only events with equal times compare their ids.
    order = timeline_order(
        [to_int64(distinct.column("event_time"))], distinct["event_id"]
    )
    table = distinct.take(pa.array(order))
    action = vocabulary_codes(table.column("action"), vocab.ACTIONS)
    return DistinctEvents(
        table=table,
        time=to_int64(table.column("event_time")),
        user=to_int64(table.column("user_id")),
        action=action,
        ad=to_int64(table.column("ad_id")),
        advertiser=to_int64(table.column("advertiser_id")),
        is_ad=action <= len(vocab.AD_ACTIONS),
    )


ACTION_ID: Final = vocab.vocabulary_ids(vocab.ACTIONS)


def _labels(
    events: DistinctEvents, impressions: I64
) -> dict[str, npt.NDArray[np.int8]]:
    """label_<objective> per impression (rows ``impressions`` of ``events``)."""
    impression_ids = events.table.column("event_id").take(pa.array(impressions))
    labels = {}
    for objective, window in LABEL_WINDOWS_MS.items():
        rows = np.flatnonzero(events.action == ACTION_ID[objective])
        target = pc.index_in(
            events.table.column("impression_id").take(pa.array(rows)),
            value_set=impression_ids,
        )
        which = to_int64(target, -1)
        matched = which >= 0
        delay = events.time[rows[matched]] - events.time[impressions[which[matched]]]
        hit = which[matched][(delay >= 0) & (delay < window)]
        label = np.zeros(impressions.size, dtype=np.int8)
        label[hit] = 1
        labels[f"label_{objective}"] = label
    return labels


def window_counters(events: DistinctEvents) -> dict[str, WindowCounter]:
    """Per entity kind, the windowed counts of its ad events (by action)."""
    code = np.zeros(events.action.size, dtype=np.int64)
    for number, action in enumerate(COUNTER_ACTIONS, start=1):
        code[events.action == ACTION_ID[action]] = number
    ad = events.is_ad
    return {
        entity: WindowCounter(
            events.entity(entity)[ad],
            events.time[ad],
            code[ad],
            len(COUNTER_ACTIONS),
            WINDOWS_MS,
        )
        for entity in COUNTER_ENTITIES
    }


def _timeline_cut(events: DistinctEvents, user: I64, time_ms: I64) -> I64:
    """Events of each user (any action) strictly before each time."""
    every = WindowCounter(events.user, events.time, np.ones_like(events.user), 1, ())
    return every.before(user, time_ms)[0]


def timelines_of(
    events: DistinctEvents, ad_attributes: pd.DataFrame, contents: pa.Table
) -> tuple[pa.Table, I64]:
    """TIMELINE_SCHEMA rows (sorted by user) and each event's timeline order.

    Returns:
        ``(timelines, order)``: ``order`` sorts events by (user, time, id).
    """
    table = events.table
    content = to_int64(table.column("content_id"))
    # seq_category: ads as of the event (declared category); contents by id.
    ad_category = _as_of(
        events.ad,
        events.time,
        ad_attributes[["ad_id", "updated_at", "ad_creative_category"]],
        "ad_id",
    )["ad_creative_category"].to_numpy()
    content_ids = to_int64(contents.column("content_id"))
    content_category = vocabulary_codes(
        contents.column("content_category"), vocab.CATEGORIES
    )
    # The contents table has no versions: the last row of an id wins. A
    # trailing 0 is what an unknown id (position -1) reads.
    ids, last = np.unique(content_ids[::-1], return_index=True)
    categories = np.append(content_category[::-1][last], 0)
    where = to_int64(pc.index_in(pa.array(content), value_set=pa.array(ids)), -1)
    organic_category = categories[where]
    category = np.where(events.is_ad, ad_category, organic_category)
    per_event = {
        "seq_item_id": sequence_item_key(events.ad, content, events.is_ad),
        "seq_action": events.action,
        "seq_domain": vocabulary_codes(table.column("domain"), vocab.DOMAINS),
        "seq_surface": vocabulary_codes(table.column("surface"), vocab.SURFACES),
        "seq_category": category,
    }
    # Events are in (time, id) order already; a stable sort by user keeps it.
    order = np.argsort(events.user, kind="stable")
    sorted_users = events.user[order]
    starts = np.flatnonzero(np.diff(sorted_users, prepend=sorted_users[:1] - 1))
    users = sorted_users[starts]
    offsets = pa.array(np.append(starts, order.size).astype(np.int32), pa.int32())
    arrays: list[pa.Array] = [pa.array(users, pa.int64())]
    for field in TIMELINE_SCHEMA:
        if field.name == "user_id":
            continue
        if field.name == "event_time":
            values = pa.array(events.time[order], pa.int64()).cast(TIMESTAMP_TYPE)
        else:
            values = pa.array(per_event[field.name][order], field.type.value_type)
        arrays.append(pa.ListArray.from_arrays(offsets, values))
    return pa.Table.from_arrays(arrays, schema=TIMELINE_SCHEMA), order


def examples_of(
    events: DistinctEvents,
    user_attributes: pd.DataFrame,
    ad_attributes: pd.DataFrame,
    counters: Mapping[str, WindowCounter],
) -> pa.Table:
    """One training example per distinct impression, sorted by example_id."""
    table = events.table
    imp = np.flatnonzero(events.action == ACTION_ID["impression"])
    rows = table.take(pa.array(imp))
    t, user = events.time[imp], events.user[imp]
    columns: dict[str, npt.ArrayLike | pa.Array | pa.ChunkedArray] = {
        "schema_version": np.full(imp.size, SCHEMA_VERSION, dtype=np.int16),
        "example_id": rows.column("event_id"),
        "event_time": rows.column("event_time"),
        "user_id": user,
        "ad_id": events.ad[imp],
        "advertiser_id": events.advertiser[imp],
        "campaign_id": to_int64(rows.column("campaign_id")),
    }
    columns |= _labels(events, imp)
    user_attrs = _as_of(user, t, user_attributes, "user_id")
    for name in USER_PROFILE_FEATURES:
        columns[name] = user_attrs[name].to_numpy()
    ad_attrs = _as_of(
        events.ad[imp],
        t,
        ad_attributes[["ad_id", "updated_at", "ad_creative_category"]],
        "ad_id",
    )
    columns["ad_format"] = vocabulary_codes(rows.column("ad_format"), vocab.AD_FORMATS)
    columns["ad_objective"] = vocabulary_codes(
        rows.column("objective"), vocab.AD_OBJECTIVES
    )
    columns["ad_creative_category"] = ad_attrs["ad_creative_category"].to_numpy()
    columns["domain"] = vocabulary_codes(rows.column("domain"), vocab.DOMAINS)
    columns["surface"] = vocabulary_codes(rows.column("surface"), vocab.SURFACES)
    columns["hour_of_day"] = (t // HOUR_MS) % 24 + 1
    for entity in COUNTER_ENTITIES:
        counts = counters[entity].count(events.entity(entity)[imp], t)
        columns |= named_counts(entity, counts)
    columns["timeline_cut"] = _timeline_cut(events, user, t)
    schema = training_example_schema()
    examples = pa.Table.from_arrays(
        [pa.array(columns[f.name], f.type) for f in schema], schema=schema
    )
    return examples.take(
        pc.sort_indices(examples, sort_keys=[("example_id", "ascending")])
    )


def _frame_table(frame: pd.DataFrame, name: str) -> pa.Table:
    """A feature table from a frame holding its columns (times in ms)."""
    spec = FEATURE_TABLES[name]
    frame = frame.sort_values([spec.entity, EVENT_TIMESTAMP], kind="stable")
    arrays = []
    for field in spec.schema:
        values = frame[field.name].to_numpy()
        if field.name == EVENT_TIMESTAMP:
            arrays.append(pa.array(values, pa.int64()).cast(TIMESTAMP_TYPE))
        else:
            arrays.append(pa.array(values, field.type))
    return pa.Table.from_arrays(arrays, schema=spec.schema)


def _counter_table(counter: WindowCounter, entity: str) -> pa.Table:
    """``<entity>_counters``: a row at each distinct ad event time of the entity."""
    key, time_ms = counter.point_entities()
    frame = pd.DataFrame(
        {
            f"{entity}_id": key,
            EVENT_TIMESTAMP: time_ms,
            **named_counts(entity, counter.count_at_points()),
        }
    )
    return _frame_table(frame, f"{entity}_counters")


def _user_sequence_table(events: DistinctEvents, timelines: pa.Table) -> pa.Table:
    """``user_sequence``: last events before the end of each active (user, hour)."""
    points = pd.DataFrame(
        {"user_id": events.user, "hour_end": (events.time // HOUR_MS + 1) * HOUR_MS}
    ).drop_duplicates()
    points = points.sort_values(["user_id", "hour_end"]).reset_index(drop=True)
    user, hour_end = points["user_id"].to_numpy(), points["hour_end"].to_numpy()
    cut = _timeline_cut(events, user, hour_end)
    return sequence_rows(user, hour_end, cut, timelines)


def feature_tables_of(
    events: DistinctEvents,
    timelines: pa.Table,
    user_attributes: pd.DataFrame,
    ad_attributes: pd.DataFrame,
    counters: Mapping[str, WindowCounter],
) -> dict[str, pa.Table]:
    """Every feature table (:mod:`features.feature_tables`), by name."""
    users = user_attributes.rename(columns={"updated_at": EVENT_TIMESTAMP})
    ads = ad_attributes.rename(columns={"updated_at": EVENT_TIMESTAMP})
    tables = {
        "user_profile": _frame_table(
            users[["user_id", EVENT_TIMESTAMP, *USER_PROFILE_FEATURES]], "user_profile"
        ),
        "ad_profile": _frame_table(
            ads[["ad_id", EVENT_TIMESTAMP, *AD_PROFILE_FEATURES]], "ad_profile"
        ),
    }
    for entity in COUNTER_ENTITIES:
        tables[f"{entity}_counters"] = _counter_table(counters[entity], entity)
    tables["user_sequence"] = _user_sequence_table(events, timelines)
    return tables
