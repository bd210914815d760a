"""The reference feature job against the spec, checked by brute force.

Every expected value here is computed independently, with plain Python loops
over the raw events of a tiny generated set (a handful of sampled examples),
straight from the rules in :mod:`features.examples`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from features import vocab
from features.events import CLICK_WINDOW, CONVERSION_WINDOW, EVENT_SCHEMA
from features.examples import TIMELINE_SCHEMA, training_example_schema
from features.feature_tables import (
    COUNT_NAMES,
    FEATURE_TABLES,
    USER_SEQUENCE_LENGTH,
    counter_names,
    read_feature_table,
    table_folder,
    table_parts,
)
from features.registry import (
    COUNTER_ACTIONS,
    COUNTER_ENTITIES,
    COUNTER_WINDOWS,
    SPARSE_FEATURES,
    string_bucket,
)
from features.windows import TIMELINE_SEQUENCE_COLUMNS
from pipelines.core.reference import ReferenceOutput, build_reference
from pipelines.reference import main
from pipelines.sources.synthetic import GeneratorConfig, generate, validation_now_ms
from pipelines.sources.synthetic.world import ads_table, contents_table, users_table

CONFIG = GeneratorConfig(users=150, ads=40, days=3, seed=3)
NOW = validation_now_ms(CONFIG)
WINDOWS_MS = {"1h": 3_600_000, "1d": 86_400_000, "7d": 7 * 86_400_000}
SAMPLE = 40


def ms(value: dt.datetime) -> int:
    return round(value.timestamp() * 1000)


@dataclass(frozen=True)
class DataSet:
    events: pa.Table
    users: pa.Table
    ads: pa.Table
    contents: pa.Table
    duplicates: int

    def run(
        self, events: pa.Table | None = None, **tables: pa.Table
    ) -> ReferenceOutput:
        return build_reference(
            self.events if events is None else events,
            tables.get("users", self.users),
            tables.get("ads", self.ads),
            tables.get("contents", self.contents),
            now_ms=NOW,
        )


def with_versions(
    table: pa.Table,
    column: str,
    values: tuple[str, ...],
    *,
    versioned: int,
    moved: int,
    mid: dt.datetime,
    moved_at: dt.datetime,
) -> pa.Table:
    """A second version at ``mid`` (``column`` changed to the next of
    ``values``) for the first ``versioned`` rows, and the next ``moved``
    rows' only version moved to ``moved_at``, so as-of joins have several
    answers and sometimes none (yet)."""
    rows = table.to_pylist()
    extra = []
    for i, row in enumerate(rows):
        if i < versioned:
            new = dict(row, updated_at=mid)
            new[column] = values[(values.index(row[column]) + 1) % len(values)]
            extra.append(new)
        elif i < versioned + moved:
            row["updated_at"] = moved_at
    return pa.Table.from_pylist(rows + extra, schema=table.schema)


def _with_versions(table: pa.Table, column: str, values: tuple[str, ...]) -> pa.Table:
    """30 entities with a second version mid-period, the next 10 with their
    only version inside the period (see :func:`with_versions`)."""
    mid = dt.datetime.combine(CONFIG.start, dt.time(), dt.UTC) + dt.timedelta(days=1.5)
    return with_versions(
        table,
        column,
        values,
        versioned=30,
        moved=10,
        mid=mid,
        moved_at=mid - dt.timedelta(hours=20),
    )


@pytest.fixture(scope="module")
def data() -> DataSet:
    generated = generate(CONFIG)
    users = _with_versions(
        users_table(generated.world.users), "device", tuple(vocab.DEVICES)
    )
    ads = _with_versions(
        ads_table(generated.world.ads), "creative_category", tuple(vocab.CATEGORIES)
    )
    return DataSet(
        events=generated.events,
        users=users,
        ads=ads,
        contents=contents_table(generated.world.contents),
        duplicates=generated.duplicates,
    )


@pytest.fixture(scope="module")
def output(data: DataSet) -> ReferenceOutput:
    return data.run()


def distinct_events(events: pa.Table) -> list[dict[str, Any]]:
    """Each event_id once (first copy), sorted by (event_time, event_id)."""
    seen: set[str] = set()
    out = []
    for row in events.to_pylist():
        if row["event_id"] not in seen:
            seen.add(row["event_id"])
            row["t"] = ms(row["event_time"])
            out.append(row)
    return sorted(out, key=lambda r: (r["t"], r["event_id"]))


def as_of(
    rows: list[dict[str, Any]], key: str, value: int, t: int
) -> dict[str, Any] | None:
    """The latest row for ``key == value`` with ``updated_at <= t`` (later wins)."""
    best = None
    for row in rows:
        if row[key] == value and ms(row["updated_at"]) <= t:
            if best is None or ms(row["updated_at"]) >= ms(best["updated_at"]):
                best = row
    return best


def expected_example(
    impression: dict[str, Any],
    events: list[dict[str, Any]],
    users: list[dict[str, Any]],
    ads: list[dict[str, Any]],
) -> dict[str, Any]:
    """One example, computed straight from the spec with loops."""
    t, eid = impression["t"], impression["event_id"]
    expected: dict[str, Any] = {
        "example_id": eid,
        "user_id": impression["user_id"],
        "ad_id": impression["ad_id"],
        "advertiser_id": impression["advertiser_id"],
        "campaign_id": impression["campaign_id"],
    }
    for objective, window in (
        ("click", CLICK_WINDOW),
        ("conversion", CONVERSION_WINDOW),
    ):
        width = window.total_seconds() * 1000
        expected[f"label_{objective}"] = int(
            any(
                e["action"] == objective
                and e["impression_id"] == eid
                and t <= e["t"] < t + width
                for e in events
            )
        )
    user = as_of(users, "user_id", impression["user_id"], t)
    bounds = vocab.AGE_BUCKET_BOUNDS
    expected["user_age_bucket"] = sum(user["age"] >= b for b in bounds) if user else 0
    expected["user_gender"] = (
        vocab.vocabulary_ids(vocab.GENDERS)[user["gender"]] if user else 0
    )
    location_rows = next(f for f in SPARSE_FEATURES if f.name == "user_location")
    expected["user_location"] = (
        int(
            string_bucket(pa.array([user["location"]]), location_rows.num_embeddings)[0]
        )
        if user
        else 0
    )
    expected["user_device"] = (
        vocab.vocabulary_ids(vocab.DEVICES)[user["device"]] if user else 0
    )
    ad = as_of(ads, "ad_id", impression["ad_id"], t)
    expected["ad_creative_category"] = (
        vocab.vocabulary_ids(vocab.CATEGORIES)[ad["creative_category"]] if ad else 0
    )
    expected["ad_format"] = vocab.vocabulary_ids(vocab.AD_FORMATS)[
        impression["ad_format"]
    ]
    expected["ad_objective"] = vocab.vocabulary_ids(vocab.AD_OBJECTIVES)[
        impression["objective"]
    ]
    expected["domain"] = vocab.vocabulary_ids(vocab.DOMAINS)[impression["domain"]]
    expected["surface"] = vocab.vocabulary_ids(vocab.SURFACES)[impression["surface"]]
    expected["hour_of_day"] = impression["event_time"].hour + 1
    for entity in COUNTER_ENTITIES:
        key = f"{entity}_id"
        for action in COUNTER_ACTIONS:
            for window in COUNTER_WINDOWS:
                expected[f"{entity}_{action}_count_{window}"] = float(
                    sum(
                        e["action"] == action
                        and e[key] == impression[key]
                        and t - WINDOWS_MS[window] <= e["t"] < t
                        for e in events
                    )
                )
    expected["timeline_cut"] = sum(
        e["user_id"] == impression["user_id"] and e["t"] < t for e in events
    )
    return expected


def sampled_impressions(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A handful of impressions: random ones plus every labelled one."""
    impressions = [e for e in events if e["action"] == "impression"]
    labelled = {e["impression_id"] for e in events if e["impression_id"]}
    rng = np.random.default_rng(0)
    picks = rng.choice(len(impressions), SAMPLE, replace=False)
    chosen = {impressions[i]["event_id"] for i in picks} | labelled
    return [e for e in impressions if e["event_id"] in chosen]


