"""The Beam feature job end to end: same output as the single-process reference.

One pipeline run on a small generated data set (plus injected invalid and
duplicated events) is shared by the module; MovieLens 100k is compared when the
shared data is present; the Kafka in/out path runs against the embedded broker.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import (
    PipelineOptions,
    PrismRunnerOptions,
    StandardOptions,
)

from features.deadletter import DeadLetter
from features.example_messages import SCHEMA_HEADER, decode_example_message
from features.examples import TIMELINE_SCHEMA, training_example_schema
from features.feature_tables import (
    COUNT_NAMES,
    FEATURE_TABLES,
    LAYOUT_VERSION,
    read_feature_table,
    table_folder,
    table_parts,
)
from features.kafka import KafkaSettings
from features.windows import attach_windows
from launchers.flink_job_server import FlinkJobServer
from pipelines import build
from pipelines.beam.runner import (
    prepare_runner,
    prism_binary,
    runner_name,
    use_local_prism,
)
from pipelines.core.event_files import InputFileError
from pipelines.core.reference import (
    ReferenceOutput,
    build_reference,
    read_event_input,
    read_input,
)
from pipelines.sources.event_stream import publish_events, publish_raw
from pipelines.sources.synthetic import (
    GeneratorConfig,
    generate_dataset,
    validation_now_ms,
)
from pipelines.sources.synthetic.writer import read_events
from tests.test_reference import assert_counts_add_up

ROOT = Path(__file__).resolve().parents[1]
MOVIELENS = ROOT.parent / "shared" / "data" / "movielens-100k"
RUNNER = "--runner=FnApiRunner"  # Prism's start-up adds seconds to every run
CONFIG = GeneratorConfig(users=300, ads=60, days=2, seed=5)
NOW = validation_now_ms(CONFIG)


def _bad_rows(events: pa.Table) -> pa.Table:
    """Invalid rows (bad domain, future time) and exact duplicates."""
    rows = events.slice(0, 6).to_pylist()
    rows[0]["domain"] = "myspace"
    rows[0]["event_id"] = "bad-domain"
    rows[1]["event_time"] = rows[1]["event_time"].replace(year=2100)
    rows[1]["event_id"] = "far-future"
    return pa.Table.from_pylist(rows, schema=events.schema)  # rows 2-5: duplicates


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated data set with an extra file of invalid and duplicate rows."""
    root = tmp_path_factory.mktemp("gen")
    data, _ = generate_dataset(CONFIG, root)
    extra = root / "events" / "date=2026-10-01" / "part-1.parquet"
    pq.write_table(_bad_rows(data.events), extra)
    return root


