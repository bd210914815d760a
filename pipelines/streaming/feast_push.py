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
feeds the Beam metrics of namespace ``gem.stream`` (the distribution
``event_to_online_ms``; the gauges ``event_to_online_p50_ms`` and
``_p99_ms`` over the worker's last :data:`RECENT` samples), the job's
Prometheus registry (:mod:`pipelines.beam.prometheus`, served where the
workers are the job's own process) and, when one is given, a JSON-lines
file (what the streaming benchmark reads).

What the DoFn carries into the job's graph is :class:`PushTarget`: names
and paths only. The store's endpoints, and any password in them, are read
from each worker's environment when it opens the store at ``setup()``;
the prod configuration without them stops the worker there, in one line
(:func:`features.feast_repository.check_endpoints`).
"""

from __future__ import annotations

import collections
import json
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from pipelines.beam import prometheus
from pipelines.core.columns import to_int64
from pipelines.streaming.config import METRICS_NAMESPACE
from pipelines.streaming.tables import state_table

SAMPLE: Final = 256
RECENT: Final = 4096
"""Freshness samples a worker keeps for its percentile gauges."""
SECONDS_BUCKETS: Final = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass(frozen=True)
class PushTarget:
    """The Feast store the job pushes to, as the graph carries it.

    Attributes:
        env: Feast configuration (``local`` / ``prod``; see :mod:`pipelines.feast.ops`).
        state_dir: local configuration: registry and SQLite directory.
        project: Feast project.
        repo: the feature repository folder (None: the installed one).
        push_sources: each pushed table's push source, by table, as the
            repository names them (read once, at the job's start).
    """

    env: str | None
    state_dir: str | None
    project: str | None
    repo: str | None = None
    push_sources: Mapping[str, str] | None = None


class Freshness:
    """Event-to-online ages of one worker: Beam metrics and Prometheus."""

    def __init__(self) -> None:
        self.ages = Metrics.distribution(METRICS_NAMESPACE, "event_to_online_ms")
        self.p50 = Metrics.gauge(METRICS_NAMESPACE, "event_to_online_p50_ms")
        self.p99 = Metrics.gauge(METRICS_NAMESPACE, "event_to_online_p99_ms")
        self._recent: collections.deque[float] = collections.deque(maxlen=RECENT)

    def record(self, ages_ms: np.ndarray) -> None:
        """Count a write's sampled ages; the percentiles of the recent ones."""
        histogram = prometheus.histogram(
            "gem_stream_event_to_online_seconds",
            "seconds from an event's Kafka record time to its values in the "
            "online store (sampled per write)",
            SECONDS_BUCKETS,
        )
        for age in ages_ms:
            self.ages.update(int(age))
            histogram.observe(float(age) / 1000)
        self._recent.extend(float(age) for age in ages_ms)
        p50, p99 = np.percentile(np.fromiter(self._recent, float), [50, 99])
        self.p50.set(int(p50))
        self.p99.set(int(p99))
        for name, value in (("p50", p50), ("p99", p99)):
            prometheus.gauge(
                f"gem_stream_event_to_online_{name}_seconds",
                f"{name} of the worker's last {RECENT} event-to-online ages",
            ).set(float(value) / 1000)


class PushToFeastFn(beam.DoFn):  # type: ignore[misc]
    """``(table, rows IPC, published_ms bytes)`` -> one online write per table
    per bundle (see the module docstring).

    Args:
        target: the store (:func:`check_push_target`'s answer).
        freshness_jsonl: where to append freshness samples (optional).
    """

    def __init__(self, target: PushTarget, freshness_jsonl: str | None = None) -> None:
        self._target = target
        self._freshness_jsonl = freshness_jsonl
        self._store: Any = None
        self._pending: dict[str, list[pa.Table]] = {}
        self._published: dict[str, list[np.ndarray]] = {}
        self.rows = Metrics.counter(METRICS_NAMESPACE, "feast_rows_pushed")

    def setup(self) -> None:
        """Open the feature store (its registry must already be applied),
        with the endpoints of this worker's environment."""
        from pipelines.feast.writers import online_writer

        target = self._target
        self._store = open_store(
            target.env, target.state_dir, target.project, target.repo
        )
        self._writer = online_writer(
            self._store._get_provider().online_store, self._store.config
        )
        self._views: dict[str, list[Any]] = {}
        self._freshness = Freshness()

    def _views_of(self, table: str) -> list[Any]:
        if table not in self._views:
            sources = self._target.push_sources or {}
            self._views[table] = push_views(self._store, table, sources.get(table))
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
        if ages_ms.size == 0:
            return
        sample = (
            ages_ms
            if ages_ms.size <= SAMPLE
            else np.asarray(random.sample(list(ages_ms), SAMPLE))
        )
        self._freshness.record(sample)
        if not self._freshness_jsonl:
            return
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


def open_store(
    env: str | None,
    state_dir: str | None,
    project: str | None,
    repo: str | None = None,
) -> Any:
    """The Feast store the job writes to (a :mod:`pipelines.feast.ops` config).

    Raises:
        features.feast_repository.MissingEndpointError: prod without its endpoints.
    """
    from feast import FeatureStore

    from pipelines.feast import ops as feast_ops

    config = feast_ops.repo_config(
        env,
        state_dir=Path(state_dir) if state_dir else None,
        project=project,
        repo=repo,
    )
    return FeatureStore(config=config)


def push_views(store: Any, table: str, source: str | None = None) -> list[Any]:
    """The feature views the table's push source feeds (as ``push`` finds
    them); ``source`` names it, else the repository's ``sources.py`` does."""
    from pipelines.feast.ops import repo_module

    source = source or repo_module("sources").push_source_name(table)
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
    env: str | None,
    state_dir: str | None,
    project: str | None,
    repo: str | None = None,
) -> PushTarget:
    """Fail before the stream starts when the store cannot take the pushes;
    the target the workers push to.

    The push sources are read from the repository here, so a worker needs
    the repository's yaml only. Also loads Feast in this process, where a
    local runner's workers run: the first bundles do not wait for it.

    Raises:
        ValueError: one line (no such view, prod without its endpoints).
    """
    from pipelines.feast.ops import repo_module

    store = open_store(env, state_dir, project, repo)
    sources = repo_module("sources", repo)
    names = {table: sources.push_source_name(table) for table in sources.PUSHED_TABLES}
    for table, source in names.items():
        push_views(store, table, source)
    return PushTarget(env, state_dir, project, repo, names)
