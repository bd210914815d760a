"""One event per event_id everywhere: copies under other users, times or files.

The contract (:mod:`features.duplicates`): copies of an event_id are one
event, its winning copy the first in ``(event_time, user_id, digest)``
order, the others counted in ``duplicates_removed``. A small generated world
gets copies of a few of its events: under another user at the same time,
under another user earlier (so the copy wins), under the same user and time
with another content or another ad (the digests decide; the ad copies sit in
different ad shards of the streaming job), and the generator's own exact
copies. The same rows are then laid out in two input orders and files
(originals first, or the copies first and the rest reversed), and the Beam
job (Prism and the FnApiRunner, different shard counts), the reference and
the streaming job's stages (id stage, ad and user shards, arrival in both
orders) must agree on every output and count. ``tests/test_streaming_job.py``
runs the streaming job itself on a stream with such copies.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from benchmarks.generated import GeneratedTables, generated_tables
from features.duplicates import (
    DUPLICATE_HORIZON_MS,
    canonical_event_bytes,
    copy_digests,
)
from features.events import EVENT_SCHEMA
from features.examples import TIMELINE_SCHEMA, training_example_schema
from features.feature_tables import COUNT_NAMES
from pipelines import build
from pipelines.core.counters import ENTITY_KINDS
from pipelines.core.event_copies import (
    copy_winners,
    drop_losing_copies,
    id_projection,
    winning_copies,
)
from pipelines.core.reference import ReferenceOutput
from pipelines.core.shards import shard_of
from pipelines.sources.synthetic import GeneratorConfig, validation_now_ms
from pipelines.streaming.config import StreamConfig
from pipelines.streaming.entity_state import answer_entity_shard, route_entity_rows
from pipelines.streaming.event_ids import forget_ids, notices_for, winners_table
from pipelines.streaming.tables import (
    DROPPED_SCHEMA,
    STREAM_EVENT_SCHEMA,
    answer_schema,
    state_bytes,
)
from pipelines.streaming.user_release import Dimensions, release_user_shard

CONFIG = GeneratorConfig(users=40, ads=10, days=2, seed=7)
NOW = validation_now_ms(CONFIG)
MINUTE_MS = 60_000
DIMENSIONS = ("users.parquet", "ads.parquet", "contents.parquet", "manifest.json")


@dataclass(frozen=True)
class World:
    """The generated tables, the copies added to their events, and the folder
    they were written to."""

    tables: GeneratedTables
    copies: pa.Table
    source: Path

    @property
    def events(self) -> pa.Table:
        """The generated events."""
        return self.tables.events

    @property
    def dims(self) -> Dimensions:
        """The users, ads and contents tables."""
        return Dimensions(self.tables.users, self.tables.ads, self.tables.contents)


def _copies(events: pa.Table) -> pa.Table:
    """Copies of three impressions and an organic event (see the module doc)."""
    impressions = events.filter(pc.equal(events.column("action"), "impression"))
    organic = events.filter(pc.equal(events.column("action"), "view"))
    users = sorted(set(events.column("user_id").to_pylist()))
    rows = []
    for index, row in enumerate(impressions.slice(10, 3).to_pylist()):
        other = next(u for u in reversed(users) if u != row["user_id"])
        copy = row | {"user_id": other}
        if index == 1:  # earlier: this copy wins, under the other user
            copy["event_time"] = row["event_time"] - dt.timedelta(minutes=10)
        if index == 2:  # the lowest other user, same time
            copy["user_id"] = next(u for u in users if u != row["user_id"])
        rows.append(copy)
    view = organic.slice(5, 1).to_pylist()[0]
    rows.append(view | {"content_id": view["content_id"] + 1})  # digests decide
    rows.append(view | {"surface": view["surface"]})  # an exact copy
    # Same user and time, another ad and advertiser: digests decide, and the
    # two copies sit in different ad shards of the streaming job.
    impression = impressions.slice(20, 1).to_pylist()[0]
    ads = sorted(set(impressions.column("ad_id").to_pylist()) - {impression["ad_id"]})
    rows.append(
        impression | {"ad_id": ads[0], "advertiser_id": impression["advertiser_id"] + 1}
    )
    return pa.Table.from_pylist(rows, schema=events.schema)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("world")
    tables = generated_tables(CONFIG, root)
    return World(tables, _copies(tables.events), root)


def _layouts(world: World) -> list[pa.Table]:
    """The two input orders: originals first, or the copies first and the
    originals reversed."""
    return [
        pa.concat_tables([world.events, world.copies]),
        pa.concat_tables([world.copies, _reversed(world.events)]),
    ]


def _reversed(table: pa.Table) -> pa.Table:
    return table.take(pa.array(np.arange(table.num_rows)[::-1]))


def _write_input(world: World, order: int, root: Path) -> Path:
    """A data set folder with the rows in one of two orders and files."""
    root.mkdir(parents=True)
    for name in DIMENSIONS:
        (root / name).write_bytes((world.source / name).read_bytes())
    events_dir = root / "events" / "date=2026-10-01"
    events_dir.mkdir(parents=True)
    first, second = (world.events, world.copies)
    if order == 1:
        first = world.copies
        second = _reversed(world.events)
    pq.write_table(first, events_dir / "part-0.parquet")
    pq.write_table(second, events_dir / "part-1.parquet")
    return root


def _reference(world: World, events: pa.Table) -> ReferenceOutput:
    return world.tables.reference(events)


def test_the_winner_does_not_depend_on_the_order(world: World) -> None:
    rows = pa.concat_tables([world.events, world.copies])
    keep = winning_copies(rows)
    kept = sorted(canonical_event_bytes(rows.filter(pa.array(keep))))
    for seed in range(3):
        order = np.random.default_rng(seed).permutation(rows.num_rows)
        shuffled = rows.take(pa.array(order))
        again = canonical_event_bytes(
            shuffled.filter(pa.array(winning_copies(shuffled)))
        )
        assert sorted(again) == kept
    ids = rows.column("event_id").filter(pa.array(keep)).to_pylist()
    assert len(ids) == len(set(ids)) == len(set(rows.column("event_id").to_pylist()))


def test_the_contract_picks_the_earliest_then_the_lowest_user(world: World) -> None:
    copies = world.copies.to_pylist()
    reference = _reference(world, pa.concat_tables([world.events, world.copies]))
    examples = {row["example_id"]: row for row in reference.examples.to_pylist()}
    originals = {
        row["event_id"]: row
        for row in world.events.to_pylist()
        if row["event_id"] in {c["event_id"] for c in copies}
    }
    for copy in (copies[0], copies[2]):  # same time: the lower user wins
        original = originals[copy["event_id"]]
        winner = min(copy["user_id"], original["user_id"])
        assert examples[copy["event_id"]]["user_id"] == winner
    earlier = copies[1]
    assert examples[earlier["event_id"]]["user_id"] == earlier["user_id"]
    assert examples[earlier["event_id"]]["event_time"] == earlier["event_time"]
    # Copies under one user and time: the digests decide.
    for copy in (copies[3], copies[5]):
        pair = [originals[copy["event_id"]], copy]
        smallest = min(copy_digests(pa.Table.from_pylist(pair, EVENT_SCHEMA)))
        for order in (pair, pair[::-1]):
            table = pa.Table.from_pylist(order, EVENT_SCHEMA)
            kept = table.filter(pa.array(winning_copies(table)))
            assert copy_digests(kept) == [smallest]
    timelines = reference.timelines
    items = pc.list_flatten(timelines.column("seq_item_id"))
    assert pc.sum(pc.list_value_length(timelines.column("event_time"))).as_py() == (
        len(set(pa.concat_tables([world.events, world.copies])["event_id"].to_pylist()))
    )
    assert len(items) == reference.counts["events_distinct"]


def test_the_reference_gives_one_answer_in_both_orders(world: World) -> None:
    first, second = (_reference(world, events) for events in _layouts(world))
    assert first.counts == second.counts
    assert first.examples.equals(second.examples)
    assert first.timelines.equals(second.timelines)
    for name, table in first.feature_tables.items():
        assert table.equals(second.feature_tables[name]), name
    counts = first.counts
    duplicates = world.copies.num_rows + (
        world.events.num_rows - len(set(world.events["event_id"].to_pylist()))
    )
    assert counts["duplicates_removed"] == duplicates
    assert counts["events_valid"] == counts["events_distinct"] + duplicates


def _beam_examples(out: Path) -> pa.Table:
    table = ds.dataset(out / "examples", format="parquet", partitioning="hive")
    rows = table.to_table().drop_columns(["date"]).sort_by("example_id")
    return rows.cast(training_example_schema())


@pytest.mark.parametrize(
    ("order", "runner", "shards"),
    [(0, "--runner=DirectRunner", 3), (1, "--runner=FnApiRunner", 2)],
)
def test_the_beam_job_equals_the_reference(
    world: World, tmp_path: Path, order: int, runner: str, shards: int
) -> None:
    """Prism and the FnApiRunner, two orders, copies in different files and
    user shards: the reference's answer each time."""
    source = _write_input(world, order, tmp_path / "in")
    out = tmp_path / "out"
    build.run(
        [runner, "--input", str(source), "--output", str(out),
         "--shards", str(shards), f"--now-ms={NOW}"]
    )  # fmt: skip
    reference = _reference(world, _layouts(world)[order])
    got = _beam_examples(out)
    for name in got.column_names:
        assert got.column(name).equals(reference.examples.column(name)), name
    timelines = pq.read_table(out / "timelines").sort_by("user_id")
    assert timelines.cast(TIMELINE_SCHEMA).equals(reference.timelines)
    summary = json.loads((out / "summary.json").read_text())
    assert {k: summary["counts"][k] for k in COUNT_NAMES} == reference.counts


