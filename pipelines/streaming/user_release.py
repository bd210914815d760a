"""What a user shard releases: examples when due, online rows when touched.

The computations of :class:`~pipelines.streaming.user_state.UserShardFn`,
without Beam: given the shard's state (its events, the evicted counts, the
entity answers and the id stage's notices), :func:`release_user_shard`
builds the training examples due at a timer with the batch job's own
functions (same features, same labels) and compacts the state;
:func:`user_push_rows` builds the online rows of the users a batch touched.

Release rule (event time): an impression at ``t`` is final when the label
window and the allowed lateness have passed, ``due = ceil(t + window +
lateness, granularity)`` (:func:`due_times`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.examples import TIMELINE_SEGMENT_SCHEMA
from features.windows import timeline_segments
from pipelines.core.columns import IntArray, to_int64
from pipelines.core.counters import (
    ENTITY_KINDS,
    counter_action_codes,
    counter_table,
    entity_counters,
)
from pipelines.core.event_copies import ID_PROJECTION_SCHEMA, drop_losing_copies
from pipelines.core.examples import EXAMPLE_SCHEMA, example_bases, table_of
from pipelines.core.timelines import build_timelines, dedupe_events, sequence_rows
from pipelines.streaming.config import COUNTER_HORIZON_MS, LABEL_WINDOW_MS, StreamConfig
from pipelines.streaming.event_ids import compact_winners
from pipelines.streaming.tables import DROPPED_SCHEMA, answer_schema, ceil_to, times_ms


@dataclass(frozen=True)
class Dimensions:
    """The users / ads / contents tables (loaded once per worker)."""

    users: pa.Table
    ads: pa.Table
    contents: pa.Table


@dataclass(frozen=True)
class UserRelease:
    """What one release of a user shard produces.

    Attributes:
        examples: training examples (contract schema), in timeline order.
        segments: TIMELINE_SEGMENT_SCHEMA rows their windows need.
        events: the events state, compacted when the release was asked to.
        dropped: the updated evicted counts.
        answers: entity answers still pending, by kind.
        next_due: the earliest due time still pending, or None.
        winners: the id stage's notices still needed.
    """

    examples: pa.Table
    segments: pa.Table
    events: pa.Table
    dropped: pa.Table
    answers: dict[str, pa.Table]
    next_due: int | None
    winners: pa.Table


def due_times(times: IntArray, config: StreamConfig) -> IntArray:
    """When impressions at ``times`` are final (see the module docstring)."""
    return ceil_to(
        times + LABEL_WINDOW_MS + config.allowed_lateness_ms, config.granularity_ms
    )


def by_due_time(
    examples: pa.Table, segments: pa.Table, config: StreamConfig
) -> list[tuple[int, pa.Table, pa.Table]]:
    """A release's examples split by due time, each with the segments its
    windows need: ``(due, examples, segments)``, earliest first. A release
    covers several due times when a later timer fired first."""
    due = due_times(times_ms(examples), config)
    times = np.unique(due).tolist()
    if len(times) == 1:
        return [(int(times[0]), examples, segments)]
    parts = []
    for time in times:
        part = examples.filter(pa.array(due == time))
        parts.append(
            (int(time), part, timeline_segments(part, segments, config.max_seq_len))
        )
    return parts


def _per_user(users: IntArray, table: pa.Table) -> IntArray:
    """``dropped`` of each user (0 when absent)."""
    if table.num_rows == 0:
        return np.zeros(users.size, dtype=np.int64)
    known = to_int64(table.column("user_id"))
    counts = to_int64(table.column("dropped"))
    order = np.argsort(known)
    known, counts = known[order], counts[order]
    at = np.minimum(np.searchsorted(known, users), known.size - 1)
    return np.where(known[at] == users, counts[at], 0)


def _user_counters(
    events: pa.Table, query_users: IntArray, query_times: IntArray
) -> dict[str, np.ndarray]:
    """The user counters of each query, from the users' distinct ``events``."""
    codes = counter_action_codes(events.column("action"))
    ad = codes > 0
    ad_rows = events.filter(pa.array(ad))
    return entity_counters(
        "user",
        to_int64(ad_rows.column("user_id")),
        times_ms(ad_rows),
        codes[ad],
        query_users,
        query_times,
    )


