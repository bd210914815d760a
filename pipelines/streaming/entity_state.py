"""Per ad / advertiser shard: the entity's recent ad events, counters when due.

An impression's ad and advertiser counters need every event of that ad or
advertiser, which come from all users, so they are kept here, keyed by
``kind * entity_shards + shard_of(id)`` (the batch job's entity shuffle, made
incremental). Each shard sees the impressions of its entities too, so it
answers them by itself: once event time passes ``ceil(t + lateness)`` no
earlier event can arrive (the reader dead-letters those), and the answer,
the impression's 9 counters over ``[t - window, t)``, goes to the user shard
of the impression, which holds the example until its label window closes
(:mod:`.user_state`).

Copies of an event (same ``event_id``) are counted once: copies that differ
are settled by the id stage's notices (:mod:`.event_ids`), which name the
winning copy's user, time and digest (the others are dropped), and copies
that agree on all three are identical. Every element also refreshes the
online counters of the entities it touched (Feast push rows).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.coders import BytesCoder, VarIntCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)

from features.duplicates import copy_digests
from features.feature_tables import FEATURE_TABLES
from features.registry import COUNTER_ACTIONS
from pipelines.core.columns import IntArray, to_int64
from pipelines.core.counters import (
    ENTITY_KINDS,
    counter_action_codes,
    counter_table,
    entity_counters,
)
from pipelines.core.event_copies import drop_losing_copies
from pipelines.core.ordering import first_of_each
from pipelines.core.shards import shard_of, split_by_shard
from pipelines.streaming.config import COUNTER_HORIZON_MS, StreamConfig
from pipelines.streaming.event_ids import (
    WINNERS,
    compact_winners,
    holding_losers,
    winners_of,
)
from pipelines.streaming.event_timers import newly_fired, set_at_each
from pipelines.streaming.state_mirror import TOKEN as MIRROR_TOKEN
from pipelines.streaming.state_mirror import MirroredState, StateMirror
from pipelines.streaming.tables import (
    ENTITY_EVENT_SCHEMA,
    PUSH,
    answer_schema,
    ceil_to,
    concatenated,
    due_for_compaction,
    state_bytes,
    state_table,
)

_IMPRESSION: Final = COUNTER_ACTIONS.index("impression") + 1


def entity_rows(events: pa.Table, kind: str) -> pa.Table:
    """The ad events of a batch as ``kind`` rows (ENTITY_EVENT_SCHEMA)."""
    codes = counter_action_codes(events.column("action"))
    ads = events.filter(pa.array(codes > 0))
    return pa.table(
        {
            "event_id": ads.column("event_id"),
            "entity_id": pa.array(to_int64(ads.column(f"{kind}_id")), pa.int64()),
            "time_ms": pa.array(to_int64(ads.column("event_time")), pa.int64()),
            "action": pa.array(codes[codes > 0], pa.int64()),
            "user_id": ads.column("user_id"),
            "published_ms": ads.column("published_ms"),
            "digest": pa.array(copy_digests(ads), pa.string()),
        },
        schema=ENTITY_EVENT_SCHEMA,
    )


def route_entity_rows(
    events: pa.Table, entity_shards: int
) -> Iterator[tuple[int, pa.Table]]:
    """``(entity key, rows)`` for both kinds (see the module docstring)."""
    for kind_index, kind in enumerate(ENTITY_KINDS):
        rows = entity_rows(events, kind)
        targets = shard_of(to_int64(rows.column("entity_id")), entity_shards)
        for shard, part in split_by_shard(rows, targets):
            yield kind_index * entity_shards + shard, part


def answer_due(times: IntArray, config: StreamConfig) -> IntArray:
    """When an impression's entity counters are final."""
    return ceil_to(times + config.allowed_lateness_ms, config.granularity_ms)


