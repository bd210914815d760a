"""A user's distinct events as a timeline, and the ``user_sequence`` snapshots.

- :func:`dedupe_events`: each ``event_id`` once (its winning copy,
  :mod:`features.duplicates`), in timeline order ``(user_id, event_time,
  event_id)``;
- :func:`build_timelines`: one :data:`~features.examples.TIMELINE_SCHEMA`
  row per user from those events;
- :func:`user_sequence_parts` / :func:`sequence_rows`: the ``user_sequence``
  feature rows (:mod:`features.feature_tables`), the last events strictly
  before a time, cut from timelines.

Numpy / Arrow over whole shards; shared by the batch and the streaming job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features import vocab
from features.examples import TIMELINE_SCHEMA
from features.feature_tables import FEATURE_TABLES, USER_SEQUENCE_LENGTH
from features.registry import sequence_item_key
from features.windows import window_positions
from pipelines.core.asof import asof_index, per_table
from pipelines.core.columns import IntArray, to_int64, vocabulary_codes
from pipelines.core.event_copies import winning_copies
from pipelines.core.ordering import timeline_order

HOUR_MS: Final = 3_600_000
USER_SEQUENCE_PART_ROWS: Final = 65_536


def dedupe_events(events: pa.Table) -> pa.Table:
    """Each event_id once, sorted by ``(user_id, event_time, event_id)``.

    The copy kept is the contract's winner among ``events``
    (:func:`~pipelines.core.event_copies.winning_copies`), so the result does not
    depend on the order batches arrived in.
    """
    keep = winning_copies(events)
    if keep.all():
        kept = events
        rows = None
    else:
        # The keys of the kept rows only; the table itself is gathered once,
        # by the composed permutation, instead of filtered and then sorted.
        rows = np.flatnonzero(keep)
        kept = events.select(["user_id", "event_time", "event_id"]).take(rows)
    order = timeline_order(
        [to_int64(kept.column("user_id")), to_int64(kept.column("event_time"))],
        kept.column("event_id"),
    )
    return events.take(pa.array(order if rows is None else rows[order]))


def event_categories(events: pa.Table, ads: pa.Table, contents: pa.Table) -> IntArray:
    """``seq_category`` of each event: the ad's declared creative category as
    of the event (ads table) or the content's category; 0 when unknown."""
    is_ad = np.asarray(
        pc.is_in(events.column("action"), value_set=pa.array(vocab.AD_ACTIONS))
    )
    # Each lookup only for the events it applies to (ad vs organic).
    ad_events = np.flatnonzero(is_ad)
    organic = np.flatnonzero(~is_ad)
    ad_rows = asof_index(ads, "ad_id", "updated_at").rows(
        to_int64(events.column("ad_id"), -1)[ad_events],
        to_int64(events.column("event_time"))[ad_events],
    )
    ad_codes = per_table(ads, "ad_categories", _category_codes("creative_category"))
    content_rows = asof_index(contents, "content_id", None).rows(
        to_int64(events.column("content_id"), -1)[organic],
        np.zeros(organic.size, np.int64),
    )
    content_codes = per_table(
        contents, "content_categories", _category_codes("content_category")
    )
    category = np.zeros(events.num_rows, dtype=np.int64)
    ad_hit = ad_rows >= 0
    category[ad_events[ad_hit]] = ad_codes[ad_rows[ad_hit]]
    content_hit = content_rows >= 0
    category[organic[content_hit]] = content_codes[content_rows[content_hit]]
    return category


def _category_codes(column: str) -> Callable[[pa.Table], IntArray]:
    def codes(table: pa.Table) -> IntArray:
        return vocabulary_codes(table.column(column), vocab.CATEGORIES)

    return codes


def user_offsets(users: IntArray) -> IntArray:
    """Offsets (U + 1) of the runs of equal users in a user-sorted array."""
    if users.size == 0:
        return np.zeros(1, dtype=np.int64)
    starts = np.flatnonzero(np.diff(users)) + 1
    return np.concatenate([[0], starts, [users.size]]).astype(np.int64)


def build_timelines(events: pa.Table, ads: pa.Table, contents: pa.Table) -> pa.Table:
    """One timeline row per user from distinct events in timeline order.

    Args:
        events: distinct valid events sorted by (user_id, event_time, event_id).
        ads: the ads table (for the as-of creative category).
        contents: the contents table.

    Returns:
        TIMELINE_SCHEMA, one row per user, in user order.
    """
    users = to_int64(events.column("user_id"))
    offsets = user_offsets(users)
    is_ad = np.asarray(
        pc.is_in(events.column("action"), value_set=pa.array(vocab.AD_ACTIONS))
    )
    values: dict[str, Any] = {
        "event_time": events.column("event_time").combine_chunks(),
        "seq_item_id": sequence_item_key(
            to_int64(events.column("ad_id")),
            to_int64(events.column("content_id")),
            is_ad,
        ),
        "seq_action": vocabulary_codes(events.column("action"), vocab.ACTIONS),
        "seq_domain": vocabulary_codes(events.column("domain"), vocab.DOMAINS),
        "seq_surface": vocabulary_codes(events.column("surface"), vocab.SURFACES),
        "seq_category": event_categories(events, ads, contents),
    }
    list_offsets = pa.array(offsets.astype(np.int32), pa.int32())
    arrays = [pa.array(users[offsets[:-1]], pa.int64())]
    for field in TIMELINE_SCHEMA:
        if field.name == "user_id":
            continue
        flat = pa.array(values[field.name], field.type.value_type)
        arrays.append(pa.ListArray.from_arrays(list_offsets, flat))
    return pa.Table.from_arrays(arrays, schema=TIMELINE_SCHEMA)


