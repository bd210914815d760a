"""Feast on the production-like configuration: Redis online store, SQL registry
on PostgreSQL, both on 127.0.0.1 (``make test`` starts them when they are
down: ``scripts/services.sh``).

Isolation: each test uses its own Feast project (which prefixes every Redis
key, and which ``store.teardown()`` deletes) and its own PostgreSQL database,
created and dropped here. The tests skip, saying which package is missing,
when the Python clients Feast needs are not installed (``redis`` for the
Redis store, ``psycopg`` for the ``postgresql+psycopg://`` registry URL).
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from feast import FeatureStore
from feast.value_type import ValueType

from benchmarks.bench_feast import REDIS, redis_store
from features import feast_repository
from features.feature_tables import FEATURE_TABLES
from pipelines.feast import command as feast_command
from pipelines.feast import ops as feast_ops
from tests.interpreter import run_python
from tests.test_feast_store import (
    FeatureJob,
    active_user,
    assert_older_window_keeps_newer_values,
    assert_push_visible_within_a_second,
    assert_same_online_values,
    make_feature_job,
    materialize_in_two_steps,
    plain,
    sql_registry_config,
    table_rows,
)

pytestmark = pytest.mark.integration

PG_SERVER = os.environ.get("GEM_FEAST_PG", "root@127.0.0.1:5432")
"""user@host:port of the PostgreSQL server that holds the test registries."""

needs_redis = pytest.mark.skipif(
    importlib.util.find_spec("redis") is None,
    reason="the `redis` package (redis-py, feast[redis]: redis>=4.2.2,<8) is not "
    "installed, so Feast's Redis online store cannot load",
)
needs_psycopg = pytest.mark.skipif(
    importlib.util.find_spec("psycopg") is None,
    reason="the `psycopg` package (psycopg 3, feast[postgres]: psycopg[binary]) is "
    "not installed, so the postgresql+psycopg:// SQL registry cannot connect",
)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> FeatureJob:
    return make_feature_job(tmp_path_factory.mktemp("features"))


@pytest.fixture
def project() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def pg_registry_url() -> Iterator[str]:
    """A SQLAlchemy URL of a fresh PostgreSQL database, dropped afterwards."""
    import psycopg

    user, _, address = PG_SERVER.partition("@")
    host, _, port = address.partition(":")
    database = f"gem_feast_{uuid.uuid4().hex[:12]}"
    admin = {"host": host, "port": int(port), "user": user, "dbname": "postgres"}
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    try:
        yield f"postgresql+psycopg://{user}@{host}:{port}/{database}"
    finally:
        with psycopg.connect(**admin, autocommit=True) as conn:
            # FORCE: the registry's SQLAlchemy pool may still hold connections.
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def redis_hashes(store: FeatureStore) -> dict[bytes, dict[bytes, bytes]]:
    """Every hash of the store's project, by key without the project suffix."""
    import redis

    suffix = store.project.encode()
    host, _, port = REDIS.split(",")[0].partition(":")
    client = redis.Redis(host=host, port=int(port or 6379))
    try:
        keys = list(client.scan_iter(match=b"*" + suffix, count=1000))
        return {
            key[: -len(suffix)]: client.hgetall(key)  # type: ignore[misc]
            for key in keys
        }
    finally:
        client.close()


def assert_online_is_latest(store: FeatureStore, job: FeatureJob) -> None:
    user = active_user(job)
    got = store.get_online_features(
        features=store.get_feature_service("user_context_v1"),
        entity_rows=[{"user_id": user}],
    ).to_dict()
    for view in ("user_profile", "user_counters", "user_sequence"):
        latest = max(table_rows(job.directory, view)[user], key=lambda r: r["ts"])
        for name in FEATURE_TABLES[view].feature_names:
            assert plain(got[name][0]) == plain(latest[name]), (view, name)


