"""Per id bucket: which copy of an event_id wins, told to the shards that hold copies.

Copies of one event_id may sit under different users (so in different user
shards) or at different times (so in different entity shards); no user or
entity shard sees them all. This stage, keyed by a hash of the event_id
(:func:`pipelines.core.event_copies.id_buckets`), keeps ``(event_id, user_id,
event_time, digest)`` of every copy it has seen and, whenever a batch brings
a copy of an id whose copies differ, sends the winning copy's key
(:func:`pipelines.core.event_copies.copy_winners`, the contract of
:mod:`features.duplicates`) to the user shard of each user holding a copy
and to every entity shard; those drop the other copies before they release
anything (:func:`pipelines.core.event_copies.drop_losing_copies`). Copies that
differ only in an ad field are settled too, although they meet in one user
shard: they may sit in two ad shards.

Why this is in time: the winner is the earliest copy, and an earlier copy
arrives before the watermark passes its time plus the allowed lateness
(later it is dead-lettered as late). Whatever a losing copy at ``t`` could
change is released only after the watermark passes ``t`` plus the lateness:
entity answers of impressions after ``t`` (at their time plus the lateness),
examples of impressions after ``t`` minus the label window (at their time
plus the window and the lateness). The notice leaves here while the copies
that caused it still hold the watermark.

Retention: an id is forgotten once the watermark passes its earliest copy's
time plus the allowed lateness plus
:data:`~features.duplicates.DUPLICATE_HORIZON_MS`, or later: it is checked
when the bucket compacts its state, at the end of a granularity step it has
events in once its bag is due (:func:`~.tables.due_for_compaction`). A copy
within the horizon has arrived by then or would be late, so the state holds
about a horizon's worth of ids, plus what arrived since the last compaction
(remembering an id longer only recognizes more copies). The shards keep the
notices as long (a losing copy may still arrive until then). Online rows
pushed with a copy that later loses are pushed again, without it, when its
notice arrives.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.coders import BytesCoder, VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)

from features.duplicates import DUPLICATE_HORIZON_MS
from pipelines.core.columns import IntArray, dictionary_codes, to_int64
from pipelines.core.counters import ENTITY_KINDS
from pipelines.core.event_copies import (
    DIGEST_PROJECTION_SCHEMA,
    copy_winners,
    id_buckets,
    id_projection,
    losing_copies,
)
from pipelines.core.shards import shard_of, split_by_shard
from pipelines.streaming.config import METRICS_NAMESPACE, StreamConfig
from pipelines.streaming.event_timers import newly_fired, set_at_each
from pipelines.streaming.state_mirror import TOKEN as MIRROR_TOKEN
from pipelines.streaming.state_mirror import StateMirror
from pipelines.streaming.tables import (
    ceil_to,
    concatenated,
    due_for_compaction,
    state_bytes,
    state_table,
)

WINNERS: Final = "winners"
"""The kind of the notices, in the user and entity shards' inputs."""
ENTITY_NOTICES: Final = "entity_notices"
"""Tagged output: ``(entity key, (WINNERS, IPC))``."""


def id_elements(events: pa.Table, buckets: int) -> list[tuple[int, bytes]]:
    """``(id bucket, projection IPC)`` of a batch of valid events."""
    ids = id_projection(events, with_digest=True)
    targets = id_buckets(ids.column("event_id"), buckets)
    return [
        (bucket, state_bytes(part)) for bucket, part in split_by_shard(ids, targets)
    ]


def retained_until(winner_times: np.ndarray, config: StreamConfig) -> np.ndarray:
    """Event time after which an id with these winning times is forgotten."""
    return winner_times + config.allowed_lateness_ms + DUPLICATE_HORIZON_MS