def user_sequences(timelines: pa.Table) -> pa.Table:
    """The ``user_sequence`` feature table rows of some users' timelines.

    One row per (user, UTC hour with an event of the user), at the end of the
    hour, with the last :data:`USER_SEQUENCE_LENGTH` events strictly before it,
    in (user, hour) order.
    """
    spec = FEATURE_TABLES["user_sequence"]
    parts = list(user_sequence_parts(timelines))
    return pa.concat_tables(parts) if parts else spec.schema.empty_table()


def user_sequence_parts(
    timelines: pa.Table, rows_per_part: int = USER_SEQUENCE_PART_ROWS
) -> Iterator[pa.Table]:
    """:func:`user_sequences` in consecutive parts of at most ``rows_per_part``
    rows (the whole table when concatenated), so a writer can write one part
    while the next is cut."""
    # One copy of the (chunked) timelines; each part's windows are then cut
    # from it without another, so the first part is ready (and its write
    # can start) before the later ones are cut.
    timelines = timelines.combine_chunks()
    times = timelines.column("event_time")
    times = times.chunk(0) if times.num_chunks == 1 else times.combine_chunks()
    flat_times = to_int64(times.values)
    lengths = np.diff(np.asarray(times.offsets.to_numpy(), dtype=np.int64))
    owner = np.repeat(np.arange(timelines.num_rows), lengths)
    hour_end = (flat_times // HOUR_MS + 1) * HOUR_MS
    # Distinct (user, hour) pairs; both arrays are sorted within each user.
    pair = np.ones(flat_times.size, dtype=bool)
    pair[1:] = (owner[1:] != owner[:-1]) | (hour_end[1:] != hour_end[:-1])
    rows, ends = owner[pair], hour_end[pair]
    users = to_int64(timelines.column("user_id"))[rows]
    # Events strictly before the hour's end: every event of the user up to the
    # last one of that hour (times ascend), i.e. the index of the next pair.
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    following = np.append(np.flatnonzero(pair)[1:], flat_times.size)
    cuts = following - starts[rows]
    # Rows in (user, hour) order whatever the timelines' row order (several
    # shards' timelines concatenated): ordering these few integer arrays
    # here is much cheaper than reordering the snapshots' list columns.
    by_user = np.argsort(users, kind="stable")
    users, ends, cuts = users[by_user], ends[by_user], cuts[by_user]
    for lo in range(0, users.size, max(1, rows_per_part)):
        hi = min(lo + rows_per_part, users.size)
        yield sequence_rows(users[lo:hi], ends[lo:hi], cuts[lo:hi], timelines)


def sequence_rows(
    users: IntArray, stamps_ms: IntArray, cuts: IntArray, timelines: pa.Table
) -> pa.Table:
    """``user_sequence`` rows: for each ``(user, stamp)``, the last
    :data:`USER_SEQUENCE_LENGTH` events of the user's timeline before index
    ``cut`` (the events strictly before the stamp).

    Args:
        users: each row's user.
        stamps_ms: each row's ``event_timestamp`` (epoch ms).
        cuts: how many of the user's timeline events precede it.
        timelines: TIMELINE_SCHEMA rows holding every user named.
    """
    spec = FEATURE_TABLES["user_sequence"]
    positions, offsets, columns = window_positions(
        users, cuts, timelines, USER_SEQUENCE_LENGTH
    )
    take = pa.array(positions, pa.int64())
    list_offsets = pa.array(offsets.astype(np.int32), pa.int32())
    time_type = spec.schema.field("event_timestamp").type
    arrays: list[pa.Array] = [
        pa.array(users, pa.int64()),
        pa.array(stamps_ms, pa.int64()).cast(time_type),
    ]
    for field in spec.schema:
        if field.name in ("user_id", "event_timestamp"):
            continue
        source = "event_time" if field.name == "seq_event_time_ms" else field.name
        values = columns[source].take(take)
        if source == "event_time":
            values = values.cast(pa.int64())
        flat = values.cast(field.type.value_type)
        arrays.append(pa.ListArray.from_arrays(list_offsets, flat))
    return pa.Table.from_arrays(arrays, schema=spec.schema)