@needs_redis
@pytest.mark.parametrize("engine", ["arrow", "feast"])
def test_redis_keeps_newer_values_and_serves_pushes_within_a_second(
    tmp_path: Path, job: FeatureJob, project: str, engine: feast_ops.Engine
) -> None:
    store = redis_store(tmp_path, project, engine)
    assert feast_ops.configured_engine(store) == engine
    try:
        feast_ops.apply(store, job.directory)
        values = assert_older_window_keeps_newer_values(store, job)
        assert values["got"] == values["latest"]
        assert_online_is_latest(store, job)
        assert_push_visible_within_a_second(store, job, active_user(job))
    finally:
        store.teardown()


@needs_redis
def test_redis_arrow_engine_writes_what_feasts_engine_writes(
    tmp_path: Path, job: FeatureJob
) -> None:
    """Our engine (the prod yaml's) against Feast's stock engine and Redis
    writer, incremental twice, a project each: the same hashes (keys, fields,
    serialized values and timestamps), so the same values through Feast's read
    path, for every view and entity."""
    stores = {
        engine: redis_store(tmp_path, f"t_{uuid.uuid4().hex[:12]}", engine)
        for engine in ("arrow", "feast")
    }
    try:
        for store in stores.values():
            materialize_in_two_steps(store, job)
        assert_same_online_values(stores, job)
        ours, feasts = (redis_hashes(store) for store in stores.values())
        users = set(table_rows(job.directory, "user_profile"))
        assert len(ours) >= len(users)
        assert ours == feasts
    finally:
        for store in stores.values():
            store.teardown()


@needs_psycopg
def test_sql_registry_on_postgres(
    tmp_path: Path, job: FeatureJob, project: str, pg_registry_url: str
) -> None:
    config = sql_registry_config(project, pg_registry_url, tmp_path)
    store = FeatureStore(config=config)
    feast_ops.apply(store, job.directory)
    feast_ops.materialize(store)
    # Another process sees the registry (and the materialized intervals).
    other = FeatureStore(config=config)
    assert {v.name for v in other.list_feature_views()} == set(FEATURE_TABLES)
    assert all(v.most_recent_end_time for v in other.list_feature_views())
    assert_online_is_latest(other, job)


@needs_redis
@needs_psycopg
def test_prod_configuration_end_to_end(
    monkeypatch: pytest.MonkeyPatch,
    job: FeatureJob,
    project: str,
    pg_registry_url: str,
) -> None:
    """GEM_FEAST_ENV=prod: the yaml's Redis + PostgreSQL, through our CLI."""
    monkeypatch.setenv(feast_repository.ENV_VAR, "prod")
    monkeypatch.setenv(feast_repository.REGISTRY_URL_VAR, pg_registry_url)
    monkeypatch.setenv(feast_repository.REDIS_VAR, REDIS)
    base = ["--features-dir", str(job.directory), "--project", project]
    store = FeatureStore(config=feast_ops.repo_config(project=project))
    try:
        assert feast_command.main([*base, "apply"]) == 0
        assert feast_command.main([*base, "materialize"]) == 0
        assert store.config.online_store.type == "redis"  # Feast's own store
        assert store.config.registry.registry_type == "sql"
        assert store.config.registry.path == pg_registry_url
        assert_online_is_latest(store, job)
    finally:
        store.teardown()


