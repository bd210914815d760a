"""Each Beam stage on its own: ``TestPipeline | beam.Create(sample) | Stage()``.

Stages take and give Arrow tables keyed by shard; the assertions turn them
into plain values first (ids, counts) so ``equal_to`` compares Python data.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st

from features.arrow_ipc import ipc_to_table, table_to_ipc
from features.dimensions import AD_SCHEMA, CONTENT_SCHEMA, USER_SCHEMA
from features.events import encode_event_table, events_from_records
from features.memory import reuse_freed_memory
from pipelines.batch.arrow import ArrowTableCoder
from pipelines.batch.counters import (
    EXAMPLE_COUNTERS,
    FEATURE_ROWS,
    CountEngagement,
    CountEntityShardFn,
)
from pipelines.batch.examples import BuildExamples
from pipelines.batch.parallel import PooledDoFn
from pipelines.batch.timelines import BuildTimelines, CopyWinnersFn, DedupeEvents
from pipelines.batch.tuning import WorkerTuning
from pipelines.batch.validate import RawEvents, ValidateEvents, ValidateEventsFn
from pipelines.core.asof import AsOfIndex, asof_index, asof_rows
from pipelines.core.ordering import first_of_each, int_order, timeline_order
from pipelines.core.output_files import (
    BackgroundWrites,
    parquet_options,
    write_parquet_bytes,
)
from pipelines.core.timelines import (
    build_timelines,
    dedupe_events,
    user_sequence_parts,
    user_sequences,
)
from pipelines.core.window_counter import WindowCounter, count_in_windows

T0 = 1_790_000_000_000  # 2026-09-21
NOW = T0 + 30 * 86_400_000
HOUR = 3_600_000


def _pipeline() -> BeamTestPipeline:
    # FnApiRunner: DirectRunner tries to download Prism first, offline.
    return BeamTestPipeline(runner="FnApiRunner")


def _ad(
    event_id: str, t: int, user: int, action: str = "impression", **kw: Any
) -> dict[str, Any]:
    record = {
        "schema_version": 1,
        "event_id": event_id,
        "event_time": t,
        "user_id": user,
        "domain": "facebook",
        "surface": "feed",
        "action": action,
        "ad_id": 7,
        "advertiser_id": 3,
        "campaign_id": 5,
        "ad_format": "image",
        "objective": "traffic",
    }
    record.update(kw)
    return record


def _organic(event_id: str, t: int, user: int) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "event_id": event_id,
        "event_time": t,
        "user_id": user,
        "domain": "instagram",
        "surface": "reels",
        "action": "view",
        "content_id": 4,
    }


EVENTS = events_from_records(
    [
        _organic("o1", T0, 1),
        _ad("i1", T0 + 10, 1),
        _ad("c1", T0 + 20, 1, "click", impression_id="i1"),
        _ad("i2", T0 + HOUR, 1),
        _ad("i3", T0 + 5, 2),  # another user, same ad
        _ad("i3", T0 + 5, 2),  # an exact duplicate
        _ad("x9", T0 + 50, 2, "conversion", impression_id="i3"),
    ]
)


def _user(
    user: int,
    age: int,
    gender: str,
    location: str,
    device: str,
    updated_at: int = T0 - 10**9,
) -> dict[str, Any]:
    return {
        "user_id": user,
        "age": age,
        "gender": gender,
        "location": location,
        "device": device,
        "signup_time": T0 - 10**9,
        "updated_at": updated_at,
    }


USERS = pa.Table.from_pylist(
    [
        _user(1, 30, "female", "US-01", "ios"),
        _user(2, 70, "male", "US-02", "web", updated_at=T0 + 6),
    ],
    schema=USER_SCHEMA,
)
ADS = pa.Table.from_pylist(
    [
        {
            "ad_id": 7,
            "advertiser_id": 3,
            "campaign_id": 5,
            "ad_format": "image",
            "objective": "traffic",
            "creative_category": "travel",
            "created_at": T0 - 10**9,
            "updated_at": T0 - 10**9,
        }
    ],
    schema=AD_SCHEMA,
)
CONTENTS = pa.Table.from_pylist(
    [
        {
            "content_id": 4,
            "content_type": "photo",
            "content_category": "pets",
            "created_at": T0 - 10**9,
        }
    ],
    schema=CONTENT_SCHEMA,
)


def _table(p: beam.Pipeline, label: str, table: pa.Table) -> beam.PCollection:
    return p | label >> beam.Create([table]).with_output_types(pa.Table)


def test_arrow_coder_round_trips_and_is_used_for_table_hints() -> None:
    coder = beam.coders.registry.get_coder(pa.Table)
    assert isinstance(coder, ArrowTableCoder)
    assert coder.decode(coder.encode(EVENTS)).equals(EVENTS)
    assert ipc_to_table(table_to_ipc(EVENTS)).equals(EVENTS)


def test_validate_events_splits_valid_and_dead_letters() -> None:
    bad = EVENTS.slice(0, 1).to_pylist()[0] | {"surface": "inbox"}
    table = pa.concat_tables([EVENTS, events_from_records([bad])])
    lines = (*encode_event_table(EVENTS.slice(0, 2)), b"nope")
    with _pipeline() as p:
        batches = p | beam.Create(
            [
                RawEvents("a.parquet", 0, table=table),
                RawEvents("b.jsonl", 1, payloads=lines),
            ]
        ).with_output_types(RawEvents)
        out = batches | ValidateEvents(now=NOW)
        assert_that(
            out.valid | beam.Map(lambda t: t.num_rows), equal_to([7, 2]), label="Valid"
        )
        reasons = out.dead_letters | beam.Map(
            lambda line: __import__("json").loads(line)["reason"]
        )
        assert_that(
            reasons,
            equal_to(
                [
                    "surface 'inbox' does not belong to domain 'instagram'",
                    "not JSON: Expecting value at char 0",
                ]
            ),
            label="Dead",
        )


def _dedupe_and_timelines() -> tuple[Any, Any, Any]:
    p = _pipeline()
    ads, contents = _table(p, "Ads", ADS), _table(p, "Contents", CONTENTS)
    events = _table(p, "Events", EVENTS) | DedupeEvents(shards=2)
    return p, events, events | BuildTimelines(ads, contents)


def test_dedupe_and_timelines() -> None:
    p, events, timelines = _dedupe_and_timelines()
    ids = events | beam.FlatMap(lambda e: e[1].column("event_id").to_pylist())
    assert_that(ids, equal_to(["o1", "i1", "c1", "i2", "i3", "x9"]), label="Ids")
    rows = timelines | beam.FlatMap(
        lambda e: [
            (r["user_id"], r["seq_action"], r["seq_category"]) for r in e[1].to_pylist()
        ]
    )
    # actions: view=4, impression=1, click=2, conversion=3; travel=3, pets=13
    assert_that(
        rows,
        equal_to([(1, [4, 1, 2, 1], [13, 3, 3, 3]), (2, [1, 3], [3, 3])]),
        label="Timelines",
    )
    p.run().wait_until_finish()


def _counters_and_examples(p: beam.Pipeline) -> tuple[Any, beam.PCollection]:
    """The sample deduplicated, counted and built into examples (with the
    users and ads) in ``p``: the counters' outputs and the examples."""
    users, ads = _table(p, "Users", USERS), _table(p, "Ads", ADS)
    events = _table(p, "Events", EVENTS) | DedupeEvents(shards=2)
    counters = events | CountEngagement(shards=2)
    return counters, events | BuildExamples(counters[EXAMPLE_COUNTERS], users, ads)


