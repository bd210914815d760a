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
  its own (:func:`~pipelines.core.timelines.dedupe_events`, as the batch job).

Release rule (event time): an impression at ``t`` is final when the label
window and the allowed lateness have passed, ``due = ceil(t + window +
lateness, granularity)``; one event-time timer per shard and due time. When
it fires, every impression due by then becomes a training example,
computed by the batch job's own functions over the shard's state (same
features, same labels: :mod:`.user_release`) and leaves as one message's
worth of examples plus the timeline segments their windows need.

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
from typing import Any, Final

import apache_beam as beam
import numpy as np
import pyarrow as pa
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
from apache_beam.transforms.window import TimestampedValue

from pipelines.core.columns import IntArray, to_int64
from pipelines.core.counters import ENTITY_KINDS
from pipelines.core.examples import impression_mask
from pipelines.core.shards import shard_of, split_by_shard
from pipelines.streaming.config import METRICS_NAMESPACE, StreamConfig
from pipelines.streaming.event_ids import (
    WINNERS,
    compact_winners,
    holding_losers,
    winners_of,
)
from pipelines.streaming.event_timers import (
    ms_to_timestamp,
    newly_fired,
    set_at_each,
)
from pipelines.streaming.state_mirror import TOKEN as MIRROR_TOKEN
from pipelines.streaming.state_mirror import MirroredState, StateMirror
from pipelines.streaming.tables import (
    DROPPED_SCHEMA,
    PUSH,
    STREAM_EVENT_SCHEMA,
    answer_schema,
    concatenated,
    due_for_compaction,
    state_bytes,
    state_table,
    times_ms,
)
from pipelines.streaming.user_release import (
    Dimensions,
    by_due_time,
    due_times,
    release_user_shard,
    user_push_rows,
)

ExampleMessage = tuple[int, bytes, bytes]
"""``(user shard, examples IPC, segments IPC)``: one message's worth."""
PushRows = tuple[str, bytes, bytes]
"""``(feature table, rows IPC, published_ms of the events behind them)``."""


def _impression_times(events: pa.Table) -> np.ndarray:
    return times_ms(events)[impression_mask(events)]


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
        set_at_each(release, due_times(impressions, self._config))
        if self._push and batch.num_rows:
            stored = _by_kind(state)
            events = concatenated(stored.get("events", []), STREAM_EVENT_SCHEMA)
            touched = np.unique(to_int64(batch.column("user_id")))
            published = to_int64(batch.column("published_ms")).tobytes()
            yield from self._push_rows(stored, events, touched, published)

    def _push_corrections(
        self, stored: dict[str, list[pa.Table]], notice: pa.Table
    ) -> Iterator[Any]:
        """Push again the online rows of the users holding a copy the notice
        says loses (already pushed with it); no freshness samples."""
        events = concatenated(stored.get("events", []), STREAM_EVENT_SCHEMA)
        touched = holding_losers(events, notice, "user_id")
        if touched.size:
            yield from self._push_rows(stored, events, touched, b"")

    def _push_rows(
        self,
        stored: dict[str, list[pa.Table]],
        events: pa.Table,
        touched: IntArray,
        published: bytes,
    ) -> Iterator[Any]:
        """The ``push`` outputs (:data:`PushRows`) of the touched users."""
        assert self._dims is not None
        winners = winners_of(stored.get(WINNERS, []))
        for table, rows in user_push_rows(events, touched, self._dims, winners).items():
            yield beam.pvalue.TaggedOutput(PUSH, (table, state_bytes(rows), published))

    @on_timer(_RELEASE)
    def release(
        self,
        key: Any = beam.DoFn.KeyParam,
        fire_at: Any = beam.DoFn.TimestampParam,
        history: Any = _HISTORY_PARAM,
        notes: Any = _NOTES_PARAM,
        token: Any = _TOKEN_PARAM,
        released: Any = _RELEASED_PARAM,
    ) -> Iterator[TimestampedValue]:
        """Release every impression due by now not released yet (one
        :data:`ExampleMessage` per due time, at that time); compact the
        state when it is due (:func:`~.tables.due_for_compaction`)."""
        assert self._dims is not None
        fired = newly_fired(fire_at, released)
        if fired is None:
            return  # a later due time fired first and released these
        state = _MIRROR.open(key, token, _bags(history, notes))
        by_kind = _by_kind(state)
        events = concatenated(by_kind.get("events", []), STREAM_EVENT_SCHEMA)
        winners = winners_of(by_kind.get(WINNERS, []))
        # The history is deduped, evicted and rewritten only now and then, or
        # when a notice is forgotten: the copies it drops must be gone first.
        still_needed = compact_winners(winners, fired.fire, self._config)
        forgets = still_needed.num_rows < len(winners)
        compact = forgets or due_for_compaction(len(by_kind.get("events", [])))
        result = release_user_shard(
            events,
            concatenated(by_kind.get("dropped", []), DROPPED_SCHEMA),
            {
                k: concatenated(by_kind.get(k, []), answer_schema(k))
                for k in ENTITY_KINDS
            },
            released_until=fired.after,
            fire=fired.fire,
            dims=self._dims,
            config=self._config,
            winners=winners,
            compact=compact,
        )
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
            # Each due time's examples leave at that time: the publisher
            # takes the watermark passing T to mean "every release up to T
            # is here", whichever timer released them.
            for due, examples, segments in by_due_time(
                result.examples, result.segments, self._config
            ):
                yield TimestampedValue(
                    (int(key), state_bytes(examples), state_bytes(segments)),
                    ms_to_timestamp(due),
                )


def load_dimensions(input_dir: str) -> Dimensions:
    """The users / ads / contents tables of a data set folder, read as the
    batch job reads them (through Beam's filesystems)."""
    from pipelines.beam.files import DIMENSION_SCHEMAS, dimension_path, read_dimension

    tables = {
        name: read_dimension(dimension_path(input_dir, name), schema)
        for name, schema in DIMENSION_SCHEMAS.items()
    }
    return Dimensions(tables["users"], tables["ads"], tables["contents"])


def shard_events(batch: pa.Table, shards: int) -> Iterator[tuple[int, pa.Table]]:
    """A batch split by user shard."""
    yield from split_by_shard(
        batch, shard_of(to_int64(batch.column("user_id")), shards)
    )
