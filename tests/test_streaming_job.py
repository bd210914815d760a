"""The streaming job end to end on the embedded broker: same examples as the batch
job, late events handled, dead letters, Feast pushes.

One bounded run (``--stream-idle-seconds``) on each runner, Prism and Beam's
portable FlinkRunner, is shared by the module's tests. Its input
stream is a generated world published in event-time order (with the
generator's duplicates), then malformed messages, then events that arrive
late: some within the allowed lateness (they must be incorporated) and some
beyond it (they must be dead-lettered with a ``late:`` reason). The oracle is
the single-process reference (tested equal to the Beam batch job in
``test_build.py``) run on exactly the events that were not too late.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from feast import FeatureStore

from benchmarks.generated import generated_tables
from features.deadletter import DeadLetter
from features.example_messages import decode_example_message
from features.kafka import KafkaSettings, topic_records
from features.windows import attach_windows
from launchers.flink_job_server import FlinkJobServer
from pipelines import build
from pipelines.core.reference import ReferenceOutput, write_output
from pipelines.feast import ops as feast_ops
from pipelines.sources.event_stream import publish_events, publish_raw
from pipelines.sources.synthetic import GeneratorConfig, validation_now_ms

pytestmark = pytest.mark.integration

CONFIG = GeneratorConfig(users=60, ads=20, days=3, seed=3)
NOW = validation_now_ms(CONFIG)
LATENESS_MS = 2 * 3_600_000
ALLOWED_LATE, TOO_LATE = 12, 6
MAX_SEQ_LEN = 32
GARBAGE = [b"\xff\xfe", b"{not json", json.dumps({"event_id": "x"}).encode()]


@dataclass(frozen=True)
class StreamRun:
    """One bounded streaming run and what it should have produced."""

    summary: dict[str, Any]
    examples: pa.Table
    messages: list[tuple[pa.Table, pa.Table, int]]
    dead_letters: list[dict[str, Any]]
    reference: ReferenceOutput
    too_late_ids: set[str]
    late_users: set[int]
    store: FeatureStore


def read_topic(settings: KafkaSettings, topic: str) -> list[bytes]:
    """Every message value of a topic."""
    return [record.value for record in topic_records(settings, topic)]


def late_copies(events: pa.Table, count: int, shift_ms: int, tag: str) -> pa.Table:
    """Copies of the newest events, ``shift_ms`` older, with new ids."""
    newest = events.sort_by([("event_time", "descending")]).slice(0, count)
    times = pc.subtract(
        newest.column("event_time").cast(pa.int64()), pa.scalar(shift_ms, pa.int64())
    ).cast(events.schema.field("event_time").type)
    ids = pa.array([f"{tag}-{i}" for i in range(count)], pa.string())
    newest = newest.set_column(
        newest.schema.get_field_index("event_time"), "event_time", times
    )
    newest = newest.set_column(
        newest.schema.get_field_index("event_id"), "event_id", ids
    )
    return newest.cast(events.schema)


def with_shared_ids(events: pa.Table) -> pa.Table:
    """The events and copies of three impressions under another user (one
    of them ten minutes earlier, so that copy wins), in event-time order."""
    impressions = events.filter(pc.equal(events.column("action"), "impression"))
    users = sorted(set(events.column("user_id").to_pylist()))
    rows = []
    for index, row in enumerate(
        impressions.slice(impressions.num_rows // 2, 3).to_pylist()
    ):
        other = next(u for u in users if u != row["user_id"])
        copy = row | {"user_id": other}
        if index == 1:
            copy["event_time"] = row["event_time"] - dt.timedelta(minutes=10)
        rows.append(copy)
    copies = pa.Table.from_pylist(rows, schema=events.schema)
    return pa.concat_tables([events, copies]).sort_by("event_time")


@pytest.fixture(scope="module", params=["prism", "flink"])
def run(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    kafka_settings: KafkaSettings,
) -> StreamRun:
    """Publish, run the streaming job once (bounded) on Prism or on Beam's
    portable FlinkRunner (an embedded Flink), read everything back."""
    from features.kafka import ensure_topics

    root = tmp_path_factory.mktemp("stream")
    tables = generated_tables(CONFIG, root / "gen")
    events = tables.events
    suffix = uuid.uuid4().hex[:8]
    events_topic, examples_topic = f"ev-{suffix}", f"ex-{suffix}"
    # One partition: the arrival order (hence what is late) is the test's.
    ensure_topics(kafka_settings, {events_topic: 1})
    # Three event_ids also under another user: one event each, as in batch.
    shared = with_shared_ids(events)
    publish_events(shared, kafka_settings, events_topic)
    publish_raw(GARBAGE, kafka_settings, events_topic, key=b"0")
    allowed = late_copies(events, ALLOWED_LATE, LATENESS_MS // 2, "late-ok")
    too_late = late_copies(events, TOO_LATE, 2 * LATENESS_MS, "too-late")
    publish_events(allowed, kafka_settings, events_topic)
    publish_events(too_late, kafka_settings, events_topic)

    # The batch oracle on what should count, and a Feast repo on its tables.
    kept = pa.concat_tables([shared, allowed])
    reference = tables.reference(kept)
    features = root / "features"
    write_output(reference, features, now_ms=NOW)
    state = root / "feast"
    project = f"s{suffix}"
    store = FeatureStore(
        config=feast_ops.repo_config("local", state_dir=state, project=project)
    )
    feast_ops.apply(store, features)

    flags = [
        "--streaming",
        f"--input={root / 'gen'}",
        f"--kafka-bootstrap={kafka_settings.bootstrap}",
        f"--events-topic={events_topic}",
        f"--examples-topic={examples_topic}",
        "--shards=4",
        "--entity-shards=2",
        f"--max-seq-len={MAX_SEQ_LEN}",
        "--out-of-orderness-ms=0",
        f"--allowed-lateness-ms={LATENESS_MS}",
        "--release-granularity-ms=3600000",
        "--stream-idle-seconds=0.5",
        f"--now-ms={NOW}",
        f"--feast-state-dir={state}",
        f"--feast-project={project}",
    ]
    if request.param == "flink":
        with FlinkJobServer(log_path=root / "flink.log") as server:
            summary = build.run([*server.beam_flags(), *flags])
    else:
        summary = build.run(["--runner=DirectRunner", *flags])  # Prism
    messages = []
    for value in read_topic(kafka_settings, examples_topic):
        decoded = decode_example_message(value)
        assert decoded.ok, decoded.reason
        assert decoded.examples is not None
        assert decoded.segments is not None
        messages.append((decoded.examples, decoded.segments, decoded.max_seq_len or 0))
    dead = [
        json.loads(v) for v in read_topic(kafka_settings, f"{events_topic}.dead-letter")
    ]
    examples = pa.concat_tables([m[0] for m in messages]).sort_by("example_id")
    return StreamRun(
        summary=summary,
        examples=examples,
        messages=messages,
        dead_letters=dead,
        reference=reference,
        too_late_ids=set(too_late.column("event_id").to_pylist()),
        late_users=set(allowed.column("user_id").to_pylist()),
        store=store,
    )


def test_examples_equal_the_batch_job(run: StreamRun) -> None:
    expected = run.reference.examples
    assert run.examples.num_rows == expected.num_rows > 0
    # Each example once (the topic is exactly-once), every column equal.
    assert len(set(run.examples.column("example_id").to_pylist())) == expected.num_rows
    for name in expected.column_names:
        got = run.examples.column(name).cast(expected.schema.field(name).type)
        assert got.equals(expected.column(name)), name
    # Late events within the allowed lateness are in: their impressions are
    # examples, and they count in the others' features.
    late_ids = {
        i for i in expected.column("example_id").to_pylist() if i.startswith("late-ok")
    }
    assert late_ids, "the late copies include impressions"
    # The ids also under another user: the id stage told the shards, and each
    # is one example (the equal columns above say it is the winning copy's).
    assert run.summary["counts"]["event_id_notices"] >= 3


def test_message_windows_equal_the_full_timelines(run: StreamRun) -> None:
    for examples, segments, window in run.messages:
        assert window == MAX_SEQ_LEN
        from_segments = attach_windows(examples, segments, MAX_SEQ_LEN)
        from_timelines = attach_windows(examples, run.reference.timelines, MAX_SEQ_LEN)
        assert from_segments.equals(from_timelines)


def test_dead_letters_have_their_reasons_and_counts_add_up(run: StreamRun) -> None:
    letters = [DeadLetter.from_json(json.dumps(d)) for d in run.dead_letters]
    late = [d for d in letters if d.reason.startswith("late:")]
    assert {json.loads(d.payload)["event_id"] for d in late} == run.too_late_ids
    assert len(letters) == len(GARBAGE) + TOO_LATE
    assert all(d.partition == 0 for d in letters)
    # The garbage, byte for byte, at the offsets it was published at (after
    # the data set's events, on the one partition).
    garbage = [d for d in letters if not d.reason.startswith("late:")]
    assert [d.payload for d in garbage] == GARBAGE
    first = run.summary["counts"]["events_read"] - ALLOWED_LATE - TOO_LATE - 3
    assert [d.offset for d in garbage] == [first, first + 1, first + 2]
    counts = run.summary["counts"]
    assert (
        counts["events_read"] == counts["events_valid"] + counts["events_dead_lettered"]
    )
    assert counts["events_dead_lettered"] == len(run.dead_letters)
    assert counts["events_late_allowed"] == ALLOWED_LATE
    assert counts["examples_published"] == run.examples.num_rows


def _expected_counters(
    run: StreamRun, user: int
) -> tuple[dt.datetime, dict[str, float]]:
    """Brute force: the user's ad events before (newest event + 1 ms)."""
    timeline = run.reference.timelines.filter(
        pc.equal(run.reference.timelines["user_id"], user)
    )
    times = timeline.column("event_time")[0].values.cast(pa.int64()).to_numpy()
    actions = timeline.column("seq_action")[0].values.to_numpy()
    at = int(times.max()) + 1
    out = {}
    for code, action in enumerate(("impression", "click", "conversion"), start=1):
        for window, ms in (("1h", 3_600_000), ("1d", 86_400_000), ("7d", 604_800_000)):
            hit = (actions == code) & (times >= at - ms) & (times < at)
            out[f"user_{action}_count_{window}"] = float(hit.sum())
    return dt.datetime.fromtimestamp(at / 1000, dt.UTC), out