@needs_redis
@needs_psycopg
def test_feast_cli_reads_the_prod_endpoints_from_the_environment(
    tmp_path: Path, job: FeatureJob, project: str, pg_registry_url: str
) -> None:
    """``feast -f feature_store.prod.yaml apply`` / ``materialize-incremental``
    (Feast's CLI, a subprocess) with ``$GEM_FEAST_REGISTRY_URL`` and
    ``$GEM_FEAST_REDIS`` exported: Feast expands them, so the registry lands
    in that PostgreSQL database and the values in that Redis."""
    from tests.test_feast_cli import clean_env, fresh_clone

    repo = fresh_clone(tmp_path)
    prod = repo / "feature_store.prod.yaml"
    # A project of its own: it namespaces the Redis keys teardown deletes.
    prod.write_text(prod.read_text().replace("project: gem_ads", f"project: {project}"))
    env = clean_env(
        GEM_FEATURES_DIR=str(job.directory),
        **{
            feast_repository.REGISTRY_URL_VAR: pg_registry_url,
            feast_repository.REDIS_VAR: REDIS,
        },
    )
    script = (
        "import sys\n"
        "from feast.cli.cli import cli\n"
        "for args in (['apply'], ['materialize-incremental', '2030-01-01T00:00:00']):\n"
        "    cli(['-c', 'feature_repo', '-f', sys.argv[1], *args],"
        " standalone_mode=False)\n"
    )
    # Both commands in one interpreter: Feast's import alone takes seconds.
    done = run_python(script, str(prod), cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    store = FeatureStore(
        config=feast_ops.repo_config(
            "prod", project=project, registry_url=pg_registry_url, redis=REDIS
        )
    )
    try:
        assert {v.name for v in store.list_feature_views()} == set(FEATURE_TABLES)
        assert_online_is_latest(store, job)
    finally:
        store.teardown()


def profile_rows(users: list[int], ms: int, value: int) -> pa.RecordBatch:
    """``user_profile`` rows for ``users`` at epoch ``ms``, every id ``value``."""
    names = FEATURE_TABLES["user_profile"].feature_names
    return pa.RecordBatch.from_pydict(
        {
            "user_id": pa.array(users, pa.int64()),
            "event_timestamp": pa.array([ms] * len(users), pa.timestamp("ms", "UTC")),
            **{n: pa.array([value] * len(users), pa.int64()) for n in names},
        }
    )


@needs_redis
def test_redis_writes_stay_atomic_when_a_concurrent_write_lands(
    tmp_path: Path, job: FeatureJob, project: str
) -> None:
    """Our Redis writer checks event times, then writes in MULTI/EXEC with the
    keys WATCHed. A write landing between the check and the EXEC (a push)
    aborts the transaction; the chunk is then checked and written again in
    one script, so the newer pushed row survives and the rest are written."""
    from pipelines.feast import encode as feast_encode
    from pipelines.feast import redis_writer

    store = redis_store(tmp_path, project)
    try:
        feast_ops.apply(store, job.directory)
        view = store.get_feature_view("user_profile")
        online = store._get_provider().online_store
        users = list(range(10**9, 10**9 + 10))

        def commands(users: list[int], ms: int, value: int) -> Any:
            rows = feast_encode.encode_batch(
                profile_rows(users, ms, value),
                {f.name: f.dtype.to_value_type() for f in view.features},
                {"user_id": ValueType.INT64},
                "event_timestamp",
            )
            return redis_writer.redis_commands(store.config, view, rows)

        base = 1_790_000_000_000
        first = redis_writer.RedisWriter(online, store.config)
        first.write(commands(users, base, 1))
        assert first.finish() == len(users)

        class Interrupted(redis_writer.RedisWriter):
            """Another client writes a newer row for one of the keys right
            after the check, before the transaction goes out."""

            pushed = False

            def _read_check(self, *args: Any) -> Any:
                fresh = super()._read_check(*args)
                if not self.pushed:
                    self.pushed = True
                    push = redis_writer.RedisWriter(online, store.config)
                    push.write(commands([users[3]], base + 2000, 3))
                    assert push.finish() == 1
                return fresh

        writer = Interrupted(online, store.config)
        writer.write(commands(users, base + 1000, 2))
        assert writer.finish() == len(users) - 1
        assert writer.retried == 1
        got = store.get_online_features(
            features=["user_profile:user_gender"],
            entity_rows=[{"user_id": u} for u in users],
        ).to_dict()["user_gender"]
        assert got == [3 if u == users[3] else 2 for u in users]
        # An older window changes nothing.
        older = redis_writer.RedisWriter(online, store.config)
        older.write(commands(users, base, 9))
        assert older.finish() == 0
    finally:
        store.teardown()