@pytest.fixture(scope="module")
def built(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Beam job's output on ``dataset`` (one run for the module), with no
    ``--runner``: the project's default."""
    out = tmp_path_factory.mktemp("beam")
    build.run(["--input", str(dataset), "--output", str(out), "--shards", "4"])
    return out


@pytest.fixture(scope="module")
def reference(dataset: Path) -> ReferenceOutput:
    """The reference's output on ``dataset``, its rows' files and rows known."""
    events, origins, users, ads, contents = read_event_input(dataset, NOW)
    return build_reference(events, users, ads, contents, now_ms=NOW, origins=origins)


def dead_letters(out: Path) -> list[DeadLetter]:
    """A job's dead letters, by file and line (or topic, partition, offset)."""
    letters = [
        DeadLetter.from_json(line)
        for path in sorted((out / "dead_letters").glob("part-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    return sorted(letters, key=lambda x: (x.source, x.partition or 0, x.offset))


def without_time(letters: list[DeadLetter]) -> list[DeadLetter]:
    """Dead letters with ``set_aside_ms``, the one field that depends on when
    a run set them aside, blanked for comparisons between runs."""
    return [replace(letter, set_aside_ms=0) for letter in letters]


def _examples(out: Path) -> pa.Table:
    table = ds.dataset(out / "examples", format="parquet", partitioning="hive")
    rows = table.to_table().drop_columns(["date"]).sort_by("example_id")
    return rows.cast(training_example_schema())


def _assert_same_as_reference(out: Path, ref: ReferenceOutput) -> None:
    got = _examples(out)
    assert got.schema.equals(training_example_schema(), check_metadata=False)
    for name in got.column_names:
        assert got.column(name).equals(ref.examples.column(name)), name
    timelines = pq.read_table(out / "timelines").sort_by("user_id")
    assert timelines.cast(TIMELINE_SCHEMA).equals(ref.timelines)
    for name, table in ref.feature_tables.items():
        for part in table_parts(table_folder(out, name)):
            schema = pq.read_schema(part)
            assert schema.equals(FEATURE_TABLES[name].schema, check_metadata=False)
        assert read_feature_table(out, name).equals(table), name
    summary = json.loads((out / "summary.json").read_text())
    assert {k: summary["counts"][k] for k in COUNT_NAMES} == ref.counts


def test_outputs_equal_the_reference(built: Path, reference: ReferenceOutput) -> None:
    _assert_same_as_reference(built, reference)


def test_direct_runner_runs_the_job_on_prism(
    dataset: Path,
    reference: ReferenceOutput,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The documented command, ``--runner=DirectRunner``: Prism runs it (the
    local binary, no download), and the outputs equal the reference's."""
    with caplog.at_level(logging.INFO):
        summary = build.run(
            ["--runner=DirectRunner", "--input", str(dataset), "--output",
             str(tmp_path), "--shards", "4"]
        )  # fmt: skip
    assert summary["runner"] == "PrismRunner"
    # Prism's own log, relayed by Beam: the local binary ran the job.
    prism = [r.getMessage() for r in caplog.records if r.name == "PrismRunner"]
    assert any("pipeline done" in line for line in prism), prism
    assert str(prism_binary()) in caplog.text
    assert "Downloading prism" not in caplog.text
    _assert_same_as_reference(tmp_path, reference)


def test_flink_runs_the_job_and_its_outputs_equal_the_reference(
    dataset: Path, reference: ReferenceOutput, tmp_path: Path
) -> None:
    """Beam's portable FlinkRunner on an embedded Flink (``make flink``): a
    runner that streams each bundle's grouped input to the worker."""
    with FlinkJobServer(log_path=tmp_path / "flink.log") as server:
        summary = build.run(
            [*server.beam_flags(), "--input", str(dataset),
             "--output", str(tmp_path / "out"), "--shards", "4"]
        )  # fmt: skip
    assert summary["runner"] == "PortableRunner"
    _assert_same_as_reference(tmp_path / "out", reference)


def test_untuned_workers_write_the_same_bytes(
    dataset: Path, built: Path, tmp_path: Path
) -> None:
    """No compute threads and no allocator tuning (the setting of runners
    with several SDK workers per machine): every output file as tuned."""
    build.run(
        ["--input", str(dataset), "--output", str(tmp_path), "--shards", "4",
         "--worker-threads", "0", "--no-tune-allocator"]
    )  # fmt: skip
    tuned = {p.relative_to(built): p.read_bytes() for p in built.rglob("*.parquet")}
    untuned = {
        p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*.parquet")
    }
    assert tuned
    assert untuned == tuned
    assert without_time(dead_letters(tmp_path)) == without_time(dead_letters(built))


def test_no_runner_flag_runs_on_the_fnapi_runner(built: Path) -> None:
    summary = json.loads((built / "summary.json").read_text())
    assert summary["runner"] == "FnApiRunner"
    options = PipelineOptions([])
    prepare_runner(options)
    assert options.view_as(StandardOptions).runner == "FnApiRunner"


def test_a_missing_prism_binary_is_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("GEM_PRISM", "/nonexistent/prism")
    options = PipelineOptions(["--runner=DirectRunner"])
    with caplog.at_level(logging.WARNING, logger="pipelines.beam.runner"):
        use_local_prism(options)
    assert options.view_as(PrismRunnerOptions).prism_location is None
    assert "no Prism binary at /nonexistent/prism (run `make prism`)" in caplog.text
    for runner in ("FnApiRunner", "FlinkRunner"):  # not theirs to use
        assert runner_name(PipelineOptions([f"--runner={runner}"])) == runner


def test_layout_and_counts_add_up(built: Path) -> None:
    summary = json.loads((built / "summary.json").read_text())
    counts = summary["counts"]
    assert summary["now_ms"] == NOW
    assert summary["layout_version"] == LAYOUT_VERSION
    assert_counts_add_up({k: counts[k] for k in COUNT_NAMES})
    assert counts["examples"] > 0
    assert counts["duplicates_removed"] >= 4  # the injected copies, at least
    days = sorted(p.name for p in (built / "examples").iterdir())
    assert days
    assert all(d.startswith("date=2026-10-0") for d in days)
    assert all(p.name.startswith("part-") for p in (built / "timelines").iterdir())


def test_dead_letters_hold_fields_and_reason(
    built: Path, reference: ReferenceOutput
) -> None:
    letters = dead_letters(built)
    by_id = {json.loads(letter.payload)["event_id"]: letter for letter in letters}
    assert set(by_id) == {"bad-domain", "far-future"}
    bad = by_id["bad-domain"]
    assert bad.reason == "field 'domain' has unknown value 'myspace'"
    assert "in the future" in by_id["far-future"].reason
    assert isinstance(json.loads(by_id["far-future"].payload)["event_time"], int)
    # Where they came from: the injected file, rows 1 and 2.
    assert bad.source.endswith("date=2026-10-01/part-1.parquet")
    assert (bad.partition, bad.offset) == (None, 1)
    assert by_id["far-future"].offset == 2
    # The same letters as the reference's, but for when they were set aside.
    assert without_time(letters) == without_time(list(reference.letters))


def _beam_job(flags: list[str]) -> object:
    return build.run([RUNNER, *flags])


def _polars_peer(flags: list[str]) -> object:
    from benchmarks import polars_peer

    return polars_peer.main(flags)


@pytest.mark.parametrize("job", [_beam_job, _polars_peer], ids=["beam", "polars"])
def test_movielens_equals_the_reference(
    job: Callable[[list[str]], object], tmp_path: Path
) -> None:
    if not (MOVIELENS / "u.data").is_file():
        pytest.skip(f"MovieLens 100k not present at {MOVIELENS}")
    from pipelines.sources import movielens

    source = tmp_path / "ml"
    movielens.run(MOVIELENS, source)
    out = tmp_path / "out"
    job(["--input", str(source), "--output", str(out), "--now-ms", str(NOW)])
    _assert_same_as_reference(out, build_reference(*read_input(source), now_ms=NOW))


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_input_file_fails_naming_the_file(
    dataset: Path, tmp_path: Path, damage: str
) -> None:
    broken = tmp_path / "broken"
    (broken / "events" / "date=2026-10-01").mkdir(parents=True)
    for name in ("users.parquet", "ads.parquet", "contents.parquet"):
        (broken / name).write_bytes((dataset / name).read_bytes())
    good = (dataset / "events" / "date=2026-10-01" / "part-0.parquet").read_bytes()
    bad = good[: len(good) // 2] if damage == "truncate" else b"not parquet" * 100
    path = broken / "events" / "date=2026-10-01" / "part-0.parquet"
    path.write_bytes(bad)
    with pytest.raises(InputFileError, match=str(path)):
        build.run([RUNNER, "--input", str(broken), "--output", str(tmp_path / "o")])


def test_jsonl_input_dead_letters_bad_lines(dataset: Path, tmp_path: Path) -> None:
    source = tmp_path / "jsonl"
    (source / "events").mkdir(parents=True)
    for name in ("users.parquet", "ads.parquet", "contents.parquet"):
        (source / name).write_bytes((dataset / name).read_bytes())
    events = read_events(dataset).slice(0, 500)
    from features.events import encode_event_table

    lines = [*encode_event_table(events), b"\xff\xfe", b'{"event_id": 1', b"[1, 2]"]
    (source / "events" / "part-0.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    summary = build.run(
        [
            RUNNER,
            "--input",
            str(source),
            "--output",
            str(tmp_path / "o"),
            "--now-ms",
            str(NOW),
            "--shards",
            "2",
        ]
    )
    counts = summary["counts"]
    assert counts["events_read"] == len(lines)
    assert counts["events_dead_lettered"] == 3
    assert counts["events_valid"] + counts["events_dead_lettered"] == len(lines)
    letters = dead_letters(tmp_path / "o")
    assert [x.payload for x in letters] == lines[-3:]
    assert [x.offset for x in letters] == [len(lines) - 2, len(lines) - 1, len(lines)]
    assert letters[0].reason.startswith("not UTF-8")
    assert letters[1].reason.startswith("not JSON")


def test_every_feature_table_is_written_when_no_event_is_valid(
    dataset: Path, tmp_path: Path
) -> None:
    """Tables no shard made a part of get one empty part; the profiles come
    from the dimension tables alone."""
    source = tmp_path / "jsonl"
    (source / "events").mkdir(parents=True)
    for name in ("users.parquet", "ads.parquet", "contents.parquet"):
        (source / name).write_bytes((dataset / name).read_bytes())
    (source / "events" / "part-0.jsonl").write_bytes(b"[1]\n{}\n")
    out = tmp_path / "o"
    summary = build.run(
        [RUNNER, "--input", str(source), "--output", str(out), "--now-ms", str(NOW)]
    )
    assert summary["counts"]["events_dead_lettered"] == 2
    for name, spec in FEATURE_TABLES.items():
        parts = table_parts(table_folder(out, name))
        assert [p.name for p in parts] == ["part-00000.parquet"], name
        table = read_feature_table(out, name)
        assert table.schema.equals(spec.schema, check_metadata=False)
        assert (table.num_rows > 0) == name.endswith("_profile"), name


def test_feature_tables_are_written_a_part_per_shard(built: Path) -> None:
    """No table is gathered whole: each shard writes its own part, and an
    entity lies in one part."""
    for name in FEATURE_TABLES:
        parts = table_parts(table_folder(built, name))
        # A part per user shard (4); the ad kinds have one shard per four,
        # and a profile table is one part (its dimension table).
        sharded = name in ("user_counters", "user_sequence")
        assert len(parts) == (4 if sharded else 1), name
        entities = [
            set(
                pq.read_table(p, columns=[FEATURE_TABLES[name].entity])
                .column(0)
                .to_pylist()
            )
            for p in parts
        ]
        assert sum(map(len, entities)) == len(set().union(*entities)), name


@pytest.mark.integration
def test_kafka_in_and_out(
    dataset: Path,
    tmp_path: Path,
    kafka_settings: KafkaSettings,
    kafka_topic: Callable[[int], str],
    reference: ReferenceOutput,
) -> None:

    events_topic, examples_topic = kafka_topic(3), kafka_topic(2)
    events = read_events(dataset)
    publish_events(events, kafka_settings, events_topic)
    publish_raw([b"\xff", b"{}"], kafka_settings, events_topic, key=b"bad")
    source = tmp_path / "dims"  # dimension tables only: events come from Kafka
    source.mkdir()
    for name in ("users.parquet", "ads.parquet", "contents.parquet"):
        (source / name).write_bytes((dataset / name).read_bytes())
    out = tmp_path / "out"
    argv = [
        RUNNER,
        "--input",
        str(source),
        "--output",
        str(out),
        "--now-ms",
        str(NOW),
        "--kafka-bootstrap",
        str(kafka_settings.bootstrap),
        "--events-topic",
        events_topic,
        "--kafka-group-id",
        f"g-{uuid.uuid4().hex}",
        "--examples-topic",
        examples_topic,
        "--examples-per-message",
        "300",
        "--max-seq-len",
        "16",
        "--shards",
        "4",
    ]
    summary = build.run(argv)
    counts, published = summary["counts"], summary["published"]
    assert counts["events_read"] == events.num_rows + 2
    assert (
        counts["events_dead_lettered"] == reference.counts["events_dead_lettered"] + 2
    )
    assert counts["examples"] == reference.counts["examples"]
    assert published["examples"] == counts["examples"]

    consumer = kafka_settings.consumer(
        examples_topic,
        group_id=f"t-{uuid.uuid4().hex}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=64 << 20,
    )
    decoded: list[Any] = []
    try:
        while len(decoded) < published["messages"]:
            for batch in consumer.poll(timeout_ms=2000).values():
                for message in batch:
                    headers = [(k, v) for k, v in message.headers]
                    assert (SCHEMA_HEADER, b"1") in headers
                    result = decode_example_message(message.value, headers)
                    assert result.ok, result.reason
                    decoded.append((message.key, result))
    finally:
        consumer.close()
    full = reference.timelines
    seen = set()
    for _, message in decoded:
        ids = message.examples.column("example_id").to_pylist()
        seen.update(ids)
        users = message.segments.column("user_id").to_numpy()
        assert np.unique(users).size == users.size  # each segment once
        windows = attach_windows(message.examples, message.segments, 16)
        assert windows.equals(attach_windows(message.examples, full, 16))
    assert seen == set(reference.examples.column("example_id").to_pylist())
    # One key per shard: a user's examples in order within one partition.
    times: dict[int, list[int]] = {}
    for _, message in decoded:
        ex = message.examples
        for user, t in zip(
            ex["user_id"].to_pylist(),
            ex["event_time"].cast(pa.int64()).to_pylist(),
            strict=True,
        ):
            times.setdefault(user, []).append(t)
    assert all(t == sorted(t) for t in times.values())