def answer_entity_shard(
    rows: pa.Table,
    kind: str,
    *,
    answered_until: int,
    fire: int,
    config: StreamConfig,
    user_shards: int,
    winners: pa.Table | None = None,
) -> tuple[list[tuple[int, pa.Table]], pa.Table, int | None]:
    """Answers of the impressions due in ``(answered_until, fire]``.

    ``winners`` are the id stage's notices (ID_PROJECTION_SCHEMA): copies of
    those ids at another user or time are not counted.

    Returns:
        ``(answers by user shard, compacted rows, next due time or None)``;
        answers are ``answer_schema(kind)`` tables.
    """
    rows = distinct_rows(rows, winners)
    ids = to_int64(rows.column("entity_id"))
    times = to_int64(rows.column("time_ms"))
    actions = to_int64(rows.column("action"))
    impression = actions == _IMPRESSION
    due = answer_due(times, config)
    chosen = impression & (due > answered_until) & (due <= fire)
    counters = entity_counters(kind, ids, times, actions, ids[chosen], times[chosen])
    answers = pa.table(
        {
            "example_id": rows.column("event_id").take(
                pa.array(np.flatnonzero(chosen))
            ),
            **{name: pa.array(v, pa.float32()) for name, v in counters.items()},
        },
        schema=answer_schema(kind),
    )
    users = to_int64(rows.column("user_id"))[chosen]
    routed = split_by_shard(answers, shard_of(users, user_shards))
    cutoff = (
        fire - config.granularity_ms - config.allowed_lateness_ms - COUNTER_HORIZON_MS
    )
    kept = rows.filter(pa.array(times >= cutoff))
    pending = due[impression & (due > fire)]
    return routed, kept, (int(pending.min()) if pending.size else None)


def distinct_rows(rows: pa.Table, winners: pa.Table | None) -> pa.Table:
    """Each event once: the winning copy where the id stage named one, else
    the first of identical copies."""
    if winners is not None:
        rows = drop_losing_copies(rows, winners, time_column="time_ms")
    return rows.take(pa.array(first_of_each(rows.column("event_id"))))


def entity_push_rows(
    rows: pa.Table, touched: IntArray, kind: str, winners: pa.Table | None = None
) -> pa.Table:
    """``{kind}_counters`` rows of the touched entities, as of just after each
    one's newest event."""
    mine = rows.filter(pc.is_in(rows.column("entity_id"), value_set=pa.array(touched)))
    mine = distinct_rows(mine, winners)
    ids = to_int64(mine.column("entity_id"))
    times = to_int64(mine.column("time_ms"))
    if ids.size == 0:
        return FEATURE_TABLES[f"{kind}_counters"].schema.empty_table()
    order = np.lexsort((times, ids))
    last = np.r_[ids[order][1:] != ids[order][:-1], True]
    query_ids = ids[order][last]
    query_times = times[order][last] + 1
    counters = entity_counters(
        kind, ids, times, to_int64(mine.column("action")), query_ids, query_times
    )
    return counter_table(kind, query_ids, query_times, counters)


# State and timers (module-level: Beam finds them in the defaults).
_ROWS = BagStateSpec("rows", BytesCoder())
_ROWS_PARAM = beam.DoFn.StateParam(_ROWS)
_WINNERS = BagStateSpec("winners", BytesCoder())
_WINNERS_PARAM = beam.DoFn.StateParam(_WINNERS)
_TOKEN_PARAM = beam.DoFn.StateParam(MIRROR_TOKEN)
_ANSWERED = ReadModifyWriteStateSpec("answered_until", VarIntCoder())
_ANSWERED_PARAM = beam.DoFn.StateParam(_ANSWERED)
_ANSWER = TimerSpec("answer", TimeDomain.WATERMARK)
_ANSWER_PARAM = beam.DoFn.TimerParam(_ANSWER)
_MIRROR: Final = StateMirror(decode=state_table, size=len)


