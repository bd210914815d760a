"""The stateful stages' functions over many days: eviction keeps examples exact.

The Beam tests run three days, too short for the state to evict anything (the
counters look back seven days). Here the user- and entity-shard functions run
as their timers would, one release per simulated day over twelve days of
events, with the state compacted after each release, and the union of what
they release must equal the batch reference, ``timeline_cut`` (an index into
the full timeline, kept right by the evicted counts) included.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from benchmarks.generated import GeneratedTables, generated_tables
from pipelines.core.counters import ENTITY_KINDS
from pipelines.sources.synthetic import GeneratorConfig
from pipelines.streaming.config import DAY_MS, StreamConfig
from pipelines.streaming.entity_state import answer_entity_shard, entity_rows
from pipelines.streaming.tables import (
    DROPPED_SCHEMA,
    STREAM_EVENT_SCHEMA,
    answer_schema,
)
from pipelines.streaming.user_release import Dimensions, release_user_shard

CONFIG = GeneratorConfig(users=12, ads=6, days=12, seed=4)
STREAM = StreamConfig(
    shards=1,
    entity_shards=1,
    allowed_lateness_ms=60_000,
    granularity_ms=3_600_000,
    max_seq_len=8,
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> GeneratedTables:
    return generated_tables(CONFIG, tmp_path_factory.mktemp("world"))


# The stages compact their state only now and then (``due_for_compaction``):
# a release that keeps the state as it was, copies and evictable events
# included, must release the same examples.
@pytest.mark.parametrize("compact_every", [1, 3])
def test_daily_releases_with_eviction_equal_the_batch_job(
    world: GeneratedTables, compact_every: int
) -> None:
    events, dims = world.events, Dimensions(world.users, world.ads, world.contents)
    reference = world.reference()
    stream = events.append_column(
        "published_ms", pa.array(np.zeros(events.num_rows, np.int64))
    ).cast(STREAM_EVENT_SCHEMA)
    times = stream.column("event_time").cast(pa.int64()).to_numpy()
    start, end = int(times.min()), int(times.max())
    fires = [*range(start + DAY_MS, end + 3 * DAY_MS, DAY_MS)]

    state, dropped = stream, DROPPED_SCHEMA.empty_table()
    entity = {kind: entity_rows(stream, kind) for kind in ENTITY_KINDS}
    answers = {kind: answer_schema(kind).empty_table() for kind in ENTITY_KINDS}
    answered = released = np.iinfo(np.int64).min
    released_examples = []
    evicted = 0
    for step, fire in enumerate(fires):
        compact = step % compact_every == compact_every - 1
        for kind in ENTITY_KINDS:
            routed, kept, _ = answer_entity_shard(
                entity[kind],
                kind,
                answered_until=answered,
                fire=fire,
                config=STREAM,
                user_shards=1,
            )
            entity[kind] = kept if compact else entity[kind]
            answers[kind] = pa.concat_tables([answers[kind], *[t for _, t in routed]])
        answered = fire
        result = release_user_shard(
            state,
            dropped,
            answers,
            released_until=released,
            fire=fire,
            dims=dims,
            config=STREAM,
            compact=compact,
        )
        released = fire
        state, dropped, answers = result.events, result.dropped, result.answers
        evicted = max(evicted, int(sum(dropped.column("dropped").to_pylist())))
        released_examples.append(result.examples)

    assert evicted > 0, "the test must exercise eviction"
    got = pa.concat_tables(released_examples).sort_by("example_id")
    expected = reference.examples
    assert got.num_rows == expected.num_rows
    for name in expected.column_names:
        assert got.column(name).equals(expected.column(name)), name