def test_pushed_counters_and_sequences_are_online(run: StreamRun) -> None:
    users = sorted(
        set(run.reference.timelines.column("user_id").to_pylist()) - run.late_users
    )
    chosen = users[:5]
    names = [f"user_counters:{n}" for n in _expected_counters(run, chosen[0])[1]]
    online = run.store.get_online_features(
        features=[*names, "user_sequence:seq_item_id"],
        entity_rows=[{"user_id": u} for u in chosen],
    ).to_dict()
    for row, user in enumerate(chosen):
        _, expected = _expected_counters(run, user)
        for name, value in expected.items():
            assert online[name][row] == value, (user, name)
        timeline = run.reference.timelines.filter(
            pc.equal(run.reference.timelines["user_id"], user)
        )
        items = timeline.column("seq_item_id")[0].values.to_pylist()
        assert list(online["seq_item_id"][row]) == items[-64:]
    assert run.summary["counts"]["feast_rows_pushed"] > 0
    # Event-to-online freshness, as the runner reports the Beam metrics.
    ages = run.summary["distributions"]["event_to_online_ms"]
    gauges = run.summary["gauges"]
    assert ages["count"] > 0
    assert 0 <= gauges["event_to_online_p50_ms"] <= gauges["event_to_online_p99_ms"]
    assert gauges["event_to_online_p99_ms"] <= ages["max"]


