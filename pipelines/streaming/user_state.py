"""Per user shard: each user's recent history in Beam state, examples when due.

Keyed by user shard. State (Arrow IPC chunks of a kind, :mod:`.tables`,
read through the worker's mirror, :mod:`.state_mirror`), in two bags:

- ``history``: the ``events`` (the shard's valid events as they arrived,
  copies included, compacted now and then to what later outputs can still
  need: :func:`~pipelines.streaming.tables.due_for_compaction`) and the
  ``dropped`` counts (per user, events evicted so far, so ``timeline_cut``
  stays an index into the user's *full* timeline, as in the batch job);
- ``notes``, rewritten at every release: the ``ad`` / ``advertiser``
  counters of pending impressions, sent by the entity shards
  (:mod:`.entity_state`), and the ``winners``, the winning copy's key of
  event_ids whose copies differ, sent by the id stage (:mod:`.event_ids`):
  the shard drops the other copies, then keeps each id's winning copy among
  its own (the batch job's :func:`~pipelines.batch.timelines.dedupe_events`).

Release rule (event time): an impression at ``t`` is final when the label
window and the allowed lateness have passed, ``due = ceil(t + window +
lateness, granularity)``; one event-time timer per shard and due time. When
it fires, every impression due by then becomes a training example,
computed by the batch job's own functions over the shard's state (same
features, same labels) and leaves as one message's worth of examples plus the
timeline segments their windows need.

Why this is exact: an event ``lateness`` or more behind the watermark is
dead-lettered by the reader, so once the watermark passes ``due`` no event
that could change the example (a follow-up before ``t + window``, a history
event before ``t``) can still arrive. A pending element holds the watermark
at its timestamp, and a pending timer holds its stage's output watermark, so
the entity shards' answers (due at ``ceil(t + lateness)``) are here first.

Every element also refreshes the online features of the users it touched:
their counters and last events as of their newest event (Feast push rows).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.coders import BytesCoder, TupleCoder, VarIntCoder
from apache_beam.coders.coders import StrUtf8Coder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.utils.timestamp import Timestamp

from features.examples import TIMELINE_SEGMENT_SCHEMA, training_example_schema
from features.feature_tables import FEATURE_TABLES, USER_SEQUENCE_LENGTH
from features.registry import COUNTER_ACTIONS
from features.windows import TIMELINE_SEQUENCE_COLUMNS, timeline_segments
from features.windows import window_positions as _window_positions
from pipelines.batch.arrow import IntArray, to_int64
from pipelines.batch.counters import entity_counters
from pipelines.batch.examples import example_bases
from pipelines.batch.timelines import build_timelines, dedupe_events
from pipelines.core.kernels import (
    ID_PROJECTION_SCHEMA,
    drop_losing_copies,
    losing_copies,
)
from pipelines.streaming.config import COUNTER_HORIZON_MS, LABEL_WINDOW_MS, StreamConfig
from pipelines.streaming.event_ids import WINNERS, compact_winners, winners_of
from pipelines.streaming.state_mirror import TOKEN as MIRROR_TOKEN
from pipelines.streaming.state_mirror import MirroredState, StateMirror
from pipelines.streaming.tables import (
    DROPPED_SCHEMA,
    ENTITY_KINDS,
    STREAM_EVENT_SCHEMA,
    answer_schema,
    ceil_to,
    concatenated,
    due_for_compaction,
    state_bytes,
    state_table,
    times_ms,
)

METRICS_NAMESPACE: Final = "gem.stream"
EXAMPLE_SCHEMA: Final = training_example_schema()
PUSH: Final = "push"

ExampleMessage = tuple[int, bytes, bytes]
"""``(user shard, examples IPC, segments IPC)``: one message's worth."""
PushRows = tuple[str, bytes, bytes]
"""``(feature table, rows IPC, published_ms of the events behind them)``."""


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


def _impression_times(events: pa.Table) -> IntArray:
    mask = np.asarray(pc.equal(events.column("action"), "impression"))
    return times_ms(events)[mask]


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


