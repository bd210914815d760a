"""The streaming job's push stage writes what ``store.push`` writes.

The same bundle of rows (rows for a few entities, newer rows for them, then
older rows with other values) goes
through :class:`PushToFeastFn` into one Feast project and through
``store.push``, piece by piece, into another; both projects then serve the
same values, and on Redis hold the same bytes. On the embedded SQLite store
and on the production-like Redis store (``make test`` starts Redis).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from feast import FeatureStore

from benchmarks.bench_feast import REDIS
from features import feast_repository
from features.feature_tables import EVENT_TIMESTAMP, FEATURE_TABLES, read_feature_table
from pipelines.beam import prometheus
from pipelines.feast import ops as feast_ops
from pipelines.streaming.feast_push import (
    PushTarget,
    PushToFeastFn,
    check_push_target,
    newest_per_entity,
)
from pipelines.streaming.tables import state_bytes
from tests.test_feast_prod import needs_redis, redis_hashes
from tests.test_feast_store import FeatureJob, make_feature_job, plain

pytestmark = pytest.mark.integration

PUSHED = ("user_counters", "user_sequence", "ad_counters", "advertiser_counters")
ENTITIES = 12


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> FeatureJob:
    return make_feature_job(tmp_path_factory.mktemp("features"))


def _shifted(rows: pa.Table, ms: int) -> pa.Table:
    column = rows.schema.get_field_index(EVENT_TIMESTAMP)
    stamps = rows.column(EVENT_TIMESTAMP)
    per_ms = {"ms": 1, "us": 1_000, "ns": 1_000_000}[stamps.type.unit]
    moved = pc.add(stamps.cast(pa.int64()), ms * per_ms).cast(stamps.type)
    return rows.set_column(column, rows.schema.field(column), moved)


def _changed(rows: pa.Table) -> pa.Table:
    """The rows with every float feature changed (the same entities and times)."""
    for name in rows.column_names:
        if pa.types.is_floating(rows.schema.field(name).type):
            index = rows.schema.get_field_index(name)
            values = pc.add(rows.column(name), pa.scalar(1.0, rows.column(name).type))
            rows = rows.set_column(index, rows.schema.field(index), values)
    return rows


def bundle(job: FeatureJob, table: str) -> list[pa.Table]:
    """Rows for a few entities, then newer ones, then older ones that differ.

    No two rows of an entity share a second: Feast's SQLite store keeps
    event times in whole seconds and its Redis store in nanoseconds, so
    they settle such rows differently.
    """
    rows = read_feature_table(job.directory, table)
    newest = newest_per_entity(rows).slice(0, ENTITIES)
    fresh = _shifted(newest, 86_400_000)
    return [newest, fresh, _changed(_shifted(newest, 60_000))]


def _store(env: str, state_dir: Path, project: str) -> FeatureStore:
    return FeatureStore(
        config=feast_ops.repo_config(env, state_dir=state_dir, project=project)
    )


@pytest.fixture(params=["local", pytest.param("prod", marks=needs_redis)])
def env(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    if request.param == "prod":
        registry = f"sqlite:///{tmp_path / 'registry.db'}"
        monkeypatch.setenv(feast_repository.REGISTRY_URL_VAR, registry)
        monkeypatch.setenv(feast_repository.REDIS_VAR, REDIS)
    return str(request.param)


def test_the_push_stage_writes_what_store_push_writes(
    job: FeatureJob, env: str, tmp_path: Path
) -> None:
    projects = [f"t_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    by_push, by_stage = (_store(env, tmp_path, p) for p in projects)
    try:
        for store in (by_push, by_stage):
            feast_ops.apply(store, job.directory)
        stage = PushToFeastFn(PushTarget(env, str(tmp_path), projects[1]))
        stage.setup()
        for table in PUSHED:
            for piece in bundle(job, table):
                by_push.push(f"{table}_push", piece.to_pandas())
                published = np.zeros(piece.num_rows, np.int64).tobytes()
                list(stage.process((table, state_bytes(piece), published)))
        stage.finish_bundle()

        for table in PUSHED:
            spec = FEATURE_TABLES[table]
            fresh = bundle(job, table)[1]
            keys = [{spec.entity: k} for k in fresh.column(spec.entity).to_pylist()]
            features = [f"{table}:{name}" for name in spec.feature_names]
            pushed, staged = (
                store.get_online_features(features=features, entity_rows=keys).to_dict()
                for store in (by_push, by_stage)
            )
            for name in spec.feature_names:
                expected = [plain(v) for v in fresh.column(name).to_pylist()]
                assert [plain(v) for v in staged[name]] == expected, (table, name)
                assert [plain(v) for v in pushed[name]] == expected, (table, name)
        if env == "prod":
            assert redis_hashes(by_stage) == redis_hashes(by_push)
    finally:
        for store in (by_push, by_stage):
            store.teardown()


def test_the_job_refuses_a_store_whose_registry_is_not_applied(
    tmp_path: Path,
) -> None:
    with pytest.raises(ValueError, match="apply the repository"):
        check_push_target("local", str(tmp_path), f"t_{uuid.uuid4().hex[:10]}")


def test_of_rows_at_one_event_time_the_last_is_pushed() -> None:
    """A correction pushed at the event time of the row it corrects, in the
    same bundle, is the row written; the newest time still wins over it."""
    rows = pa.table(
        {
            "user_id": pa.array([7, 7, 8, 7, 8], pa.int64()),
            "event_timestamp": pa.array([5, 5, 9, 4, 3], pa.int64()),
            "user_impression_count_7d": [24.0, 23.0, 1.0, 99.0, 2.0],
        }
    )
    newest = newest_per_entity(rows)
    assert newest.column("user_id").to_pylist() == [7, 8]
    assert newest.column("user_impression_count_7d").to_pylist() == [23.0, 1.0]


def test_freshness_percentiles_reach_the_job_s_prometheus_registry(
    job: FeatureJob, tmp_path: Path
) -> None:
    project = f"t_{uuid.uuid4().hex[:10]}"
    store = _store("local", tmp_path, project)
    feast_ops.apply(store, job.directory)
    stage = PushToFeastFn(PushTarget("local", str(tmp_path), project))
    stage.setup()
    piece = bundle(job, "user_counters")[0]
    # Events published 1 s and 3 s before the write: ages of about that.
    now_ms = int(time.time() * 1000)
    ages = np.where(np.arange(piece.num_rows) % 2 == 0, 1000, 3000)
    published = (now_ms - ages).astype(np.int64).tobytes()
    list(stage.process(("user_counters", state_bytes(piece), published)))
    stage.finish_bundle()
    sample = prometheus.REGISTRY.get_sample_value
    p50 = sample("gem_stream_event_to_online_p50_seconds")
    p99 = sample("gem_stream_event_to_online_p99_seconds")
    assert p50 is not None
    assert p99 is not None
    assert 1.0 <= p50 <= p99 < 3.0 + 60  # the write's own time on top
    assert p99 >= 3.0
    assert sample("gem_stream_event_to_online_seconds_count") >= piece.num_rows