def _stream_events(events: pa.Table) -> pa.Table:
    published = pa.array(np.zeros(events.num_rows, np.int64))
    return events.append_column("published_ms", published).cast(STREAM_EVENT_SCHEMA)


def _streamed_examples(world: World, arrivals: list[pa.Table], shards: int) -> pa.Table:
    """The streaming stages' functions over batches arriving in order: the id
    stage's notices, then one answer and one release per shard at the end."""
    config = StreamConfig(shards=shards, entity_shards=2, granularity_ms=MINUTE_MS)
    seen = id_projection(arrivals[0].slice(0, 0), with_digest=True)
    notices: dict[int, list[bytes]] = {shard: [] for shard in range(shards)}
    entity_notices: list[bytes] = []
    for batch in arrivals:
        projection = id_projection(batch, with_digest=True)
        winners, copies = notices_for(seen, projection)
        seen = pa.concat_tables([seen, projection])
        if winners.num_rows:
            users = np.unique(copies.column("user_id").to_numpy())
            for shard in np.unique(shard_of(users, shards)).tolist():
                notices[shard].append(state_bytes(winners))
            entity_notices.append(state_bytes(winners))
    events = _stream_events(pa.concat_tables(arrivals))
    fire = int(pc.max(events.column("event_time")).cast(pa.int64()).as_py()) + 10**10
    answers = {
        (shard, kind): answer_schema(kind).empty_table()
        for shard in range(shards)
        for kind in ENTITY_KINDS
    }
    for key, rows in route_entity_rows(events, config.entity_shards):
        kind = ENTITY_KINDS[key // config.entity_shards]
        routed, _, _ = answer_entity_shard(
            rows,
            kind,
            answered_until=np.iinfo(np.int64).min,
            fire=fire,
            config=config,
            user_shards=shards,
            winners=winners_table(entity_notices),
        )
        for shard, table in routed:
            answers[shard, kind] = pa.concat_tables([answers[shard, kind], table])
    released = []
    users = events.column("user_id").to_numpy()
    for shard in range(shards):
        mine = events.filter(pa.array(shard_of(users, shards) == shard))
        result = release_user_shard(
            mine,
            DROPPED_SCHEMA.empty_table(),
            {kind: answers[shard, kind] for kind in ENTITY_KINDS},
            released_until=np.iinfo(np.int64).min,
            fire=fire,
            dims=world.dims,
            config=config,
            winners=winners_table(notices[shard]),
        )
        released.append(result.examples)
    return pa.concat_tables(released).sort_by("example_id")


@pytest.mark.parametrize("order", [0, 1])
def test_the_streaming_stages_equal_the_reference(world: World, order: int) -> None:
    """Copies in separate batches (so separate id-stage calls) and user
    shards, in both arrival orders."""
    events = _layouts(world)[order]
    batches = [events.slice(i, 97) for i in range(0, events.num_rows, 97)]
    got = _streamed_examples(world, batches, shards=3)
    expected = _reference(world, events).examples
    assert got.num_rows == expected.num_rows
    for name in expected.column_names:
        column = got.column(name).cast(expected.schema.field(name).type)
        assert column.equals(expected.column(name)), name


def test_the_id_stage_forgets_after_the_horizon(world: World) -> None:
    config = StreamConfig(granularity_ms=MINUTE_MS)
    seen = id_projection(pa.concat_tables([world.events, world.copies]))
    times = seen.column("event_time").to_numpy()
    retention = config.allowed_lateness_ms + DUPLICATE_HORIZON_MS
    assert forget_ids(seen, int(times.min()) + retention - 1, config).equals(seen)
    assert forget_ids(seen, int(times.max()) + retention, config).num_rows == 0
    # A copy's id goes with the id's earliest copy: the earlier copy here.
    earlier = world.copies.slice(1, 1).to_pylist()[0]
    at = int(earlier["event_time"].timestamp() * 1000) + retention
    kept = forget_ids(seen, at, config).column("event_id").to_pylist()
    assert earlier["event_id"] not in kept


def test_the_shard_filter_keeps_only_the_winning_user_and_time(world: World) -> None:
    rows = pa.concat_tables([world.copies, world.events])
    winners = copy_winners(id_projection(rows))
    assert winners.num_rows == 3  # the copies under another user
    kept = drop_losing_copies(rows, winners)
    assert kept.num_rows == rows.num_rows - 3