def assert_counts_add_up(counts: dict[str, int]) -> None:
    assert tuple(counts) == COUNT_NAMES
    assert (
        counts["events_read"] == counts["events_valid"] + counts["events_dead_lettered"]
    )
    assert (
        counts["events_valid"]
        == counts["events_distinct"] + counts["duplicates_removed"]
    )
    assert counts["events_distinct"] == counts["timeline_events"]
    assert counts["impressions"] == counts["examples"]


def test_examples_match_the_spec_by_brute_force(
    data: DataSet, output: ReferenceOutput
) -> None:
    events = distinct_events(data.events)
    users, ads = data.users.to_pylist(), data.ads.to_pylist()
    rows = {r["example_id"]: r for r in output.examples.to_pylist()}
    sample = sampled_impressions(events)
    assert sum(1 for e in events if e["action"] == "click") > 0
    for impression in sample:
        expected = expected_example(impression, events, users, ads)
        got = rows[impression["event_id"]]
        assert {k: got[k] for k in expected} == expected, impression["event_id"]
    # The as-of joins were exercised: some examples see a second version and
    # some see none.
    got = output.examples
    assert pc.sum(pc.equal(got["user_device"], 0)).as_py() > 0
    assert pc.sum(pc.equal(got["ad_creative_category"], 0)).as_py() > 0