def notices_for(seen: pa.Table, batch: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The winners of the batch's ids whose copies (seen before or in the
    batch) differ in user or time, and every copy of those ids.

    Returns:
        ``(winners, copies)``, both :data:`DIGEST_PROJECTION_SCHEMA`.
    """
    if batch.num_rows == 0:
        empty = DIGEST_PROJECTION_SCHEMA.empty_table()
        return empty, empty
    mine = pc.is_in(seen.column("event_id"), value_set=batch.column("event_id"))
    copies = pa.concat_tables([seen.filter(mine), batch])
    winners = copy_winners(copies)
    if winners.num_rows == 0:
        return winners, winners
    named = pc.is_in(copies.column("event_id"), value_set=winners.column("event_id"))
    return winners, copies.filter(named)


# State and timers (module-level: Beam finds them in the defaults).
_SEEN = BagStateSpec("seen", BytesCoder())
_SEEN_PARAM = beam.DoFn.StateParam(_SEEN)
_TOKEN_PARAM = beam.DoFn.StateParam(MIRROR_TOKEN)
_MIRROR: Final = StateMirror(decode=state_table, size=len)
_FORGOTTEN = ReadModifyWriteStateSpec("forgotten_until", VarIntCoder())
_FORGOTTEN_PARAM = beam.DoFn.StateParam(_FORGOTTEN)
_FORGET = TimerSpec("forget", TimeDomain.WATERMARK)
_FORGET_PARAM = beam.DoFn.TimerParam(_FORGET)


class EventIdFn(beam.DoFn):  # type: ignore[misc]
    """The id stage (see the module docstring).

    Input: ``(id bucket, projection IPC)``. Main output: ``(user shard,
    (WINNERS, IPC))``; tagged :data:`ENTITY_NOTICES`: the same for every
    entity key.
    """

    def __init__(self, config: StreamConfig) -> None:
        self._config = config
        self.notices = Metrics.counter(METRICS_NAMESPACE, "event_id_notices")

    def process(
        self,
        element: tuple[int, bytes],
        seen: Any = _SEEN_PARAM,
        token: Any = _TOKEN_PARAM,
        forget: Any = _FORGET_PARAM,
    ) -> Iterator[Any]:
        """Remember the batch's copies; tell the shards about conflicting ids."""
        key, data = element
        batch = state_table(data)
        state = _MIRROR.open(key, token, {"seen": seen})
        stored = concatenated(state.tables("seen"), DIGEST_PROJECTION_SCHEMA)
        winners, copies = notices_for(stored, batch)
        state.add("seen", data, batch)
        # A compaction at the end of each granularity step the batch's times
        # fall in: the bag is one chunk again, without the forgotten ids.
        times = to_int64(batch.column("event_time"))
        set_at_each(forget, ceil_to(times + 1, self._config.granularity_ms))
        if winners.num_rows == 0:
            return
        self.notices.inc(winners.num_rows)
        notice = (WINNERS, state_bytes(winners))
        users = np.unique(to_int64(copies.column("user_id")))
        for shard in np.unique(shard_of(users, self._config.shards)).tolist():
            yield shard, notice
        for key in range(len(ENTITY_KINDS) * self._config.entity_shards):
            yield beam.pvalue.TaggedOutput(ENTITY_NOTICES, (key, notice))

    @on_timer(_FORGET)
    def forget(
        self,
        key: Any = beam.DoFn.KeyParam,
        fire_at: Any = beam.DoFn.TimestampParam,
        seen: Any = _SEEN_PARAM,
        token: Any = _TOKEN_PARAM,
        forgotten: Any = _FORGOTTEN_PARAM,
    ) -> None:
        """Forget the ids whose winning copy is past the retention."""
        fired = newly_fired(fire_at, forgotten)
        if fired is None:
            return
        state = _MIRROR.open(key, token, {"seen": seen})
        stored = concatenated(state.tables("seen"), DIGEST_PROJECTION_SCHEMA)
        kept = forget_ids(stored, fired.fire, self._config)
        if due_for_compaction(len(state.tables("seen"))):
            state.replace("seen", [(state_bytes(kept), kept)] if kept.num_rows else [])


def forget_ids(seen: pa.Table, fire: int, config: StreamConfig) -> pa.Table:
    """``seen`` without the ids whose earliest copy is retained only until
    ``fire`` or before (every copy of an id goes together)."""
    if seen.num_rows == 0:
        return seen
    codes = dictionary_codes(seen.column("event_id"))
    times = to_int64(seen.column("event_time"))
    earliest = np.full(int(codes.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(earliest, codes, times)
    keep = retained_until(earliest[codes], config) > fire
    return seen.filter(pa.array(keep))


def winners_table(chunks: list[bytes]) -> pa.Table:
    """Notices received, one row per id (the latest winner is the earliest)."""
    return winners_of([state_table(c) for c in chunks])


def winners_of(notices: list[pa.Table]) -> pa.Table:
    """:func:`winners_table` of decoded notices (the state's chunks)."""
    winners = concatenated(notices, DIGEST_PROJECTION_SCHEMA)
    if winners.num_rows == 0:
        return winners
    return copy_winners(winners, every_id=True)


def holding_losers(
    rows: pa.Table, notice: pa.Table, entity: str, *, time_column: str = "event_time"
) -> IntArray:
    """The distinct ``entity`` ids of the rows the notice says lose (what a
    shard pushed with a losing copy and must push again without it)."""
    loses = losing_copies(rows, notice, time_column=time_column)
    return np.unique(to_int64(rows.column(entity))[loses])


def compact_winners(winners: pa.Table, fire: int, config: StreamConfig) -> pa.Table:
    """The notices a shard must keep after a release at ``fire``: a copy they
    drop may still arrive until the id's retention has passed."""
    if winners.num_rows == 0:
        return winners
    until = retained_until(to_int64(winners.column("event_time")), config)
    return winners.filter(pa.array(until > fire))
