"""Feast materialization throughput and online latency, each against a peer.

    python -m benchmarks.bench_feast [--users 100000] [--seq-len 256]
        [--requests 10000] [--json]

One user-keyed table of each kind the feature job writes, one row per user:
``user_profile`` (4 ids), ``user_counters`` (9 float32 counters) and
``user_sequence`` (6 list columns of ``--seq-len`` events each), in the
contract's schemas, straight from numpy (no feature job needed).

- **SQLite**: ``store.materialize`` of the three views (what ``feast
  materialize`` runs) on the repository's embedded configuration
  (``feature_store.yaml``: the guarded SQLite store and the batch engine
  :mod:`pipelines.feast.engine`: pyarrow read of the window, whole-column
  encoding to Feast's bytes, bulk upsert); with ``--feast-engine`` also
  Feast's stock local engine on the same tables into the same kind of store
  (Dask read, Feast's per-value converter), and the ratio. Peer:
  ``sqlite3.executemany`` of exactly the rows Feast wrote (read back from its
  table: same keys, same serialized values) into a fresh table with the same
  DDL (table and its ``entity_key`` index), one transaction.
- **Redis**: ``store.materialize`` on the repository's prod configuration
  (``feature_store.prod.yaml``: Redis, same engine; its SQL registry on a
  SQLite file here). Peer: a redis-py pipeline writing exactly the hashes
  Feast wrote (read back with HGETALL). ``--feast-engine``: Feast's stock
  engine too, into a project of its own.
- **Online latency**: ``get_online_features`` of the ``user_context_v1``
  service (profile, counters, sequence) for one random user, ``--requests``
  times, p50 / p99 of wall and CPU time; against Redis (the prod yaml's:
  Feast's Redis store) and SQLite (the guarded store).
  The machine's load average is printed with the results.

Rows/s counts view rows (users x 3 views). Needs the ``redis`` package for the
Redis parts, which are skipped with a note otherwise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import sqlite3
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from feast import FeatureStore
from feast.infra.online_stores.helpers import compute_table_id

from benchmarks.machine import cpu_model
from features import feast_repository
from features.feature_tables import FEATURE_TABLES, table_folder
from pipelines.feast import ops as feast_ops

VIEWS = ("user_profile", "user_counters", "user_sequence")
EPOCH = dt.datetime(1970, 1, 2, tzinfo=dt.UTC)
REDIS = os.environ.get(feast_repository.REDIS_VAR, "127.0.0.1:6379")


def build_tables(directory: Path, users: int, seq_len: int, seed: int = 0) -> None:
    """Write the three user tables (one row per user) under ``directory``."""
    rng = np.random.default_rng(seed)
    user_ids = pa.array(np.arange(users, dtype=np.int64))
    base_ms = 1_790_000_000_000
    times = pa.array(base_ms + rng.integers(0, 86_400_000, users)).cast(
        pa.timestamp("ms", tz="UTC")
    )
    for name in VIEWS:
        schema = FEATURE_TABLES[name].schema
        arrays: list[pa.Array] = [user_ids, times]
        for field in list(schema)[2:]:
            if pa.types.is_list(field.type):
                value_type = field.type.value_type
                flat = rng.integers(0, 1_000_000, users * seq_len).astype(
                    value_type.to_pandas_dtype()
                )
                offsets = pa.array(np.arange(users + 1, dtype=np.int32) * seq_len)
                arrays.append(pa.ListArray.from_arrays(offsets, pa.array(flat)))
            elif pa.types.is_floating(field.type):
                arrays.append(pa.array(rng.integers(0, 500, users).astype(np.float32)))
            else:
                arrays.append(pa.array(rng.integers(1, 10_000, users)))
        folder = table_folder(directory, name)
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(
            pa.Table.from_arrays(arrays, schema=schema), folder / "part-0.parquet"
        )


def user_objects(features_dir: Path) -> list[Any]:
    """The user entity and the three user views, reading ``features_dir``."""
    objects = feast_ops.repo_objects(features_dir)
    return [objects.entities["user_id"], *(objects.views[v] for v in VIEWS)]


def materialize_seconds(store: FeatureStore, features_dir: Path) -> float:
    """``store.materialize`` of the three views (what ``feast materialize``
    runs, through the store's configured engine), after the table check."""
    store.apply(user_objects(features_dir))
    started = time.perf_counter()
    feast_ops.materialize(
        store, start=EPOCH, end=dt.datetime.now(dt.UTC), views=VIEWS, quiet=True
    )
    return time.perf_counter() - started


# --- SQLite ----------------------------------------------------------------------


def sqlite_store(state: Path, engine: feast_ops.Engine | None = None) -> FeatureStore:
    """The repository's embedded configuration (``feature_store.yaml``: guarded
    SQLite store, our batch engine unless ``engine``), state under ``state``."""
    return FeatureStore(
        config=feast_ops.repo_config(
            "local", state_dir=state, project="bench", engine=engine
        )
    )


def sqlite_peer_seconds(store: FeatureStore, state: Path) -> tuple[float, int]:
    """executemany of the rows Feast wrote, into a fresh DB; (seconds, rows)."""
    source = sqlite3.connect(store.config.online_store.path)
    seconds = 0.0
    rows = 0
    target_path = state / "peer.db"
    target = sqlite3.connect(target_path)
    for view in VIEWS:
        table = compute_table_id(store.project, store.get_feature_view(view))
        # The table and its index on entity_key, as Feast's store creates them
        # (every index the store's writes maintain, the peer's maintain too).
        ddl = source.execute(
            "SELECT sql FROM sqlite_master WHERE tbl_name = ? AND sql IS NOT NULL "
            "ORDER BY type = 'index'",
            (table,),
        ).fetchall()
        assert len(ddl) == 2, ddl  # CREATE TABLE, CREATE INDEX ..._ek
        for (statement,) in ddl:
            target.execute(statement)
        columns = "entity_key, feature_name, value, value_text, event_ts, created_ts"
        data = source.execute(f'SELECT {columns} FROM "{table}"').fetchall()
        insert = f'INSERT INTO "{table}" ({columns}) VALUES (?, ?, ?, ?, ?, ?)'
        started = time.perf_counter()
        with target:
            target.executemany(insert, data)
        seconds += time.perf_counter() - started
        rows += len(data)
    target.close()
    source.close()
    return seconds, rows


def stored_rows(store: FeatureStore, state: Path) -> int:
    conn = sqlite3.connect(store.config.online_store.path)
    total = 0
    for view in VIEWS:
        table = compute_table_id(store.project, store.get_feature_view(view))
        total += conn.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0]
    conn.close()
    return total