def test_streaming_needs_its_topics(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--events-topic"):
        build.run(["--streaming", f"--input={tmp_path}", "--kafka-bootstrap=x:1"])


def test_runners_that_cannot_stream_are_refused(tmp_path: Path) -> None:
    for runner in ("FnApiRunner", "BundleBasedDirectRunner"):
        with pytest.raises(SystemExit, match="cannot stream"):
            build.run(
                [
                    "--streaming",
                    f"--runner={runner}",
                    f"--input={tmp_path}",
                    "--events-topic=e",
                    "--examples-topic=x",
                    "--kafka-bootstrap=127.0.0.1:1",
                ]
            )


def test_a_directrunner_stream_runs_on_the_local_prism() -> None:
    from apache_beam.options.pipeline_options import (
        DebugOptions,
        PipelineOptions,
        PortableOptions,
        StandardOptions,
    )

    from pipelines.beam.runner import prism_binary, prism_location
    from pipelines.streaming.job import choose_streaming_runner

    options = PipelineOptions(["--runner=DirectRunner"])
    choose_streaming_runner(options)
    assert options.view_as(StandardOptions).runner == "PrismRunner"
    assert prism_location(options) == str(prism_binary())
    # No runner-initiated splits; the job outlives the job server's timeout.
    assert "prism_disable_sdf_split" in options.view_as(DebugOptions).experiments
    assert options.view_as(PortableOptions).job_server_timeout > 86_400