def test_count_engagement_and_build_examples() -> None:
    p = _pipeline()
    counters, examples = _counters_and_examples(p)
    rows = examples | beam.FlatMap(
        lambda e: [
            (
                r["example_id"],
                r["label_click"],
                r["label_conversion"],
                r["user_age_bucket"],
                r["ad_impression_count_1h"],
                r["ad_impression_count_1d"],
                r["user_click_count_1d"],
                r["timeline_cut"],
            )
            for r in e[1].to_pylist()
        ]
    )
    assert_that(
        rows,
        equal_to(
            [
                # i3 (t0+5): user 2's row is updated at t0+6, after: age 0.
                ("i3", 0, 1, 0, 0.0, 0.0, 0.0, 0),
                ("i1", 1, 0, 3, 1.0, 1.0, 0.0, 1),  # i3 of user 2 counts for the ad
                ("i2", 0, 0, 3, 2.0, 2.0, 1.0, 3),  # 1h: [t0, t0+H) holds i1 and i3
            ]
        ),
        label="Examples",
    )
    tables = counters[FEATURE_ROWS] | beam.Map(
        lambda e: (e[0], ipc_to_table(e[2]).num_rows)
    )
    assert_that(
        tables | beam.CombinePerKey(sum),
        equal_to(
            [("user_counters", 5), ("ad_counters", 5), ("advertiser_counters", 5)]
        ),
        label="FeatureRows",
    )
    p.run().wait_until_finish()


