"""Feast on the feature job's output, embedded configuration (SQLite, file registry).

Every expected value is computed independently, in plain Python over the
feature tables (:func:`brute_force`: per entity, the row with the largest
``event_timestamp <= t``), or taken from the reference's training examples.
Each test gets its own project and state dir under ``tmp_path``.
"""

from __future__ import annotations

import datetime as dt
import math
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from feast import FeatureStore, RepoConfig
from feast.infra.online_stores.sqlite import SqliteOnlineStoreConfig

from features import vocab
from features.feature_tables import (
    EVENT_TIMESTAMP,
    FEATURE_TABLES,
    read_feature_table,
    table_folder,
    table_parts,
)
from pipelines.core.reference import ReferenceOutput, build_reference, write_output
from pipelines.feast import command as feast_command
from pipelines.feast import ops as feast_ops
from pipelines.feast import retrieval as feast_retrieval
from pipelines.feast import sqlite as feast_sqlite
from pipelines.sources.synthetic import GeneratorConfig, generate, validation_now_ms
from pipelines.sources.synthetic.world import ads_table, contents_table, users_table
from tests.test_reference import with_versions

CONFIG = GeneratorConfig(users=150, ads=40, days=2, seed=11)
NOW_MS = validation_now_ms(CONFIG)
EPOCH = dt.datetime(1970, 1, 2, tzinfo=dt.UTC)
SAMPLE = 150


# --- data ----------------------------------------------------------------------


def _with_versions(table: pa.Table, column: str, values: tuple[str, ...]) -> pa.Table:
    """20 entities with a second version mid-period, the next 40 with their
    only version inside the period (see :func:`with_versions`)."""
    start = dt.datetime.combine(CONFIG.start, dt.time(), dt.UTC)
    mid = start + dt.timedelta(days=1, hours=3)
    return with_versions(
        table,
        column,
        values,
        versioned=20,
        moved=40,
        mid=mid,
        moved_at=mid + dt.timedelta(hours=9),
    )


@dataclass(frozen=True)
class FeatureJob:
    """The reference's output for a small world with versioned dimensions."""

    directory: Path
    output: ReferenceOutput


def make_feature_job(directory: Path) -> FeatureJob:
    """Generate a small world and run the reference feature job into ``directory``."""
    generated = generate(CONFIG)
    users = _with_versions(
        users_table(generated.world.users), "device", tuple(vocab.DEVICES)
    )
    ads = _with_versions(
        ads_table(generated.world.ads), "creative_category", tuple(vocab.CATEGORIES)
    )
    output = build_reference(
        generated.events,
        users,
        ads,
        contents_table(generated.world.contents),
        now_ms=NOW_MS,
    )
    write_output(output, directory, now_ms=NOW_MS)
    return FeatureJob(directory, output)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> FeatureJob:
    return make_feature_job(tmp_path_factory.mktemp("features"))


def local_store(
    state: Path, project: str | None = None, engine: feast_ops.Engine | None = None
) -> FeatureStore:
    """A store on the embedded configuration with its state under ``state``
    (``engine``: the yaml's batch engine unless given)."""
    project = project or f"t_{uuid.uuid4().hex[:10]}"
    return FeatureStore(
        config=feast_ops.repo_config(
            "local", state_dir=state, project=project, engine=engine
        )
    )


@pytest.fixture
def store(tmp_path: Path, job: FeatureJob) -> Iterator[FeatureStore]:
    store = local_store(tmp_path / "feast")
    feast_ops.apply(store, job.directory)
    yield store
    store.teardown()


# --- brute force ---------------------------------------------------------------