def _ad_events(events: pa.Table) -> tuple[IntArray, pa.Table]:
    """The COUNTER_ACTIONS code (1-based) of the ad events, and those rows."""
    index = to_int64(
        pc.index_in(events.column("action"), value_set=pa.array(COUNTER_ACTIONS)), -1
    )
    ads = events.filter(pa.array(index >= 0))
    return index[index >= 0] + 1, ads


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
    codes, ad_rows = _ad_events(events)
    user_counters = entity_counters(
        "user",
        to_int64(ad_rows.column("user_id")),
        times_ms(ad_rows),
        codes,
        user_ids,
        times_ms(chosen),
    )
    dense = user_counters | _join_answers(chosen, answers)
    columns = {name: chosen.column(name) for name in chosen.column_names}
    columns.update(dense)
    columns["timeline_cut"] = pa.array(local_cut + offsets, pa.int64())
    examples = pa.Table.from_arrays(
        [
            pa.array(columns[f.name], f.type)
            if not isinstance(columns[f.name], pa.ChunkedArray)
            else columns[f.name].combine_chunks().cast(f.type)
            for f in EXAMPLE_SCHEMA
        ],
        schema=EXAMPLE_SCHEMA,
    )
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
    codes, ad_rows = _ad_events(mine)
    counters = entity_counters(
        "user",
        to_int64(ad_rows.column("user_id")),
        times_ms(ad_rows),
        codes,
        query_users,
        query_times,
    )
    stamp_type = FEATURE_TABLES["user_counters"].schema.field("event_timestamp").type
    counter_rows = pa.table(
        {
            "user_id": pa.array(query_users, pa.int64()),
            "event_timestamp": pa.array(query_times, pa.int64()).cast(stamp_type),
            **{n: pa.array(v, pa.float32()) for n, v in counters.items()},
        }
    ).cast(FEATURE_TABLES["user_counters"].schema)
    timelines = build_timelines(mine, dims.ads, dims.contents)
    lengths = to_int64(pc.list_value_length(timelines.column("event_time")))
    positions, offsets, columns = _window_positions(
        to_int64(timelines.column("user_id")), lengths, timelines, USER_SEQUENCE_LENGTH
    )
    take = pa.array(positions, pa.int64())
    list_offsets = pa.array(offsets.astype(np.int32), pa.int32())
    spec = FEATURE_TABLES["user_sequence"].schema
    arrays: list[pa.Array] = [
        timelines.column("user_id").combine_chunks(),
        pa.array(query_times, pa.int64()).cast(spec.field("event_timestamp").type),
        pa.ListArray.from_arrays(
            list_offsets, columns["event_time"].take(take).cast(pa.int64())
        ),
    ]
    arrays += [
        pa.ListArray.from_arrays(list_offsets, columns[name].take(take))
        for name in TIMELINE_SEQUENCE_COLUMNS
    ]
    sequence_rows = pa.Table.from_arrays(arrays, schema=spec)
    return {"user_counters": counter_rows, "user_sequence": sequence_rows}


_CHUNK = TupleCoder([StrUtf8Coder(), BytesCoder()])


# State and timers (module-level: Beam finds them in the defaults).
_HISTORY = BagStateSpec("history", _CHUNK)
_HISTORY_PARAM = beam.DoFn.StateParam(_HISTORY)
_NOTES = BagStateSpec("notes", _CHUNK)
_NOTES_PARAM = beam.DoFn.StateParam(_NOTES)
_TOKEN_PARAM = beam.DoFn.StateParam(MIRROR_TOKEN)
_RELEASED = ReadModifyWriteStateSpec("released_until", VarIntCoder())
_RELEASED_PARAM = beam.DoFn.StateParam(_RELEASED)
_RELEASE = TimerSpec("release", TimeDomain.WATERMARK)
_RELEASE_PARAM = beam.DoFn.TimerParam(_RELEASE)
_MIRROR: Final = StateMirror(
    decode=lambda chunk: state_table(chunk[1]), size=lambda chunk: len(chunk[1])
)


HISTORY_KINDS: Final = ("events", "dropped")
"""Kept in the ``history`` bag, rewritten only when it is compacted
(:func:`~pipelines.streaming.tables.due_for_compaction`); the answers and
the notices go to the ``notes`` bag, rewritten at every release."""


def _bags(history: Any, notes: Any) -> dict[str, Any]:
    return {"history": history, "notes": notes}


def _by_kind(state: MirroredState) -> dict[str, list[pa.Table]]:
    """The shard's chunks, decoded, by kind."""
    found: dict[str, list[pa.Table]] = {}
    for bag in ("history", "notes"):
        for (kind, _), table in state.chunks(bag):
            found.setdefault(kind, []).append(table)
    return found


