"""``BuildExamples``: one training example per distinct impression.

Per user shard, the example bases of its distinct events in timeline order
(:func:`pipelines.core.examples.example_bases`), then a GroupByKey on the
user shard joins the counters of
:class:`~pipelines.batch.counters.CountEngagement` back by ordinal
(:func:`pipelines.core.examples.join_counters`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics

from features.arrow_ipc import ipc_to_table, table_to_ipc
from pipelines.batch.arrow import ShardedTable, TablePart, TaggedIpc
from pipelines.batch.parallel import PooledDoFn
from pipelines.batch.tuning import pipeline_tuning
from pipelines.batch.validate import METRICS_NAMESPACE
from pipelines.core.examples import example_bases, join_counters, profile_rows

BASE = "base"


class BuildProfiles(beam.PTransform):  # type: ignore[misc]
    """``(users, ads)`` -> ``("user_profile" | "ad_profile", 0, rows)``: each
    profile table in one part."""

    def expand(self, tables: tuple[Any, Any]) -> beam.PCollection:
        """One feature-table piece per dimension table."""
        users, ads = tables
        user_rows = users | "UserProfiles" >> beam.Map(
            lambda t: ("user_profile", 0, table_to_ipc(profile_rows("user_profile", t)))
        ).with_output_types(TablePart)
        ad_rows = ads | "AdProfiles" >> beam.Map(
            lambda t: ("ad_profile", 0, table_to_ipc(profile_rows("ad_profile", t)))
        ).with_output_types(TablePart)
        return (user_rows, ad_rows) | "Profiles" >> beam.Flatten().with_output_types(
            TablePart
        )


class ExampleBasesFn(PooledDoFn):
    """``(shard, distinct events)`` -> ``(shard, ("base", example bases))``, on
    a worker thread (:class:`~pipelines.batch.parallel.PooledDoFn`)."""

    def __init__(self) -> None:
        self.impressions = Metrics.counter(METRICS_NAMESPACE, "impressions")

    def process(
        self,
        element: ShardedTable,
        users: pa.Table,
        ads: pa.Table,
        window: Any = beam.DoFn.WindowParam,
    ) -> Iterator[tuple[int, TaggedIpc]]:
        """Queue the shard's bases (the dimension tables go along)."""
        yield from self.submit((element, users, ads), window)

    def compute(
        self, work: tuple[ShardedTable, pa.Table, pa.Table]
    ) -> tuple[int, int, bytes]:
        """Build the shard's example bases, as IPC."""
        (shard, events), users, ads = work
        bases = example_bases(events, users, ads)
        return shard, bases.num_rows, table_to_ipc(bases)

    def emit(self, result: tuple[int, int, bytes]) -> Iterator[tuple[int, TaggedIpc]]:
        """Count the impressions; the shard's bases."""
        shard, impressions, data = result
        self.impressions.inc(impressions)
        yield shard, (BASE, data)


class JoinCountersFn(PooledDoFn):
    """``(shard, [bases and counter pieces])`` -> ``(shard, examples)``, on a
    worker thread (:class:`~pipelines.batch.parallel.PooledDoFn`), so the next
    shard is joined while the writer sorts and writes the last."""

    def prepare(
        self, element: tuple[int, Iterable[TaggedIpc]]
    ) -> tuple[int, list[TaggedIpc]]:
        """The shard's pieces, as a list."""
        shard, pieces = element
        return shard, list(pieces)

    def compute(self, element: tuple[int, list[TaggedIpc]]) -> list[ShardedTable]:
        """Join the shard's example bases with every kind's counters."""
        shard, pieces = element
        tables = [(tag, ipc_to_table(data)) for tag, data in pieces]
        bases = [table for tag, table in tables if tag == BASE]
        counters = [table for tag, table in tables if tag != BASE]
        if len(bases) != 1:
            raise ValueError(f"shard {shard}: {len(bases)} example bases, expected 1")
        return [(shard, join_counters(bases[0], counters))]


class BuildExamples(beam.PTransform):  # type: ignore[misc]
    """``(shard, distinct events)`` + counters -> ``(shard, examples)``.

    Args:
        counters: ``CountEngagement``'s ``example_counters`` output.
        users: the users table (singleton PCollection).
        ads: the ads table (singleton PCollection).
    """

    def __init__(self, counters: Any, users: Any, ads: Any) -> None:
        super().__init__()
        self._counters = counters
        self._users = users
        self._ads = ads

    def expand(self, events: beam.PCollection) -> beam.PCollection:
        """Bases per shard, then one keyed join with the counters."""
        # Side inputs by position: the DoFn's process also takes the window.
        bases = events | "Bases" >> beam.ParDo(
            ExampleBasesFn().tuned(pipeline_tuning(events.pipeline)),
            beam.pvalue.AsSingleton(self._users),
            beam.pvalue.AsSingleton(self._ads),
        ).with_output_types(tuple[int, TaggedIpc])
        return (
            (bases, self._counters)
            | "BasesAndCounters"
            >> beam.Flatten().with_output_types(tuple[int, TaggedIpc])
            | "GroupByShard" >> beam.GroupByKey()
            | "JoinCounters"
            >> beam.ParDo(
                JoinCountersFn().tuned(pipeline_tuning(events.pipeline))
            ).with_output_types(ShardedTable)
        )