# --- Redis -----------------------------------------------------------------------


def redis_store(
    state: Path, project: str, engine: feast_ops.Engine | None = None
) -> FeatureStore:
    """The repository's prod configuration (``feature_store.prod.yaml``: Feast's
    Redis store, our batch engine unless ``engine``), its SQL registry on a
    SQLite file instead of PostgreSQL (the registry is not what is measured)."""
    state.mkdir(parents=True, exist_ok=True)
    return FeatureStore(
        config=feast_ops.repo_config(
            "prod",
            project=project,
            registry_url=f"sqlite:///{state / f'registry-{project}.db'}",
            redis=REDIS,
            engine=engine,
        )
    )


def redis_peer_seconds(project: str) -> tuple[float, int]:
    """A pipeline rewriting exactly the hashes Feast wrote; (seconds, hashes)."""
    import redis

    host, _, port = REDIS.split(",")[0].partition(":")
    client = redis.Redis(host=host, port=int(port or 6379))
    keys = list(client.scan_iter(match=b"*" + project.encode(), count=10_000))
    hashes = []
    for start in range(0, len(keys), 5_000):
        pipe = client.pipeline(transaction=False)
        for key in keys[start : start + 5_000]:
            pipe.hgetall(key)
        hashes.extend(pipe.execute())
    client.delete(*keys) if keys else None
    started = time.perf_counter()
    for start in range(0, len(keys), 5_000):
        pipe = client.pipeline(transaction=False)
        for key, mapping in zip(
            keys[start : start + 5_000], hashes[start : start + 5_000], strict=True
        ):
            pipe.hset(key, mapping=mapping)
        pipe.execute()
    return time.perf_counter() - started, len(keys)