def test_kernels() -> None:
    rows = asof_rows(
        np.array([1, 1, 2]),
        np.array([10, 20, 5]),
        np.array([1, 2, 3]),
        np.array([20, 4, 9]),
    )
    assert rows.tolist() == [1, -1, -1]
    counts = count_in_windows(
        np.array([5, 5]),
        np.array([100, 200]),
        np.array([5]),
        np.array([200]),
        (50, 150),
    )
    assert [c.tolist() for c in counts] == [[0], [1]]


# The kernels shared with the reference, against brute force on small random
# inputs (ties, unknown entities, times before / after every event).
_SMALL_INTS = st.lists(st.integers(0, 5), max_size=30)


def _columns(rows: list[tuple[int, ...]], width: int) -> list[np.ndarray]:
    """Columns of int tuples as int64 arrays (empty ones for no rows)."""
    table = np.array(rows, dtype=np.int64).reshape(-1, width)
    return [table[:, i] for i in range(width)]


@settings(max_examples=60, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 60), st.integers(0, 3)),
        max_size=40,
    ),
    queries=st.lists(st.tuples(st.integers(0, 6), st.integers(-80, 150)), max_size=15),
)
def test_window_counter_counts_like_brute_force(
    events: list[tuple[int, int, int]], queries: list[tuple[int, int]]
) -> None:
    ids, times, actions = _columns(events, 3)
    query_ids, query_times = _columns(queries, 2)
    windows = (1, 10, 45)
    counter = WindowCounter(ids, times, actions, 3, windows)
    counts = counter.count(query_ids, query_times)
    before = counter.before(query_ids, query_times)
    for code in (1, 2, 3):
        mine = (actions == code)[None, :] & (ids[None, :] == query_ids[:, None])
        earlier = mine & (times[None, :] < query_times[:, None])
        assert before[code - 1].tolist() == earlier.sum(axis=1).tolist()
        for window, got in zip(windows, counts[code - 1], strict=True):
            inside = earlier & (times[None, :] >= query_times[:, None] - window)
            assert got.tolist() == inside.sum(axis=1).tolist()
    # At the distinct event keys, count_at_points agrees with count.
    point_ids, point_times = counter.point_entities()
    assert sorted(set(zip(ids.tolist(), times.tolist(), strict=True))) == list(
        zip(point_ids.tolist(), point_times.tolist(), strict=True)
    )
    at_points = counter.count_at_points()
    again = counter.count(point_ids, point_times)
    for a in range(3):
        for w in range(len(windows)):
            assert at_points[a][w].tolist() == again[a][w].tolist()


@settings(max_examples=60, deadline=None)
@given(users=_SMALL_INTS, data=st.data())
def test_timeline_order_and_first_of_each(
    users: list[int], data: st.DataObject
) -> None:
    n = len(users)
    times = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    ids = data.draw(
        st.lists(
            st.sampled_from(["a", "b", "ab", "B", "é", ""]), min_size=n, max_size=n
        )
    )
    order = timeline_order(
        [np.array(users, np.int64), np.array(times, np.int64)],
        pa.array(ids, pa.string()),
    )
    expected = sorted(range(n), key=lambda i: (users[i], times[i], ids[i].encode()))
    key = [(users[i], times[i], ids[i]) for i in order.tolist()]
    assert key == [(users[i], times[i], ids[i]) for i in expected]
    first = first_of_each(pa.array(ids, pa.string()))
    assert first.tolist() == sorted(
        {v: i for i, v in reversed(list(enumerate(ids)))}.values()
    )


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(-2, 6), st.integers(0, 5)), max_size=12),
    queries=st.lists(st.tuples(st.integers(-3, 8), st.integers(-1, 7)), max_size=12),
    scale=st.sampled_from([1, 10**15]),
    time_scale=st.sampled_from([1, 2**60]),
)
def test_asof_index_finds_the_latest_version_like_brute_force(
    rows: list[tuple[int, int]],
    queries: list[tuple[int, int]],
    scale: int,
    time_scale: int,
) -> None:
    # Large ids take the binary-search path instead of the dense table, and
    # times spread over 2**62 the time-rank keys instead of int64 composites.
    dim_ids, dim_times = _columns(rows, 2)
    query_ids, query_times = _columns(queries, 2)
    dim_ids, query_ids = dim_ids * scale, query_ids * scale
    dim_times, query_times = dim_times * time_scale, query_times * time_scale
    got = AsOfIndex(dim_ids, dim_times).rows(query_ids, query_times)
    expected = []
    for qid, qt in zip(query_ids.tolist(), query_times.tolist(), strict=True):
        best = -1
        for r, (did, dt_) in enumerate(rows_of(dim_ids, dim_times)):
            # The latest time <= qt; of equal times the later row.
            if did == qid and dt_ <= qt and (best < 0 or dt_ >= dim_times[best]):
                best = r
        expected.append(best)
    assert got.tolist() == expected