def test_schemas_order_and_counts(data: DataSet, output: ReferenceOutput) -> None:
    assert output.examples.schema == training_example_schema()
    assert output.timelines.schema == TIMELINE_SCHEMA
    ids = output.examples["example_id"].to_pylist()
    assert ids == sorted(ids)
    users = output.timelines["user_id"].to_pylist()
    assert users == sorted(users)
    assert_counts_add_up(output.counts)
    assert output.counts["events_read"] == data.events.num_rows
    assert output.counts["duplicates_removed"] == data.duplicates > 0
    assert output.counts["events_dead_lettered"] == 0
    for name, table in output.feature_tables.items():
        assert table.schema == FEATURE_TABLES[name].schema, name


def test_timelines_hold_every_distinct_event_in_order(
    data: DataSet, output: ReferenceOutput
) -> None:
    events = distinct_events(data.events)
    ads = data.ads.to_pylist()
    content_category = {
        r["content_id"]: r["content_category"] for r in data.contents.to_pylist()
    }
    timelines = {r["user_id"]: r for r in output.timelines.to_pylist()}
    categories = vocab.vocabulary_ids(vocab.CATEGORIES)
    for user in sorted(timelines)[:: max(1, len(timelines) // 8)]:
        mine = [e for e in events if e["user_id"] == user]
        row = timelines[user]
        assert [ms(t) for t in row["event_time"]] == [e["t"] for e in mine]
        assert row["seq_item_id"] == [
            2 * e["ad_id"] if e["ad_id"] is not None else 2 * e["content_id"] + 1
            for e in mine
        ]
        assert row["seq_action"] == [
            vocab.vocabulary_ids(vocab.ACTIONS)[e["action"]] for e in mine
        ]
        expected_category = []
        for e in mine:
            if e["ad_id"] is not None:
                ad = as_of(ads, "ad_id", e["ad_id"], e["t"])
                expected_category.append(
                    categories[ad["creative_category"]] if ad else 0
                )
            else:
                expected_category.append(categories[content_category[e["content_id"]]])
        assert row["seq_category"] == expected_category


def test_invalid_rows_are_dead_lettered_and_change_nothing(
    data: DataSet, output: ReferenceOutput
) -> None:
    rows = data.events.slice(0, 30).to_pylist()
    bad = []
    for i, row in enumerate(rows[:12]):
        row = dict(row, event_id=f"bad-{i}")
        if i % 3 == 0:
            row["surface"] = "inbox" if row["domain"] != "messaging" else "feed"
        elif i % 3 == 1:
            row["event_time"] = dt.datetime.fromtimestamp(NOW / 1000 + 86_400, dt.UTC)
        else:
            row["content_id"] = 1 if row["ad_id"] is not None else None
        bad.append(row)
    injected = pa.concat_tables(
        [data.events, pa.Table.from_pylist(bad, schema=EVENT_SCHEMA)]
    )
    dirty = data.run(injected)
    assert dirty.dead_letters.num_rows == len(bad)
    assert dirty.dead_letters["event_id"].to_pylist() == [r["event_id"] for r in bad]
    assert all(dirty.dead_letters["reason"].to_pylist())
    assert_counts_add_up(dirty.counts)
    assert dirty.counts["events_dead_lettered"] == len(bad)
    assert dirty.examples.equals(output.examples)
    assert dirty.timelines.equals(output.timelines)


def test_duplicates_are_counted_once(data: DataSet, output: ReferenceOutput) -> None:
    # Log every impression and click a second (third...) time.
    repeated = data.events.filter(
        pc.is_in(data.events["action"], pa.array(["impression", "click"]))
    )
    doubled = data.run(pa.concat_tables([data.events, repeated, repeated]))
    assert doubled.counts["duplicates_removed"] == (
        output.counts["duplicates_removed"] + 2 * repeated.num_rows
    )
    assert doubled.examples.equals(output.examples)
    assert doubled.timelines.equals(output.timelines)


def test_no_feature_sees_the_impression_or_later(
    data: DataSet, output: ReferenceOutput
) -> None:
    """Deleting every event at or after an example's time (but the impression
    itself), and every dimension version after it, changes none of its
    features; only the labels may change."""
    examples = output.examples
    times = pc.cast(examples["event_time"], pa.int64()).to_numpy()
    cuts = examples["timeline_cut"].to_numpy()
    picks = [int(np.argmax(cuts)), int(np.argsort(times)[len(times) // 2])]
    features = [n for n in examples.column_names if not n.startswith("label_")]
    event_times = pc.cast(data.events["event_time"], pa.int64())
    for i in picks:
        eid, t = examples["example_id"][i].as_py(), int(times[i])
        past = pc.or_(pc.less(event_times, t), pc.equal(data.events["event_id"], eid))
        users = data.users.filter(
            pc.less_equal(pc.cast(data.users["updated_at"], pa.int64()), t)
        )
        ads = data.ads.filter(
            pc.less_equal(pc.cast(data.ads["updated_at"], pa.int64()), t)
        )
        cut_off = data.run(data.events.filter(past), users=users, ads=ads)
        mine = pc.equal(cut_off.examples["example_id"], eid)
        before = examples.slice(i, 1).select(features).to_pylist()
        after = cut_off.examples.filter(mine).select(features).to_pylist()
        assert after == before
        # The history it points into is the same too.
        user = before[0]["user_id"]
        cut = before[0]["timeline_cut"]
        old = output.timelines.filter(pc.equal(output.timelines["user_id"], user))
        new = cut_off.timelines.filter(pc.equal(cut_off.timelines["user_id"], user))
        for name in ("event_time", *TIMELINE_SEQUENCE_COLUMNS):
            assert new[name][0].as_py()[:cut] == old[name][0].as_py()[:cut]


def test_counter_tables_equal_example_counters_at_impression_times(
    output: ReferenceOutput,
) -> None:
    """Feast's point-in-time join (latest row with event_timestamp <= t)
    returns exactly the example's counters."""
    examples = output.examples.to_pandas()
    for entity in COUNTER_ENTITIES:
        key = f"{entity}_id"
        table = output.feature_tables[f"{entity}_counters"].to_pandas()
        joined = pd.merge_asof(
            examples[[key, "event_time", *counter_names(entity)]].sort_values(
                "event_time"
            ),
            table.sort_values("event_timestamp"),
            left_on="event_time",
            right_on="event_timestamp",
            by=key,
            suffixes=("", "_feast"),
        )
        assert (joined["event_timestamp"] == joined["event_time"]).all()
        for name in counter_names(entity):
            assert (joined[name] == joined[f"{name}_feast"]).all(), name


def test_user_sequence_snapshots_hold_the_last_events_before_them(
    output: ReferenceOutput,
) -> None:
    timelines = {r["user_id"]: r for r in output.timelines.to_pylist()}
    snapshots = output.feature_tables["user_sequence"].to_pylist()
    for snap in snapshots[:: max(1, len(snapshots) // 50)]:
        end = ms(snap["event_timestamp"])
        assert end % 3_600_000 == 0
        row = timelines[snap["user_id"]]
        before = [i for i, t in enumerate(row["event_time"]) if ms(t) < end]
        window = before[-USER_SEQUENCE_LENGTH:]
        assert snap["seq_event_time_ms"] == [ms(row["event_time"][i]) for i in window]
        for name in TIMELINE_SEQUENCE_COLUMNS:
            assert snap[name] == [row[name][i] for i in window]


def test_cli_writes_the_layout(
    tmp_path: Path, data: DataSet, output: ReferenceOutput
) -> None:
    source = tmp_path / "in"
    (source / "events" / "date=2026-10-01").mkdir(parents=True)
    pq.write_table(
        data.events, source / "events" / "date=2026-10-01" / "part-0.parquet"
    )
    for name in ("users", "ads", "contents"):
        pq.write_table(getattr(data, name), source / f"{name}.parquet")
    out = tmp_path / "out"
    assert (
        main(["--input", str(source), "--output", str(out), "--now-ms", str(NOW)]) == 0
    )
    examples = pq.read_table(out / "examples", partitioning="hive")
    assert examples.num_rows == output.examples.num_rows
    days = {p.name for p in (out / "examples").iterdir()}
    assert days == {"date=2026-10-01", "date=2026-10-02", "date=2026-10-03"}
    assert pq.read_table(out / "timelines").equals(output.timelines)
    for name in FEATURE_TABLES:
        assert [p.name for p in table_parts(table_folder(out, name))] == [
            "part-0.parquet"
        ]
        assert read_feature_table(out, name).equals(output.feature_tables[name])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"] == output.counts
    assert (out / "dead_letters" / "part-0.jsonl").exists()
    assert main(["--input", str(source), "--output", str(out)]) == 2  # no overwrite


def shared_data() -> Path:
    override = os.environ.get("GEM_SHARED_DATA")
    return (
        Path(override)
        if override
        else (Path(__file__).resolve().parents[1].parent / "shared" / "data")
    )


def test_movielens_100k_runs_and_counts_add_up() -> None:
    source = shared_data() / "movielens-100k"
    if not (source / "u.data").exists():
        pytest.skip(f"MovieLens 100k not found at {source}")
    from pipelines.sources.movielens import convert

    converted = convert(source)
    out = build_reference(
        converted.events, converted.users, converted.ads, converted.contents
    )
    assert_counts_add_up(out.counts)
    assert out.counts["examples"] == 100_000  # one impression per rating
    assert out.counts["events_dead_lettered"] == 0
    labels = out.examples["label_click"].to_numpy()
    assert 0.4 < labels.mean() < 0.7  # ratings >= 4
    assert out.examples["label_click"].equals(out.examples["label_conversion"])
    assert pc.min(out.examples["user_age_bucket"]).as_py() > 0
