"""``PushToFeast``: fresh counters and sequences into Feast's online store.

The stateful stages emit feature rows (``user_counters``, ``user_sequence``,
``ad_counters``, ``advertiser_counters``) for the entities each batch touched;
this DoFn pushes them through the repository's push sources
(``store.push("<table>_push", rows)``), one push per table per bundle. Pushes
are idempotent: a replayed or retried push writes the same values, and the
online store keeps the newest row per entity (Feast's Redis store does; the
embedded SQLite store is guarded the same way by
:class:`pipelines.feast_ops.GuardedSqliteOnlineStore`).

Freshness: each row travels with the Kafka record times of the events behind
it; after a push returns, ``now - record time`` of each is how long that event
took to reach the online store. A sample of those figures per push goes to a
JSON-lines file when one is given (what the streaming benchmark reads).
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

from pipelines.streaming.tables import state_table

METRICS_NAMESPACE: Final = "gem.stream"
SAMPLE: Final = 256


class PushToFeastFn(beam.DoFn):  # type: ignore[misc]
    """``(table, rows IPC, published_ms bytes)`` -> ``store.push`` per bundle.

    Args:
        env: Feast configuration (``local`` / ``prod``; see ``feast_ops``).
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
        from feast import FeatureStore

        from pipelines import feast_ops

        config = feast_ops.repo_config(
            self._env,
            state_dir=Path(self._state_dir) if self._state_dir else None,
            project=self._project,
        )
        self._store = FeatureStore(config=config)

    def process(self, element: tuple[str, bytes, bytes]) -> Iterator[Any]:
        """Collect the rows; pushed at the end of the bundle."""
        table, rows, published = element
        self._pending.setdefault(table, []).append(state_table(rows))
        self._published.setdefault(table, []).append(
            np.frombuffer(published, dtype=np.int64)
        )
        yield from ()

    def finish_bundle(self) -> None:
        """One push per table; then the freshness samples."""
        from pipelines.feast_ops import repo_module

        push_source_name = repo_module("sources").push_source_name
        for table, pieces in self._pending.items():
            rows = pa.concat_tables(pieces)
            if rows.num_rows == 0:
                continue
            self._store.push(push_source_name(table), rows.to_pandas())
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