def rows_of(*columns: np.ndarray) -> list[tuple[int, ...]]:
    """Rows of equal-length int columns, as tuples."""
    return list(zip(*(c.tolist() for c in columns), strict=True))


def test_asof_index_is_built_once_per_table() -> None:
    first = asof_index(ADS, "ad_id", "updated_at")
    assert asof_index(ADS, "ad_id", "updated_at") is first
    assert asof_index(ADS.slice(0), "ad_id", "updated_at") is not first
    assert asof_index(CONTENTS, "content_id", None).rows(
        np.array([4, 5]), np.array([0, 0])
    ).tolist() == [0, -1]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 4)), max_size=30),
    wide=st.booleans(),
)
def test_int_order_is_a_stable_lexicographic_sort(
    rows: list[tuple[int, int]], wide: bool
) -> None:
    major, minor = _columns(rows, 2)
    if wide:  # ranges whose product overflows int64: the lexsort path
        minor = minor * 2**61
    order = int_order([major, minor])
    assert order.tolist() == np.lexsort((minor, major)).tolist()


def test_parquet_options_write_what_they_name(tmp_path: Any) -> None:
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "user_id": pa.array([1, 2], pa.int64()),
            "times": pa.array([[5, 6], [7]], pa.list_(pa.int64())),
            "codes": pa.array([[1, 1], [1]], pa.list_(pa.int32())),
        }
    )
    options = parquet_options(table.schema, plain=["times"])
    assert options == {
        "write_statistics": ["user_id"],
        "use_dictionary": ["user_id", "codes.list.element"],
    }
    path = tmp_path / "t.parquet"
    path.write_bytes(write_parquet_bytes(table, plain=["times"]).to_pybytes())
    assert pq.read_table(path).equals(table)
    columns = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {
        columns.column(i).path_in_schema: columns.column(i).encodings
        for i in range(columns.num_columns)
    }
    assert "RLE_DICTIONARY" not in encodings["times.list.element"]
    assert "RLE_DICTIONARY" in encodings["codes.list.element"]
    with pytest.raises(ValueError, match="no columns"):
        parquet_options(table.schema, plain=["nope"])


def test_background_writes_run_in_order_and_raise() -> None:
    done: list[int] = []
    writes = BackgroundWrites(max_pending=2)
    for i in range(10):
        writes.submit(done.append, i)
    writes.wait()
    assert done == list(range(10))

    def fail() -> None:
        raise OSError("disk full")

    writes.submit(fail)
    with pytest.raises(OSError, match="disk full"):
        writes.wait()
    writes.close()


def test_user_sequence_parts_concatenate_to_the_whole_table() -> None:
    timelines = build_timelines(dedupe_events(EVENTS), ADS, CONTENTS)
    # Two pieces, users out of order, as gathered from two shards.
    gathered = pa.concat_tables([timelines.slice(1), timelines.slice(0, 1)])
    whole = user_sequences(gathered)
    assert whole.num_rows > 2
    assert whole.column("user_id").to_pylist() == sorted(
        whole.column("user_id").to_pylist()
    )
    for rows in (1, 2, whole.num_rows):
        parts = list(user_sequence_parts(gathered, rows))
        assert all(part.num_rows <= rows for part in parts)
        assert pa.concat_tables(parts).equals(whole)


class _Double(PooledDoFn):
    """Test DoFn: doubles on a pool thread, counts on the bundle's thread."""

    max_pending = 1

    def __init__(self) -> None:
        self.seen = beam.metrics.Metrics.counter("test", "seen")

    def compute(self, element: int) -> int:
        if element < 0:
            raise ValueError("negative")
        return 2 * element

    def emit(self, result: int) -> Any:
        self.seen.inc()
        yield result


@pytest.mark.parametrize("threads", [2, 0])
def test_pooled_dofn_emits_every_result_once_and_raises(threads: int) -> None:
    """On a pool, or (0 threads) on the bundle's own thread."""
    tuning = WorkerTuning(threads=threads, tune_allocator=False)
    p = _pipeline()
    doubled = (
        p
        | beam.Create(list(range(50)), reshuffle=False)
        | beam.ParDo(_Double().tuned(tuning))
    )
    assert_that(doubled, equal_to([2 * i for i in range(50)]))
    result = p.run()
    result.wait_until_finish()
    seen = result.metrics().query(beam.metrics.MetricsFilter().with_name("seen"))[
        "counters"
    ]
    assert sum(c.committed for c in seen) == 50
    failing = _pipeline()
    _ = failing | beam.Create([1, -1]) | beam.ParDo(_Double().tuned(tuning))
    with pytest.raises(Exception, match="negative"):
        failing.run().wait_until_finish()