class UserShardFn(beam.DoFn):  # type: ignore[misc]
    """The stateful stage (see the module docstring).

    Input: ``(user shard, (kind, IPC))`` with kind ``events`` (a batch of the
    shard's events), ``ad`` / ``advertiser`` (entity answers) or ``winners``
    (the id stage's notices).
    Main output: :data:`ExampleMessage`; tagged ``push``: :data:`PushRows`.
    """

    def __init__(self, config: StreamConfig, input_dir: str, push: bool) -> None:
        self._config = config
        self._input_dir = input_dir
        self._push = push
        self._dims: Dimensions | None = None
        self.examples = Metrics.counter(METRICS_NAMESPACE, "examples")
        self.releases = Metrics.counter(METRICS_NAMESPACE, "user_releases")

    def setup(self) -> None:
        """Load the dimension tables once per worker."""
        self._dims = load_dimensions(self._input_dir)

    def process(
        self,
        element: tuple[int, tuple[str, bytes]],
        history: Any = _HISTORY_PARAM,
        notes: Any = _NOTES_PARAM,
        token: Any = _TOKEN_PARAM,
        release: Any = _RELEASE_PARAM,
    ) -> Iterator[Any]:
        """Keep the chunk; a timer at each due time of the batch's impressions
        (one per due time, set here: see ``EntityShardFn.process``)."""
        key, (kind, data) = element
        state = _MIRROR.open(key, token, _bags(history, notes))
        batch = state_table(data)
        bag = "history" if kind in HISTORY_KINDS else "notes"
        state.add(bag, (kind, data), batch)
        if kind == WINNERS and self._push:
            yield from self._push_corrections(_by_kind(state), batch)
        if kind != "events":
            return
        impressions = _impression_times(batch)
        for due in np.unique(due_times(impressions, self._config)).tolist():
            release.set(Timestamp(micros=due * 1000), dynamic_timer_tag=str(due))
        if self._push and batch.num_rows:
            assert self._dims is not None
            stored = _by_kind(state)
            events = concatenated(stored.get("events", []), STREAM_EVENT_SCHEMA)
            winners = winners_of(stored.get(WINNERS, []))
            touched = np.unique(to_int64(batch.column("user_id")))
            published = to_int64(batch.column("published_ms")).tobytes()
            rows_by_table = user_push_rows(events, touched, self._dims, winners)
            for table, rows in rows_by_table.items():
                yield beam.pvalue.TaggedOutput(
                    PUSH, (table, state_bytes(rows), published)
                )

    def _push_corrections(
        self, stored: dict[str, list[pa.Table]], notice: pa.Table
    ) -> Iterator[Any]:
        """Push again the online rows of the users holding a copy the notice
        says loses (already pushed with it); no freshness samples."""
        assert self._dims is not None
        events = concatenated(stored.get("events", []), STREAM_EVENT_SCHEMA)
        loses = losing_copies(events, notice)
        if not loses.any():
            return
        touched = np.unique(to_int64(events.column("user_id"))[loses])
        winners = winners_of(stored.get(WINNERS, []))
        for table, rows in user_push_rows(events, touched, self._dims, winners).items():
            yield beam.pvalue.TaggedOutput(PUSH, (table, state_bytes(rows), b""))

    @on_timer(_RELEASE)
    def release(
        self,
        key: Any = beam.DoFn.KeyParam,
        fire_at: Any = beam.DoFn.TimestampParam,
        history: Any = _HISTORY_PARAM,
        notes: Any = _NOTES_PARAM,
        token: Any = _TOKEN_PARAM,
        released: Any = _RELEASED_PARAM,
    ) -> Iterator[ExampleMessage]:
        """Release every impression due by now not released yet; compact the
        state when it is due (:func:`~.tables.due_for_compaction`)."""
        assert self._dims is not None
        fire = fire_at.micros // 1000
        until = released.read()
        if until is not None and fire <= until:
            return  # a later due time fired first and released these
        state = _MIRROR.open(key, token, _bags(history, notes))
        by_kind = _by_kind(state)
        events = concatenated(by_kind.get("events", []), STREAM_EVENT_SCHEMA)
        winners = winners_of(by_kind.get(WINNERS, []))
        # The history is deduped, evicted and rewritten only now and then, or
        # when a notice is forgotten: the copies it drops must be gone first.
        forgets = compact_winners(winners, fire, self._config).num_rows < len(winners)
        compact = forgets or due_for_compaction(len(by_kind.get("events", [])))
        result = release_user_shard(
            events,
            concatenated(by_kind.get("dropped", []), DROPPED_SCHEMA),
            {
                k: concatenated(by_kind.get(k, []), answer_schema(k))
                for k in ENTITY_KINDS
            },
            released_until=np.iinfo(np.int64).min if until is None else until,
            fire=fire,
            dims=self._dims,
            config=self._config,
            winners=winners,
            compact=compact,
        )
        released.write(fire)
        if compact:
            kept = [("events", result.events)]
            if result.dropped.num_rows:
                kept.append(("dropped", result.dropped))
            state.replace("history", [((k, state_bytes(t)), t) for k, t in kept])
        pending = [(WINNERS, result.winners)] if result.winners.num_rows else []
        pending += [(k, t) for k, t in result.answers.items() if t.num_rows]
        state.replace("notes", [((k, state_bytes(t)), t) for k, t in pending])
        self.releases.inc()
        if result.examples.num_rows:
            self.examples.inc(result.examples.num_rows)
            yield (
                int(key),
                state_bytes(result.examples),
                state_bytes(result.segments),
            )


def load_dimensions(input_dir: str) -> Dimensions:
    """The users / ads / contents tables of a data set folder."""
    from pathlib import Path

    from pipelines.batch.io import DIMENSION_SCHEMAS, read_dimension

    tables = {
        name: read_dimension(str(Path(input_dir) / f"{name}.parquet"), schema)
        for name, schema in DIMENSION_SCHEMAS.items()
    }
    return Dimensions(tables["users"], tables["ads"], tables["contents"])


def shard_events(batch: pa.Table, shards: int) -> Iterator[tuple[int, pa.Table]]:
    """A batch split by user shard."""
    from pipelines.batch.arrow import shard_of, split_by_shard

    yield from split_by_shard(
        batch, shard_of(to_int64(batch.column("user_id")), shards)
    )
