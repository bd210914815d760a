"""``CountEngagement``: the user / ad / advertiser counters, batched by shard.

A counter ``{entity}_{action}_count_{window}`` of an example at time ``t`` is
the number of distinct events of that entity and action with time in
``[t - window, t)``. User counters need only the user's shard. Ad and
advertiser counters need every event of an ad / advertiser, which are spread
over all user shards, so they take a second keyed aggregation:

1. each user shard sends, per entity kind, its distinct ad events to the
   shard of the entity id (``kind * E + hash(id) mod E``, E =
   :func:`entity_shard_count`), as Arrow IPC; impressions are also the
   queries, and carry where the answer goes back to (the user shard and the
   impression's ordinal there);
2. each entity shard counts for its queries, vectorized, and sends the
   counters back keyed by user shard, with the ordinals.

The ordinal is the impression's rank in its user shard's timeline order
``(user_id, event_time, event_id)``, a function of the distinct events only,
so ``BuildExamples`` joins counters back by it exactly as by example_id, with
integers instead of strings.

The same counts at every distinct ad-event time of each entity are the rows
of the ``*_counters`` feature tables (see :mod:`features.feature_tables`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Final

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam import pvalue

from features import vocab
from features.arrow_ipc import ipc_to_table, table_to_ipc
from features.registry import COUNTER_ACTIONS
from pipelines.batch.arrow import ShardedIpc, ShardedTable, TablePart, TaggedIpc
from pipelines.batch.parallel import PooledDoFn
from pipelines.batch.tuning import pipeline_tuning
from pipelines.core.columns import IntArray, concat, to_int64
from pipelines.core.counters import (
    ENTITY_KINDS,
    counter_action_codes,
    counter_rows,
    named_counts,
    window_counter,
)
from pipelines.core.shards import shard_of, split_by_shard

EXAMPLE_COUNTERS = "example_counters"
_AD_EVENT_COLUMNS: Final = ["user_id", "ad_id", "advertiser_id", "event_time", "action"]
FEATURE_ROWS = "feature_rows"

# What travels to an entity shard: ad events (action 1..3); impressions are
# also the queries (ordinal >= 0: their rank among the user shard's
# impressions, where the answer goes back to).
ENTITY_ROWS_SCHEMA: Final = pa.schema(
    [
        pa.field("entity_id", pa.int64(), False),
        pa.field("time_ms", pa.int64(), False),
        pa.field("action", pa.int8(), False),
        pa.field("user_shard", pa.int32(), False),
        pa.field("ordinal", pa.int64(), False),
    ]
)


def entity_shard_count(user_shards: int) -> int:
    """Shards per entity kind (ad, advertiser) for ``user_shards`` user shards.

    Every user shard sends one piece to every entity shard and gets one back,
    so pieces grow as their product; a quarter as many entity shards keeps
    the pieces few and large (each Arrow IPC piece has a fixed cost) while
    still spreading the work over several workers.
    """
    return max(1, user_shards // 4)


ExampleCounters = tuple[int, TaggedIpc]
"""``(user shard, (entity kind, IPC of ordinal + that kind's 9 counters))``."""


def _counter_table(ordinals: IntArray, counters: dict[str, Any]) -> pa.Table:
    columns = {"ordinal": pa.array(ordinals, pa.int64())}
    columns.update({n: pa.array(v, pa.float32()) for n, v in counters.items()})
    return pa.table(columns)


class CountUserShardFn(PooledDoFn):
    """A user shard: its user counters, and what it sends to entity shards
    (on a worker thread, :class:`~pipelines.batch.parallel.PooledDoFn`).

    Outputs: main ``(entity key, rows)`` for the entity shuffle; tagged
    ``example_counters`` (the user kind) and ``feature_rows``
    (``user_counters``).
    """

    def __init__(self, shards: int) -> None:
        self._shards = shards

    def compute(self, element: ShardedTable) -> list[Any]:
        """All of the shard's outputs (see :meth:`outputs`)."""
        return list(self.outputs(element))

    def outputs(self, element: ShardedTable) -> Iterator[Any]:
        """Count the user kind here; route ad / advertiser work by entity."""
        shard, events = element
        is_ad = np.asarray(
            pc.is_in(events.column("action"), value_set=pa.array(vocab.AD_ACTIONS))
        )
        ads = events.select(_AD_EVENT_COLUMNS).filter(pa.array(is_ad))
        actions = counter_action_codes(ads.column("action"))
        times = to_int64(ads.column("event_time"))
        user_ids = to_int64(ads.column("user_id"))
        # Impressions are both events and queries: the ad-event rows of
        # impressions carry their ordinal (rank among the shard's impressions,
        # timeline order), the others -1.
        is_impression = actions == COUNTER_ACTIONS.index("impression") + 1
        ad_ordinals = np.where(is_impression, np.cumsum(is_impression) - 1, -1)
        ordinals = ad_ordinals[is_impression]

        counter = window_counter(user_ids, times, actions)
        counters = named_counts(
            "user", counter.count(user_ids[is_impression], times[is_impression])
        )
        yield pvalue.TaggedOutput(
            EXAMPLE_COUNTERS,
            (shard, ("user", table_to_ipc(_counter_table(ordinals, counters)))),
        )
        rows = counter_rows("user", counter)
        yield pvalue.TaggedOutput(
            FEATURE_ROWS, ("user_counters", shard, table_to_ipc(rows))
        )

        entity_shards = entity_shard_count(self._shards)
        for kind_index, kind in enumerate(ENTITY_KINDS):
            rows = pa.table(
                {
                    "entity_id": to_int64(ads.column(f"{kind}_id")),
                    "time_ms": times,
                    "action": actions.astype(np.int8),
                    "user_shard": np.full(ads.num_rows, shard, np.int32),
                    "ordinal": ad_ordinals,
                },
                schema=ENTITY_ROWS_SCHEMA,
            )
            targets = shard_of(to_int64(rows.column("entity_id")), entity_shards)
            for target, part in split_by_shard(rows, targets):
                yield kind_index * entity_shards + target, table_to_ipc(part)


class CountEntityShardFn(PooledDoFn):
    """An ad / advertiser shard: counters for its queries and its feature rows.

    On worker threads (:class:`~pipelines.batch.parallel.PooledDoFn`), one
    more than the tuning's: the work is sorts and binary searches that release
    the GIL, and nothing fused after this DoFn needs the bundle's thread for
    long.
    """

    emits_little = True

    def __init__(self, shards: int) -> None:
        self._shards = shards

    def prepare(self, element: tuple[int, Iterable[bytes]]) -> tuple[int, list[bytes]]:
        """The entity shard's IPC pieces, as a list."""
        key, parts = element
        return key, list(parts)

    def compute(self, element: tuple[int, list[bytes]]) -> list[Any]:
        """Answer each user shard's queries; the feature rows."""
        key, parts = element
        kind_index, entity_shard = divmod(key, entity_shard_count(self._shards))
        kind = ENTITY_KINDS[kind_index]
        rows = concat([ipc_to_table(p) for p in parts], ENTITY_ROWS_SCHEMA)
        ids = to_int64(rows.column("entity_id"))
        times = to_int64(rows.column("time_ms"))
        actions = to_int64(rows.column("action"))
        ordinals = to_int64(rows.column("ordinal"))
        counter = window_counter(ids, times, actions)
        outputs: list[Any] = [
            pvalue.TaggedOutput(
                FEATURE_ROWS,
                (
                    f"{kind}_counters",
                    entity_shard,
                    table_to_ipc(counter_rows(kind, counter)),
                ),
            )
        ]
        query = ordinals >= 0
        counters = named_counts(kind, counter.count(ids[query], times[query]))
        answers = _counter_table(ordinals[query], counters)
        user_shards = to_int64(rows.column("user_shard"))[query]
        for user_shard, part in split_by_shard(answers, user_shards):
            outputs.append((user_shard, (kind, table_to_ipc(part))))
        return outputs


class CountEngagement(beam.PTransform):  # type: ignore[misc]
    """``(user shard, distinct events)`` -> counters for examples, feature rows.

    Returns a dict: ``example_counters``: ``(user shard, (kind, ordinal +
    counters))`` for every kind; ``feature_rows``: ``(table name, part, rows)`` of
    the three ``*_counters`` feature tables.
    """

    def __init__(self, shards: int) -> None:
        super().__init__()
        self._shards = shards

    def expand(self, events: beam.PCollection) -> dict[str, beam.PCollection]:
        """User kind in place; ad and advertiser through a keyed aggregation."""
        tuning = pipeline_tuning(events.pipeline)
        local = events | "CountUserShards" >> beam.ParDo(
            CountUserShardFn(self._shards).tuned(tuning)
        ).with_outputs(EXAMPLE_COUNTERS, FEATURE_ROWS, main="entity_rows")
        entity = (
            local.entity_rows
            | "TypeEntityRows" >> beam.Map(_same).with_output_types(ShardedIpc)
            | "GroupByEntityShard" >> beam.GroupByKey()
            | "CountEntityShards"
            >> beam.ParDo(CountEntityShardFn(self._shards).tuned(tuning)).with_outputs(
                FEATURE_ROWS, main=EXAMPLE_COUNTERS
            )
        )
        # Typed Flattens (no identity Map after them): the next shuffle then
        # uses a bytes coder, and a runner does not copy the pieces once more.
        example_counters = (
            local[EXAMPLE_COUNTERS],
            entity[EXAMPLE_COUNTERS],
        ) | "AllExampleCounters" >> beam.Flatten().with_output_types(ExampleCounters)
        feature_rows = (
            local[FEATURE_ROWS],
            entity[FEATURE_ROWS],
        ) | "AllFeatureRows" >> beam.Flatten().with_output_types(TablePart)
        return {EXAMPLE_COUNTERS: example_counters, FEATURE_ROWS: feature_rows}


def _same(element: Any) -> Any:
    """Identity; applied with a type hint so the next shuffle uses Arrow IPC."""
    return element