class EntityShardFn(beam.DoFn):  # type: ignore[misc]
    """The stateful stage (see the module docstring).

    Input: ``(entity key, (kind, IPC))``: kind ``rows`` (the key's ad events)
    or ``winners`` (the id stage's notices). Main output: ``(user shard,
    (kind, answers IPC))``; tagged ``push``: ``(feature table, rows IPC,
    published)``.
    """

    def __init__(self, config: StreamConfig, push: bool) -> None:
        self._config = config
        self._push = push

    def _kind(self, key: int) -> str:
        return ENTITY_KINDS[key // self._config.entity_shards]

    def process(
        self,
        element: tuple[int, tuple[str, bytes]],
        rows: Any = _ROWS_PARAM,
        winners: Any = _WINNERS_PARAM,
        token: Any = _TOKEN_PARAM,
        answer: Any = _ANSWER_PARAM,
    ) -> Iterator[Any]:
        """Keep the rows; a timer at each due time of the batch's impressions.

        One timer per due time (a dynamic tag), all set here while the
        element itself holds the watermark: no timer is set by another
        timer, and a timer that fires after a later one finds nothing left.
        """
        key, (kind_of_data, data) = element
        state = _MIRROR.open(key, token, {"rows": rows, "winners": winners})
        batch = state_table(data)
        if kind_of_data == WINNERS:
            state.add("winners", data, batch)
            if self._push:
                yield from self._push_corrections(key, state, batch)
            return
        state.add("rows", data, batch)
        actions = to_int64(batch.column("action"))
        times = to_int64(batch.column("time_ms"))[actions == _IMPRESSION]
        set_at_each(answer, answer_due(times, self._config))
        if self._push and batch.num_rows:
            stored = concatenated(state.tables("rows"), ENTITY_EVENT_SCHEMA)
            touched = np.unique(to_int64(batch.column("entity_id")))
            published = to_int64(batch.column("published_ms")).tobytes()
            yield self._push_rows(key, state, stored, touched, published)

    def _push_corrections(
        self, key: int, state: MirroredState, notice: pa.Table
    ) -> Iterator[Any]:
        """Push again the online counters of the entities with a row the
        notice says loses (already pushed with it); no freshness samples."""
        stored = concatenated(state.tables("rows"), ENTITY_EVENT_SCHEMA)
        touched = holding_losers(stored, notice, "entity_id", time_column="time_ms")
        if touched.size:
            yield self._push_rows(key, state, stored, touched, b"")

    def _push_rows(
        self,
        key: int,
        state: MirroredState,
        stored: pa.Table,
        touched: IntArray,
        published: bytes,
    ) -> Any:
        """The ``push`` output of the touched entities' online counters
        (:data:`~.user_state.PushRows`)."""
        kind = self._kind(key)
        notices = winners_of(state.tables("winners"))
        rows = entity_push_rows(stored, touched, kind, notices)
        return beam.pvalue.TaggedOutput(
            PUSH, (f"{kind}_counters", state_bytes(rows), published)
        )

    @on_timer(_ANSWER)
    def answer(
        self,
        key: Any = beam.DoFn.KeyParam,
        fire_at: Any = beam.DoFn.TimestampParam,
        rows: Any = _ROWS_PARAM,
        winners: Any = _WINNERS_PARAM,
        token: Any = _TOKEN_PARAM,
        answered: Any = _ANSWERED_PARAM,
    ) -> Iterator[tuple[int, tuple[str, bytes]]]:
        """Answer every impression due by now not answered yet; compact the
        state when it is due (:func:`~.tables.due_for_compaction`)."""
        fired = newly_fired(fire_at, answered)
        if fired is None:
            return  # a later due time fired first and answered these
        kind = self._kind(int(key))
        state = _MIRROR.open(key, token, {"rows": rows, "winners": winners})
        stored = concatenated(state.tables("rows"), ENTITY_EVENT_SCHEMA)
        notices = winners_of(state.tables("winners"))
        routed, kept, _ = answer_entity_shard(
            stored,
            kind,
            answered_until=fired.after,
            fire=fired.fire,
            config=self._config,
            user_shards=self._config.shards,
            winners=notices,
        )
        still_needed = compact_winners(notices, fired.fire, self._config)
        forgets = still_needed.num_rows < notices.num_rows
        # The rows are rewritten only now and then, or when a notice is
        # forgotten: the copies it drops must be gone first.
        if forgets or due_for_compaction(len(state.tables("rows"))):
            state.replace("rows", [(state_bytes(kept), kept)])
        if forgets or len(state.tables("winners")) > 1:
            notes = [still_needed] if still_needed.num_rows else []
            state.replace("winners", [(state_bytes(t), t) for t in notes])
        for user_shard, table in routed:
            yield user_shard, (kind, state_bytes(table))
