"""``PushToFeast``: fresh counters and sequences into Feast's online store.

The stateful stages emit feature rows (``user_counters``, ``user_sequence``,
``ad_counters``, ``advertiser_counters``) for the entities each batch touched;
this DoFn writes them, once per table per bundle, to the feature views the
repository's push source of the table (``<table>_push``) feeds: what
``store.push`` does, with the views looked up once per worker instead of in
the registry on every push, and the rows encoded and written by the feature
engine's writer (:func:`pipelines.feast.writers.online_writer`: Feast's
serialized values and layout, byte for byte, for SQLite and Redis alike).
The repository asks no feature service to precompute vectors, the one other
thing a push does.

Per entity only the bundle's newest row is written (the first of equal
times), and only when newer than the stored one: Feast's rule for its Redis
store, which the embedded SQLite store follows too
(:class:`pipelines.feast.sqlite.GuardedSqliteOnlineStore`). So a replayed
or retried write leaves the same values.

Freshness: each row travels with the Kafka record times of the events behind
it; after a write returns, ``now - record time`` of each is how long that
event took to reach the online store. A sample of those figures per write
goes to a JSON-lines file when one is given (what the streaming benchmark
reads).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from pipelines.core.columns import to_int64
from pipelines.streaming.config import METRICS_NAMESPACE
from pipelines.streaming.tables import state_table

SAMPLE: Final = 256


class PushToFeastFn(beam.DoFn):  # type: ignore[misc]
    """``(table, rows IPC, published_ms bytes)`` -> one online write per table
    per bundle (see the module docstring).

    Args:
        env: Feast configuration (``local`` / ``prod``; see :mod:`pipelines.feast.ops`).
        state_dir: local configuration: registry and SQLite directory.
        project: Feast project.
        freshness_jsonl: where to append freshness samples (optional).
    """

    def __init__(
        self,
        env: str | None,
        state_dir: str | None,
        project: str | None,
        freshness_jsonl: str | None = None,
    ) -> None:
        self._env = env
        self._state_dir = state_dir
        self._project = project
        self._freshness_jsonl = freshness_jsonl
        self._store: Any = None
        self._pending: dict[str, list[pa.Table]] = {}
        self._published: dict[str, list[np.ndarray]] = {}
        self.rows = Metrics.counter(METRICS_NAMESPACE, "feast_rows_pushed")

    def setup(self) -> None:
        """Open the feature store (its registry must already be applied)."""
        from pipelines.feast.writers import online_writer

        self._store = open_store(self._env, self._state_dir, self._project)
        self._writer = online_writer(
            self._store._get_provider().online_store, self._store.config
        )
        self._views: dict[str, list[Any]] = {}

    def _views_of(self, table: str) -> list[Any]:
        if table not in self._views:
            self._views[table] = push_views(self._store, table)
        return self._views[table]

    def process(self, element: tuple[str, bytes, bytes]) -> Iterator[Any]:
        """Collect the rows; written at the end of the bundle."""
        table, rows, published = element
        self._pending.setdefault(table, []).append(state_table(rows))
        self._published.setdefault(table, []).append(
            np.frombuffer(published, dtype=np.int64)
        )
        yield from ()

    def finish_bundle(self) -> None:
        """One write per table; then the freshness samples."""
        from pipelines.feast.writers import join_keys_of

        for table, pieces in self._pending.items():
            rows = newest_per_entity(pa.concat_tables(pieces))
            if rows.num_rows == 0:
                continue
            try:
                for view in self._views_of(table):
                    self._writer.write(
                        view, self._writer.encode(view, rows, join_keys_of(view))
                    )
            except BaseException:
                self._writer.finish(True)  # rolled back; the runner retries the bundle
                raise
            self._writer.finish(False)
            self.rows.inc(rows.num_rows)
            done = time.time() * 1000
            self._record(table, done - np.concatenate(self._published[table]))
        self._pending, self._published = {}, {}

    def _record(self, table: str, ages_ms: np.ndarray) -> None:
        if not self._freshness_jsonl or ages_ms.size == 0:
            return
        sample = (
            ages_ms
            if ages_ms.size <= SAMPLE
            else np.asarray(random.sample(list(ages_ms), SAMPLE))
        )
        line = {
            "time": time.time(),
            "table": table,
            "events": int(ages_ms.size),
            "freshness_ms": [round(float(v), 1) for v in sample],
        }
        with open(self._freshness_jsonl, "a") as file:
            file.write(json.dumps(line) + "\n")


def newest_per_entity(rows: pa.Table) -> pa.Table:
    """Each entity's newest row, in entity order; of rows at equal times the
    last. A later row at the same event time is a correction (pushed again
    once a duplicate copy lost), so it supersedes the row before it.

    The rows' first column is the entity key, as in every pushed table.
    """
    if rows.num_rows == 0:
        return rows
    keys = to_int64(rows.column(0))
    times = to_int64(rows.column("event_timestamp"))
    arrival = np.arange(rows.num_rows)
    order = np.lexsort((-arrival, -times, keys))
    first = np.r_[True, keys[order][1:] != keys[order][:-1]]
    return rows.take(pa.array(order[first]))


def open_store(env: str | None, state_dir: str | None, project: str | None) -> Any:
    """The Feast store the job writes to (a :mod:`pipelines.feast.ops` config)."""
    from feast import FeatureStore

    from pipelines.feast import ops as feast_ops

    config = feast_ops.repo_config(
        env, state_dir=Path(state_dir) if state_dir else None, project=project
    )
    return FeatureStore(config=config)


def push_views(store: Any, table: str) -> list[Any]:
    """The feature views the table's push source feeds (as ``push`` finds them)."""
    from pipelines.feast.ops import repo_module

    source = repo_module("sources").push_source_name(table)
    views = [
        view
        for view in store.list_feature_views()
        if view.stream_source is not None and view.stream_source.name == source
    ]
    if not views:
        raise ValueError(
            f"no feature view of project {store.project!r} is fed by the push "
            f"source {source!r}: apply the repository to it first "
            "(python -m pipelines.feast apply --features-dir DIR)"
        )
    return views


def check_push_target(
    env: str | None, state_dir: str | None, project: str | None
) -> None:
    """Fail before the stream starts when the store cannot take the pushes.

    Also loads Feast in this process, where a local runner's workers run:
    the first bundles do not wait for it.
    """
    from pipelines.feast.ops import repo_module

    store = open_store(env, state_dir, project)
    for table in repo_module("sources").PUSHED_TABLES:
        push_views(store, table)