# --- online latency ----------------------------------------------------------------


def latency_ms(store: FeatureStore, users: int, requests: int) -> dict[str, float]:
    """p50 / p99 / mean ms of one user's ``user_context_v1`` lookup: wall
    time, and the calling thread's CPU time (what is left of the wall time is
    waiting: for Redis, and for a core when the machine is busy)."""
    service = store.get_feature_service("user_context_v1", allow_cache=True)
    rng = np.random.default_rng(1)
    picks = rng.integers(0, users, requests + 100)

    def one(user: int) -> None:
        store.get_online_features(
            features=service, entity_rows=[{"user_id": int(user)}]
        )

    for user in picks[:100]:  # warm-up: connections, registry cache
        one(user)
    took = np.empty(requests)
    cpu = np.empty(requests)
    for i, user in enumerate(picks[100:]):
        started, cpu_started = time.perf_counter(), time.thread_time()
        one(user)
        took[i] = time.perf_counter() - started
        cpu[i] = time.thread_time() - cpu_started
    took *= 1000
    cpu *= 1000
    return {
        "p50_ms": float(np.percentile(took, 50)),
        "p99_ms": float(np.percentile(took, 99)),
        "mean_ms": float(took.mean()),
        "cpu_p50_ms": float(np.percentile(cpu, 50)),
        "cpu_p99_ms": float(np.percentile(cpu, 99)),
    }


def apply_user_context(store: FeatureStore, features_dir: Path) -> None:
    objects = feast_ops.repo_objects(features_dir)
    store.apply([objects.services["user_context_v1"]])


# --- main --------------------------------------------------------------------------


def _rate(rows: int, seconds: float) -> float:
    return rows / seconds if seconds else float("nan")


def run(
    users: int, seq_len: int, requests: int, feast_engine: bool = False
) -> dict[str, Any]:
    """Every measurement; Redis ones are None without the redis package."""
    results: dict[str, Any] = {"users": users, "seq_len": seq_len, "view_rows": 0}
    results["load_avg_start"] = os.getloadavg()
    view_rows = users * len(VIEWS)
    results["view_rows"] = view_rows
    with tempfile.TemporaryDirectory(prefix="bench_feast_") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        build_tables(root / "features", users, seq_len)
        results["build_tables_s"] = time.perf_counter() - started

        state = root / "sqlite"
        store = sqlite_store(state)
        feast_s = materialize_seconds(store, root / "features")
        written = stored_rows(store, state)
        peer_s, peer_rows = sqlite_peer_seconds(store, state)
        assert peer_rows == written, (peer_rows, written)
        expected = users * sum(len(FEATURE_TABLES[v].feature_names) for v in VIEWS)
        results["sqlite"] = {
            "feast_s": feast_s,
            "feast_rows_per_s": _rate(view_rows, feast_s),
            "peer_s": peer_s,
            "peer_rows_per_s": _rate(view_rows, peer_s),
            "sqlite_rows": written,
            "sqlite_rows_expected": expected,
            "ratio": peer_s / feast_s,
        }
        if feast_engine:
            engine_state = root / "sqlite-feast-engine"
            engine_store = sqlite_store(engine_state, engine="feast")
            results["sqlite"]["feast_engine_s"] = materialize_seconds(
                engine_store, root / "features"
            )
            results["sqlite"]["feast_engine_rows"] = stored_rows(
                engine_store, engine_state
            )
            results["sqlite"]["engine_ratio"] = (
                results["sqlite"]["feast_engine_s"] / feast_s
            )
        apply_user_context(store, root / "features")
        results["sqlite"]["latency"] = latency_ms(store, users, min(requests, 2000))

        if importlib.util.find_spec("redis") is None:
            results["redis"] = None
            results["redis_note"] = (
                "skipped: the `redis` package is not installed (feast[redis])"
            )
            return results
        project = f"bench_{uuid.uuid4().hex[:8]}"
        rstore = redis_store(root / "redis", project)
        try:
            feast_s = materialize_seconds(rstore, root / "features")
            peer_s, hashes = redis_peer_seconds(project)
            apply_user_context(rstore, root / "features")
            results["redis"] = {
                "feast_s": feast_s,
                "feast_rows_per_s": _rate(view_rows, feast_s),
                "peer_s": peer_s,
                "peer_rows_per_s": _rate(view_rows, peer_s),
                "hashes": hashes,
                "ratio": peer_s / feast_s,
                "latency": latency_ms(rstore, users, requests),
            }
        finally:
            rstore.teardown()
        if feast_engine:
            engine_project = f"bench_{uuid.uuid4().hex[:8]}"
            engine_store = redis_store(root / "redis", engine_project, engine="feast")
            try:
                engine_s = materialize_seconds(engine_store, root / "features")
            finally:
                engine_store.teardown()
            results["redis"]["feast_engine_s"] = engine_s
            results["redis"]["engine_ratio"] = engine_s / feast_s
    results["load_avg_end"] = os.getloadavg()
    return results