def _join_answers(
    examples: pa.Table, answers: dict[str, pa.Table]
) -> dict[str, np.ndarray]:
    """The ad and advertiser counters of each example, from the answers."""
    out: dict[str, np.ndarray] = {}
    ids = examples.column("example_id")
    for kind in ENTITY_KINDS:
        table = answers[kind]
        where = to_int64(pc.index_in(ids, value_set=table.column("example_id")), -1)
        if np.any(where < 0):
            missing = ids.take(pa.array(np.flatnonzero(where < 0)[:3])).to_pylist()
            raise ValueError(
                f"no {kind} counters for examples {missing}: the entity stage "
                "must answer before the user stage releases (a watermark bug)"
            )
        for name in answer_schema(kind).names[1:]:
            out[name] = table.column(name).combine_chunks().to_numpy()[where]
    return out


def release_user_shard(
    events: pa.Table,
    dropped: pa.Table,
    answers: dict[str, pa.Table],
    *,
    released_until: int,
    fire: int,
    dims: Dimensions,
    config: StreamConfig,
    winners: pa.Table | None = None,
    compact: bool = True,
) -> UserRelease:
    """Examples of the impressions due in ``(released_until, fire]``, and the
    state that remains.

    Args:
        events: the shard's events state (STREAM_EVENT_SCHEMA, copies allowed).
        dropped: evicted counts per user (DROPPED_SCHEMA).
        answers: kind -> entity answers received (``answer_schema(kind)``).
        released_until: due time of the previous release.
        fire: due time of this release (the timer's time).
        dims: the dimension tables.
        config: timing rules.
        winners: the id stage's notices (ID_PROJECTION_SCHEMA), one per id.
        compact: also dedupe and evict the whole state (else the events and
            the evicted counts come back as they were).
    """
    if winners is None:
        winners = ID_PROJECTION_SCHEMA.empty_table()
    # Without the losing copies, the copies of an id are one user's at one
    # time: which users are due, and each user's deduped events, can be
    # found before the (whole-state) dedupe.
    candidates = drop_losing_copies(events, winners)
    impressions = candidates.filter(pc.equal(candidates.column("action"), "impression"))
    all_due = due_times(times_ms(impressions), config)
    pending = all_due[all_due > fire]
    # Everything below is per user: only the users with an impression due
    # now need it (a release covers one granularity step, a few users).
    due_users = impressions.column("user_id").filter(
        pa.array((all_due > released_until) & (all_due <= fire))
    )
    stored = events
    events = dedupe_events(
        candidates.filter(pc.is_in(candidates.column("user_id"), value_set=due_users))
    )
    bases = example_bases(events, dims.users, dims.ads)
    due = due_times(times_ms(bases), config)
    release = (due > released_until) & (due <= fire)
    chosen = bases.filter(pa.array(release))
    user_ids = to_int64(chosen.column("user_id"))
    offsets = _per_user(user_ids, dropped)
    local_cut = to_int64(chosen.column("timeline_cut"))
    user_counters = _user_counters(events, user_ids, times_ms(chosen))
    dense = user_counters | _join_answers(chosen, answers)
    columns = {name: chosen.column(name) for name in chosen.column_names}
    columns.update(dense)
    columns["timeline_cut"] = pa.array(local_cut + offsets, pa.int64())
    examples = table_of(columns, EXAMPLE_SCHEMA)
    segments = _segments(events, chosen, dropped, dims, config)
    kept_events, kept_dropped = (
        _compact(dedupe_events(candidates), dropped, fire, config)
        if compact
        else (stored, dropped)
    )
    remaining = {
        kind: table.filter(
            pc.invert(
                pc.is_in(
                    table.column("example_id"), value_set=chosen.column("example_id")
                )
            )
        )
        for kind, table in answers.items()
    }
    return UserRelease(
        examples=examples,
        segments=segments,
        events=kept_events,
        dropped=kept_dropped,
        answers=remaining,
        next_due=int(pending.min()) if pending.size else None,
        winners=compact_winners(winners, fire, config),
    )