def ms(value: Any) -> int:
    return int(pd.Timestamp(value).value // 1_000_000)


def table_rows(directory: Path, name: str) -> dict[int, list[dict[str, Any]]]:
    """Feature table ``name`` as entity -> rows (dicts, ``ts`` in ms)."""
    spec = FEATURE_TABLES[name]
    by_key: dict[int, list[dict[str, Any]]] = {}
    for row in read_feature_table(directory, name).to_pylist():
        row["ts"] = ms(row.pop(EVENT_TIMESTAMP))
        by_key.setdefault(row[spec.entity], []).append(row)
    return by_key


def brute_force(
    rows: dict[int, list[dict[str, Any]]], key: int, t_ms: int
) -> dict[str, Any] | None:
    """The entity's row with the largest timestamp <= t (None: none yet)."""
    best = None
    for row in rows.get(key, []):
        if row["ts"] <= t_ms and (best is None or row["ts"] > best["ts"]):
            best = row
    return best


def plain(value: Any) -> Any:
    """A retrieved value as plain Python (None for Feast's missing values)."""
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, np.ndarray | list):
        return [int(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def assert_matches_brute_force(
    result: pd.DataFrame, directory: Path, views: list[str]
) -> int:
    """Every ``view__feature`` of ``result`` equals the brute-force answer."""
    checked = 0
    for view in views:
        spec = FEATURE_TABLES[view]
        rows = table_rows(directory, view)
        names = [n for n in spec.feature_names if f"{view}__{n}" in result.columns]
        assert names, view
        for record in result.to_dict("records"):
            want = brute_force(rows, record[spec.entity], ms(record[EVENT_TIMESTAMP]))
            for name in names:
                got = plain(record[f"{view}__{name}"])
                expected = None if want is None else plain(want[name])
                assert got == expected, (view, name, record[spec.entity], record)
                checked += 1
    return checked


def requests_around(job: FeatureJob, n: int, seed: int = 0) -> pd.DataFrame:
    """(user, ad, advertiser, t) rows at, just before and just after sampled
    impressions, before any data, and pairs sharing (user, t) with another ad."""
    examples = job.output.examples.to_pandas()
    sample = examples.sample(n=min(n, len(examples)), random_state=seed)
    base = sample[["user_id", "ad_id", "advertiser_id", "event_time"]].rename(
        columns={"event_time": EVENT_TIMESTAMP}
    )
    shifted = [
        base.assign(
            **{EVENT_TIMESTAMP: base[EVENT_TIMESTAMP] + pd.Timedelta(milliseconds=d)}
        )
        for d in (-1, 1, -3_600_000)
    ]
    early = base.head(10).assign(
        **{EVENT_TIMESTAMP: pd.Timestamp("2001-01-01", tz="UTC")}
    )
    # Same user and time, another ad: Feast's Dask store collapses such rows.
    twins = base.head(10).assign(ad_id=base["ad_id"].iloc[::-1].head(10).to_numpy())
    return pd.concat([base, *shifted, early, twins], ignore_index=True)


# --- tests -----------------------------------------------------------------------


def test_feature_tables_have_no_ties(job: FeatureJob) -> None:
    # The point-in-time answer is only well defined when (entity, time) is
    # unique; Feast breaks ties arbitrarily.
    for name, spec in FEATURE_TABLES.items():
        frame = job.output.feature_tables[name].select([spec.entity, EVENT_TIMESTAMP])
        assert not frame.to_pandas().duplicated().any(), name


def test_apply_registers_the_repository(store: FeatureStore) -> None:
    assert {v.name for v in store.list_feature_views()} == set(FEATURE_TABLES)
    assert {s.name for s in store.list_feature_services()} == {
        "gem_ranking_v1",
        "vertical_ranking_v1",
        "user_context_v1",
    }
    assert {e.name for e in store.list_entities()} == {"user", "ad", "advertiser"}
    pushes = {
        s.name for s in store.list_data_sources() if type(s).__name__ == "PushSource"
    }
    assert pushes == {
        "user_counters_push",
        "ad_counters_push",
        "advertiser_counters_push",
        "user_sequence_push",
    }


def test_historical_features_are_point_in_time_correct(
    store: FeatureStore, job: FeatureJob
) -> None:
    requests = requests_around(job, 60)
    result = feast_retrieval.historical_features(
        store,
        requests,
        store.get_feature_service("gem_ranking_v1"),
        full_feature_names=True,
    )
    assert len(result) == len(requests)
    pd.testing.assert_frame_equal(result[requests.columns], requests)
    checked = assert_matches_brute_force(result, job.directory, list(FEATURE_TABLES))
    assert checked > 10_000
    # The requests do reach rows that exist only later (none yet: null).
    assert result["user_sequence__seq_item_id"].isna().any()
    assert result["user_sequence__seq_item_id"].notna().any()


def test_feast_alone_loses_request_rows(store: FeatureStore, job: FeatureJob) -> None:
    """Why :func:`feast_retrieval.historical_features` exists (Feast 0.67, Dask store).

    If this starts failing, Feast fixed it and the per-view workaround can go.
    """
    requests = requests_around(job, 30)
    raw = store.get_historical_features(
        entity_df=requests,
        features=["user_sequence:seq_item_id", "user_profile:user_device"],
    ).to_df()
    assert len(raw) < len(requests)


def test_backfilled_rows_do_not_leak_into_earlier_times(
    tmp_path: Path, job: FeatureJob
) -> None:
    directory = tmp_path / "features"
    shutil.copytree(job.directory, directory)
    store = local_store(tmp_path / "feast")
    feast_ops.apply(store, directory)
    counters = read_feature_table(directory, "user_counters")
    frame = counters.to_pandas()
    user = int(frame["user_id"].value_counts().index[0])
    times = frame.loc[frame["user_id"] == user, EVENT_TIMESTAMP].sort_values()
    first, last = times.iloc[0], times.iloc[-1]
    backfill_at = first + (last - first) / 2 + pd.Timedelta(milliseconds=1)
    requests = pd.DataFrame(
        {
            "user_id": [user] * 4,
            EVENT_TIMESTAMP: [
                backfill_at - pd.Timedelta(milliseconds=1),
                backfill_at,
                backfill_at + pd.Timedelta(milliseconds=1),
                first,
            ],
        }
    )
    refs = [
        "user_counters:user_click_count_7d",
        "user_counters:user_impression_count_1h",
    ]
    before = feast_retrieval.historical_features(
        store, requests, refs, full_feature_names=True
    )

    # A late row for an earlier time, written after the first retrieval.
    row = {c: frame[c].iloc[0] for c in frame.columns}
    row.update({"user_id": user, EVENT_TIMESTAMP: backfill_at})
    row.update(
        {n: np.float32(999.0) for n in FEATURE_TABLES["user_counters"].feature_names}
    )
    late = pa.Table.from_pandas(
        pd.DataFrame([row])[frame.columns],
        schema=FEATURE_TABLES["user_counters"].schema,
        preserve_index=False,
    )
    folder = table_folder(directory, "user_counters")
    for part in table_parts(folder):
        part.unlink()
    pq.write_table(pa.concat_tables([counters, late]), folder / "part-0.parquet")
    after = feast_retrieval.historical_features(
        store, requests, refs, full_feature_names=True
    )

    click = "user_counters__user_click_count_7d"
    # Earlier training rows see exactly what they saw before the backfill...
    assert after.loc[[0, 3], click].tolist() == before.loc[[0, 3], click].tolist()
    assert 999.0 not in after.loc[[0, 3], click].tolist()
    # ...and rows at or after its time see it, as the brute force says.
    assert after.loc[[1, 2], click].tolist() == [999.0, 999.0]
    assert_matches_brute_force(after, directory, ["user_counters"])


def test_training_examples_equal_historical_features(
    store: FeatureStore, job: FeatureJob
) -> None:
    """Training/serving consistency: what the trainer saw is what Feast serves.

    At an impression time every counter table has a row at exactly that time
    (features.feature_tables), so counters must be equal bit for bit. Profile
    ids equal the examples' as-of join, where "no version yet" is Feast's null
    and the examples' missing id 0, except for the ids an example takes from
    its impression event (``feast_retrieval.FROM_THE_EVENT``): those equal the profile's
    wherever the ad has a version by then, and are the event's where it has
    none (the profile is null there; only invalid data serves an ad before its
    catalog row exists, which this world does on purpose).
    """
    all_examples = job.output.examples.to_pandas()
    # A random sample, plus impressions before the user's or the ad's first
    # version (missing id 0 in the example), which a random one may miss.
    examples = pd.concat(
        [
            all_examples.sample(n=SAMPLE, random_state=1),
            all_examples[all_examples["user_device"] == 0].head(15),
            all_examples[all_examples["ad_creative_category"] == 0].head(15),
        ]
    ).drop_duplicates("example_id")
    requests = examples[["example_id", "user_id", "ad_id", "advertiser_id"]].assign(
        **{EVENT_TIMESTAMP: examples["event_time"]}
    )
    served = feast_retrieval.historical_features(
        store,
        requests,
        store.get_feature_service("vertical_ranking_v1"),
        full_feature_names=True,
    )
    assert served["example_id"].tolist() == examples["example_id"].tolist()
    no_ad_version = served["ad_profile__campaign_id"].isna().to_numpy()
    mismatches: dict[str, int] = {}
    for view in ("user_profile", "ad_profile", "user_counters", "ad_counters"):
        for name in FEATURE_TABLES[view].feature_names:
            got = served[f"{view}__{name}"]
            want = examples[name].to_numpy()
            if view.endswith("_counters"):
                same = got.to_numpy(dtype=np.float32) == want
            elif name in feast_retrieval.FROM_THE_EVENT:
                same = no_ad_version | (got.fillna(-1).to_numpy() == want)
            else:
                same = got.fillna(0).to_numpy(dtype=np.int64) == want
            if not same.all():
                mismatches[f"{view}.{name}"] = int((~same).sum())
    for name in FEATURE_TABLES["advertiser_counters"].feature_names:
        got = served[f"advertiser_counters__{name}"].to_numpy(dtype=np.float32)
        if not (got == examples[name].to_numpy()).all():
            mismatches[f"advertiser_counters.{name}"] = -1
    assert mismatches == {}
    assert feast_retrieval.example_mismatches(store, examples) == {}
    # The sample covers both kinds of "no version yet".
    assert served["user_profile__user_device"].isna().any()
    assert no_ad_version.any()


def test_online_features_are_the_latest_rows(
    store: FeatureStore, job: FeatureJob
) -> None:
    feast_ops.materialize(store, end=dt.datetime.now(dt.UTC))
    tables = {
        n: table_rows(job.directory, n)
        for n in ("user_profile", "user_counters", "user_sequence")
    }
    users = sorted(tables["user_sequence"])[:25]
    online = store.get_online_features(
        features=store.get_feature_service("user_context_v1"),
        entity_rows=[{"user_id": u} for u in users],
    ).to_dict()
    for i, user in enumerate(users):
        for view, rows in tables.items():
            # A user without ad events has no counters: null online.
            latest = max(rows.get(user, [{}]), key=lambda r: r.get("ts", 0))
            for name in FEATURE_TABLES[view].feature_names:
                want = plain(latest.get(name))
                assert plain(online[name][i]) == want, (view, name, user)


def _user_row(job: FeatureJob, table: str, user: int) -> dict[str, Any]:
    rows = table_rows(job.directory, table)[user]
    return max(rows, key=lambda r: r["ts"])


def active_user(job: FeatureJob) -> int:
    """A user with counters and a sequence."""
    counted = table_rows(job.directory, "user_counters")
    return min(set(counted) & set(table_rows(job.directory, "user_sequence")))


def _push_frame(table: str, row: dict[str, Any]) -> pd.DataFrame:
    data = {k: [v] for k, v in row.items() if k != "ts"}
    data[EVENT_TIMESTAMP] = [pd.Timestamp(row["ts"], unit="ms", tz="UTC")]
    return pd.DataFrame(data)[list(FEATURE_TABLES[table].schema.names)]


def assert_push_visible_within_a_second(
    store: FeatureStore, job: FeatureJob, user: int
) -> None:
    """Push a newer counter row and sequence for ``user``; read it back online."""
    counters = _user_row(job, "user_counters", user)
    sequence = _user_row(job, "user_sequence", user)
    new_counters = dict(counters, ts=counters["ts"] + 60_000)
    new_counters["user_click_count_1h"] = counters["user_click_count_1h"] + 7.0
    new_sequence = dict(sequence, ts=sequence["ts"] + 3_600_000)
    new_sequence["seq_item_id"] = [*sequence["seq_item_id"][1:], 424242]
    new_sequence["seq_event_time_ms"] = [
        *sequence["seq_event_time_ms"][1:],
        sequence["ts"] + 1,
    ]
    for name in ("seq_action", "seq_domain", "seq_surface", "seq_category"):
        new_sequence[name] = [*sequence[name][1:], 1]

    def read() -> dict[str, list[Any]]:
        return store.get_online_features(
            features=["user_counters:user_click_count_1h", "user_sequence:seq_item_id"],
            entity_rows=[{"user_id": user}],
        ).to_dict()

    assert read()["user_click_count_1h"] == [counters["user_click_count_1h"]]
    started = time.perf_counter()
    store.push("user_counters_push", _push_frame("user_counters", new_counters))
    store.push("user_sequence_push", _push_frame("user_sequence", new_sequence))
    while True:
        got = read()
        if got["user_click_count_1h"] == [new_counters["user_click_count_1h"]] and (
            plain(got["seq_item_id"][0]) == new_sequence["seq_item_id"]
        ):
            break
        assert time.perf_counter() - started < 1.0, got
        time.sleep(0.01)
    assert time.perf_counter() - started < 1.0

    # A late event (older than what is online) does not replace it.
    stale = dict(counters, ts=counters["ts"] - 1)
    stale["user_click_count_1h"] = -1.0
    store.push("user_counters_push", _push_frame("user_counters", stale))
    assert read()["user_click_count_1h"] == [new_counters["user_click_count_1h"]]


def test_pushed_features_are_online_within_a_second(
    store: FeatureStore, job: FeatureJob
) -> None:
    feast_ops.materialize(store)
    assert_push_visible_within_a_second(store, job, active_user(job))


def assert_older_window_keeps_newer_values(
    store: FeatureStore, job: FeatureJob
) -> dict[str, Any]:
    """Materialize everything, then an earlier window again; return the values."""
    rows = table_rows(job.directory, "user_counters")
    # A user with rows on both sides of the cut, so the earlier window has
    # (older) values for it.
    times = sorted(r["ts"] for user_rows in rows.values() for r in user_rows)
    cut = times[len(times) // 2]
    user = next(
        u
        for u, user_rows in rows.items()
        if min(r["ts"] for r in user_rows) < cut < max(r["ts"] for r in user_rows)
    )
    latest = max(rows[user], key=lambda r: r["ts"])
    older = brute_force(rows, user, cut)  # windows include both ends
    assert older is not None
    assert older != latest
    names = list(FEATURE_TABLES["user_counters"].feature_names)

    def read() -> dict[str, Any]:
        got = store.get_online_features(
            features=[f"user_counters:{n}" for n in names],
            entity_rows=[{"user_id": user}],
        ).to_dict()
        return {n: got[n][0] for n in names}

    end = dt.datetime.now(dt.UTC)
    feast_ops.materialize(store, start=EPOCH, end=end, quiet=True)
    assert read() == {n: latest[n] for n in names}
    cut_time = dt.datetime.fromtimestamp(cut / 1000, dt.UTC)
    feast_ops.materialize(store, start=EPOCH, end=cut_time, quiet=True)
    return {
        "got": read(),
        "latest": {n: latest[n] for n in names},
        "older": {n: older[n] for n in names},
    }


@pytest.mark.parametrize("engine", ["arrow", "feast"])
def test_rematerializing_an_earlier_window_keeps_newer_values(
    tmp_path: Path, job: FeatureJob, engine: feast_ops.Engine
) -> None:
    store = local_store(tmp_path / "feast", engine=engine)
    feast_ops.apply(store, job.directory)
    values = assert_older_window_keeps_newer_values(store, job)
    assert values["got"] == values["latest"]


def materialize_in_two_steps(store: FeatureStore, job: FeatureJob) -> None:
    """Incremental up to the middle of the data, then up to now."""
    feast_ops.apply(store, job.directory)
    middle = dt.datetime.combine(CONFIG.start, dt.time(12), dt.UTC)
    feast_ops.materialize(store, end=middle, quiet=True)
    feast_ops.materialize(store, quiet=True)
    for view in store.list_feature_views():
        assert view.most_recent_end_time is not None
        assert view.most_recent_end_time > middle


def assert_same_online_values(stores: dict[str, FeatureStore], job: FeatureJob) -> None:
    """Every feature of every entity, read through Feast's ``get_online_features``,
    is the same in each store (and some are set: not all null)."""
    for name, spec in FEATURE_TABLES.items():
        keys = sorted(table_rows(job.directory, name))
        refs = [f"{name}:{n}" for n in spec.feature_names]
        rows = [{spec.entity: k} for k in keys]
        got = {
            engine: store.get_online_features(features=refs, entity_rows=rows).to_dict()
            for engine, store in stores.items()
        }
        first, *others = got.values()
        assert all(other == first for other in others), name
        assert all(v is not None for v in first[spec.feature_names[0]]), name


def sqlite_rows(store: FeatureStore) -> dict[str, list[tuple[Any, ...]]]:
    """Every stored row of every view table, as Feast's SQLite store keeps it."""
    import sqlite3

    from feast.infra.online_stores.helpers import compute_table_id

    conn = sqlite3.connect(store.config.online_store.path)
    try:
        return {
            view.name: conn.execute(
                "SELECT entity_key, feature_name, value, value_text, event_ts, "
                f'created_ts FROM "{compute_table_id(store.project, view)}" '
                "ORDER BY entity_key, feature_name"
            ).fetchall()
            for view in store.list_feature_views()
        }
    finally:
        conn.close()


def stock_sqlite_config(directory: Path) -> RepoConfig:
    """A fresh project on Feast's own SQLite online store (not the guarded
    one) and a file registry, both in ``directory``."""
    return RepoConfig(
        project=f"t_{uuid.uuid4().hex[:10]}",
        provider="local",
        registry=str(directory / "registry.db"),
        online_store=SqliteOnlineStoreConfig(path=str(directory / "online.db")),
        entity_key_serialization_version=3,
        repo_path=directory,
    )


def sql_registry_config(project: str, registry_url: str, directory: Path) -> RepoConfig:
    """A repository on Feast's SQL registry at ``registry_url`` (SQLAlchemy),
    its guarded SQLite online store in ``directory``."""
    return RepoConfig(
        project=project,
        provider="local",
        registry={
            "registry_type": "sql",
            "path": registry_url,
            "cache_ttl_seconds": 60,
        },
        online_store=feast_sqlite.GuardedSqliteOnlineStoreConfig(
            path=str(directory / "online.db")
        ),
        entity_key_serialization_version=3,
        repo_path=directory,
    )


def test_arrow_engine_writes_what_feasts_engine_writes(
    tmp_path: Path, job: FeatureJob
) -> None:
    """Our engine (the yaml's) against Feast's stock engine, on the guarded
    store and on Feast's own SQLite store and writer, incremental twice: equal
    rows in every table, byte for byte, and so equal values through Feast's
    read path, for every view and entity."""
    stores = {}
    for engine in ("arrow", "feast"):
        stores[engine] = store = local_store(tmp_path / engine, engine=engine)
        assert feast_ops.configured_engine(store) == engine
    stores["stock"] = FeatureStore(config=stock_sqlite_config(tmp_path))
    assert feast_ops.configured_engine(stores["stock"]) == "feast"
    for store in stores.values():
        materialize_in_two_steps(store, job)
    assert_same_online_values(stores, job)
    ours, *feasts = (sqlite_rows(store) for store in stores.values())
    assert set(ours) == set(FEATURE_TABLES)
    for name, rows in ours.items():
        assert len(rows) == len(table_rows(job.directory, name)) * len(
            FEATURE_TABLES[name].feature_names
        )
        for other in feasts:
            assert other[name] == rows, name


def test_materialize_checks_the_engine_it_is_asked_for(tmp_path: Path) -> None:
    store = local_store(tmp_path / "feast")
    assert feast_ops.configured_engine(store) == "arrow"  # the yaml's
    with pytest.raises(ValueError, match="repo_config\\(engine='feast'\\)"):
        feast_ops.materialize(store, engine="feast")


def test_plain_feast_sqlite_lets_the_older_write_win(
    tmp_path: Path, job: FeatureJob
) -> None:
    """Why the guarded store exists: Feast 0.67's SQLite store overwrites.

    If this starts failing, Feast guards it itself and the subclass can go.
    """
    config = stock_sqlite_config(tmp_path)
    store = FeatureStore(config=config)
    feast_ops.apply(store, job.directory)
    values = assert_older_window_keeps_newer_values(store, job)
    assert values["got"] == values["older"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("drop", "column 'user_click_count_1d' is missing"),
        (
            "retype",
            "column 'user_click_count_1d' has type double, the contract says float",
        ),
    ],
)
def test_bad_feature_tables_fail_apply_and_materialize_naming_view_and_column(
    tmp_path: Path,
    job: FeatureJob,
    change: str,
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    directory = tmp_path / "features"
    shutil.copytree(job.directory, directory)
    path = table_parts(table_folder(directory, "user_counters"))[0]
    good = pq.read_table(path)
    column = "user_click_count_1d"
    bad = (
        good.drop_columns([column])
        if change == "drop"
        else good.set_column(
            good.schema.get_field_index(column),
            column,
            good.column(column).cast(pa.float64()),
        )
    )
    store = local_store(tmp_path / "feast")
    pq.write_table(bad, path)
    with pytest.raises(feast_ops.FeatureTableError) as raised:
        feast_ops.apply(store, directory)
    assert "feature view 'user_counters'" in str(raised.value)
    assert message in str(raised.value)
    assert store.list_feature_views() == []

    # Applied while good, broken before materializing: materialize refuses.
    pq.write_table(good, path)
    feast_ops.apply(store, directory)
    pq.write_table(bad, path)
    with pytest.raises(feast_ops.FeatureTableError, match=message):
        feast_ops.materialize(store)
    # The CLI says the same on one line and exits 2.
    capsys.readouterr()  # what Feast logged so far
    assert feast_command.main(["--features-dir", str(directory), "validate"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "feature view 'user_counters'" in line
    assert message in line


def test_sql_registry_works_through_sqlalchemy(tmp_path: Path, job: FeatureJob) -> None:
    """The SQL registry code path of the prod config, on SQLite via SQLAlchemy
    (PostgreSQL itself: tests/test_feast_prod.py)."""
    config = sql_registry_config(
        f"t_{uuid.uuid4().hex[:10]}", f"sqlite:///{tmp_path / 'registry.db'}", tmp_path
    )
    store = FeatureStore(config=config)
    feast_ops.apply(store, job.directory)
    feast_ops.materialize(store)
    fresh = FeatureStore(config=config)  # a second process would see the same
    assert {v.name for v in fresh.list_feature_views()} == set(FEATURE_TABLES)
    user = sorted(table_rows(job.directory, "user_profile"))[0]
    got = fresh.get_online_features(
        features=["user_profile:user_device"], entity_rows=[{"user_id": user}]
    ).to_dict()
    assert got["user_device"] == [_user_row(job, "user_profile", user)["user_device"]]