@pytest.mark.parametrize(
    ("threads", "expected"), [(0, (0, 0, 0)), (1, (1, 2, 2)), (3, (3, 4, 4))]
)
def test_a_pool_takes_the_waiting_bundle_threads_core(
    threads: int, expected: tuple[int, int, int]
) -> None:
    """DoFns whose fused successors do little get one more thread than the
    tuning's; none where the tuning asks for work on the bundle's thread."""
    tuning = WorkerTuning(threads=threads, tune_allocator=False)
    dofns = (_Double(), CountEntityShardFn(4), CopyWinnersFn())
    assert tuple(dofn.tuned(tuning).pool_size() for dofn in dofns) == expected


def test_reuse_freed_memory_applies_once() -> None:
    reuse_freed_memory()
    assert reuse_freed_memory() is False


# --- the parser under corrupted input --------------------------------------

_VALID_LINES = encode_event_table(EVENTS)


@st.composite
def _corrupted(draw: st.DrawFn) -> bytes:
    line = draw(st.sampled_from(_VALID_LINES))
    how = draw(st.sampled_from(["keep", "truncate", "flip", "junk", "field"]))
    if how == "truncate":
        return line[: draw(st.integers(0, max(0, len(line) - 1)))]
    if how == "flip":
        i = draw(st.integers(0, len(line) - 1))
        return line[:i] + bytes([line[i] ^ draw(st.integers(1, 255))]) + line[i + 1 :]
    if how == "junk":
        return draw(st.binary(max_size=64))
    if how == "field":
        return (
            line.replace(b'"user_id":', b'"user_id":-')
            if draw(st.booleans())
            else line.replace(b'"facebook"', b'"friendster"')
        )
    return line


@settings(max_examples=60, deadline=None)
@given(st.lists(_corrupted(), max_size=25))
def test_corrupted_lines_are_counted_and_never_crash(lines: list[bytes]) -> None:
    fn = ValidateEventsFn(NOW)
    # The DoFn's work and its outputs, without a runner (or its thread pool).
    outputs = list(fn.emit(fn.compute(RawEvents("x.jsonl", 1, payloads=tuple(lines)))))
    valid = sum(o.num_rows for o in outputs if isinstance(o, pa.Table))
    dead = [o for o in outputs if not isinstance(o, pa.Table)]
    assert valid + len(dead) == len(lines)
    for letter in dead:
        assert "reason" in __import__("json").loads(letter.value)


def test_dead_letter_lines_keep_the_bytes_and_where_they_came_from() -> None:
    from features.deadletter import DeadLetter

    fn = ValidateEventsFn(NOW)
    payloads = (b"\xff", b'{"reason": "mine", "payload": NaN}')
    batch = RawEvents("x.jsonl", 3, payloads=payloads, offsets=(3, 7))
    _, lines, read = fn.compute(batch)
    assert read == 2
    letters = [DeadLetter.from_json(line) for line in lines]
    assert [x.payload for x in letters] == list(payloads)
    assert [(x.source, x.partition, x.offset) for x in letters] == [
        ("x.jsonl", None, 3),
        ("x.jsonl", None, 7),
    ]
    # The record's own keys stay in its payload, not in the letter's fields.
    assert letters[1].reason == "not JSON: NaN is not a JSON number"


def test_every_shuffle_carries_ipc_bytes_not_pickles() -> None:
    """Each GroupByKey's input coder is (int | str key, bytes-bearing value)."""
    p = _pipeline()
    _counters_and_examples(p)
    shuffled: list[str] = []

    class Visitor(beam.pipeline.PipelineVisitor):  # type: ignore[misc]
        def visit_transform(self, node: Any) -> None:
            if isinstance(node.transform, beam.GroupByKey):
                (pcoll,) = node.inputs
                shuffled.append(
                    repr(beam.coders.registry.get_coder(pcoll.element_type))
                )

    p.visit(Visitor())
    # Events by user shard, their id projections by id bucket, counters, examples.
    assert len(shuffled) == 4
    for coder in shuffled:
        assert "Pickle" not in coder
        assert "FastPrimitives" not in coder
        assert "Bytes" in coder