def _print(results: dict[str, Any]) -> None:
    print(
        f"{results['users']:,} users, sequence length {results['seq_len']}, "
        f"{results['view_rows']:,} view rows "
        f"(tables built in {results['build_tables_s']:.1f} s)"
    )
    for name in ("sqlite", "redis"):
        r = results.get(name)
        if r is None:
            print(f"{name}: {results.get('redis_note', 'skipped')}")
            continue
        print(
            f"{name}: Feast materialize {r['feast_s']:.1f} s = "
            f"{r['feast_rows_per_s']:,.0f} rows/s; peer bulk write {r['peer_s']:.1f} s "
            f"= {r['peer_rows_per_s']:,.0f} rows/s; Feast/peer = {r['ratio']:.2f}"
        )
        if "sqlite_rows" in r:
            print(
                f"  {r['sqlite_rows']:,} SQLite rows written "
                f"(expected {r['sqlite_rows_expected']:,})"
            )
        if "feast_engine_s" in r:
            rows = r.get("feast_engine_rows")
            print(
                f"  Feast's stock engine (store.materialize, Dask), same tables: "
                f"{r['feast_engine_s']:.1f} s = "
                f"{_rate(results['view_rows'], r['feast_engine_s']):,.0f} rows/s"
                + (f", {rows:,} SQLite rows written" if rows is not None else "")
                + f"; stock / ours = {r['engine_ratio']:.2f}"
            )
        if "latency" in r:
            lat = r["latency"]
            print(
                f"  online user_context_v1, 1 user: p50 {lat['p50_ms']:.2f} ms, "
                f"p99 {lat['p99_ms']:.2f} ms, mean {lat['mean_ms']:.2f} ms "
                f"(CPU p50 {lat['cpu_p50_ms']:.2f} ms, p99 {lat['cpu_p99_ms']:.2f} ms)"
            )
    print(
        f"machine: {cpu_model()}, {os.cpu_count()} cores; load average "
        f"{results['load_avg_start'][0]:.1f} at start, "
        f"{results.get('load_avg_end', (float('nan'),))[0]:.1f} at end"
    )


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run, print (or dump JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument(
        "--feast-engine",
        action="store_true",
        help="also time Feast's own materialization engine (Dask; slow)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = run(args.users, args.seq_len, args.requests, args.feast_engine)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        _print(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