def _segments(
    events: pa.Table,
    chosen: pa.Table,
    dropped: pa.Table,
    dims: Dimensions,
    config: StreamConfig,
) -> pa.Table:
    """The timeline segments of the released examples, as full-timeline indices."""
    if chosen.num_rows == 0:
        return TIMELINE_SEGMENT_SCHEMA.empty_table()
    wanted = pc.is_in(events.column("user_id"), value_set=chosen.column("user_id"))
    timelines = build_timelines(events.filter(wanted), dims.ads, dims.contents)
    local = timeline_segments(chosen, timelines, config.max_seq_len)
    shift = _per_user(to_int64(local.column("user_id")), dropped)
    starts = to_int64(local.column("segment_start")) + shift
    return local.set_column(
        local.schema.get_field_index("segment_start"),
        TIMELINE_SEGMENT_SCHEMA.field("segment_start"),
        pa.array(starts, pa.int64()),
    )


def _compact(
    events: pa.Table, dropped: pa.Table, fire: int, config: StreamConfig
) -> tuple[pa.Table, pa.Table]:
    """Evict what no later output can need; count the evicted per user.

    Pending impressions are at ``t > fire - granularity - window - lateness``
    and later events cannot be older than ``fire - lateness``; counters look
    back :data:`COUNTER_HORIZON_MS`. Each user keeps its last
    ``config.kept_tail`` events before the cutoff however old (windows and
    sequence snapshots read them). ``events`` is in timeline order.
    """
    cutoff = (
        fire
        - config.granularity_ms
        - LABEL_WINDOW_MS
        - config.allowed_lateness_ms
        - COUNTER_HORIZON_MS
    )
    users = to_int64(events.column("user_id"))
    if users.size == 0:
        return events, dropped
    old = times_ms(events) < cutoff
    starts = np.flatnonzero(np.r_[True, users[1:] != users[:-1]])
    lengths = np.diff(np.r_[starts, users.size])
    old_per_user = np.add.reduceat(old.astype(np.int64), starts)
    evict_per_user = np.maximum(old_per_user - config.kept_tail, 0)
    position = np.arange(users.size) - np.repeat(starts, lengths)
    evict = position < np.repeat(evict_per_user, lengths)
    if not evict.any():
        return events, dropped
    run_users = users[starts]
    has = evict_per_user > 0
    merged = pa.concat_tables(
        [
            dropped,
            pa.table(
                {"user_id": run_users[has], "dropped": evict_per_user[has]},
                schema=DROPPED_SCHEMA,
            ),
        ]
    )
    summed = merged.group_by("user_id").aggregate([("dropped", "sum")])
    new_dropped = pa.table(
        {
            "user_id": summed.column("user_id"),
            "dropped": summed.column("dropped_sum"),
        },
        schema=DROPPED_SCHEMA,
    )
    return events.filter(pa.array(~evict)), new_dropped


def user_push_rows(
    events: pa.Table,
    touched: IntArray,
    dims: Dimensions,
    winners: pa.Table | None = None,
) -> dict[str, pa.Table]:
    """``user_counters`` and ``user_sequence`` rows of the touched users, as of
    just after each one's newest event (``event_timestamp`` = newest + 1 ms),
    without the copies the id stage's ``winners`` say lose."""
    mine = events.filter(
        pc.is_in(events.column("user_id"), value_set=pa.array(touched))
    )
    if winners is not None:
        mine = drop_losing_copies(mine, winners)
    mine = dedupe_events(mine)
    users = to_int64(mine.column("user_id"))
    if users.size == 0:
        return {}
    times = times_ms(mine)
    last = np.r_[users[1:] != users[:-1], True]
    query_users, query_times = users[last], times[last] + 1
    counters = _user_counters(mine, query_users, query_times)
    counter_rows = counter_table("user", query_users, query_times, counters)
    timelines = build_timelines(mine, dims.ads, dims.contents)
    lengths = to_int64(pc.list_value_length(timelines.column("event_time")))
    timeline_users = to_int64(timelines.column("user_id"))
    sequences = sequence_rows(timeline_users, query_times, lengths, timelines)
    return {"user_counters": counter_rows, "user_sequence": sequences}
