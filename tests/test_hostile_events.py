"""Hostile event input: every reader dead-letters it, keeps the evidence, goes on.

Each hostile payload below can stop a careless reader with a traceback
(recursion, integer conversion, int64 overflow building a table, a lone
surrogate failing to encode). Here each one goes through every path that reads
events from outside: :func:`features.events.decode_event`, the batch job on
JSONL and Parquet files, the reference on the same files, the Beam job's
events-topic reader, :func:`pipelines.sources.event_stream.read_events` and
the streaming job's reader, on a real broker. Each path must count ``read =
valid + dead letters``, and each dead letter must hold the original bytes,
where they came from (file and line or row, or topic, partition and offset)
and the reason.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.fuzz_decoders import read_one_partition
from features.deadletter import DeadLetter
from features.events import (
    EVENT_COLUMNS,
    MAX_EVENT_BYTES,
    MAX_NESTING_DEPTH,
    MAX_NUMBER_DIGITS,
    decode_event,
    encode_event,
    encode_event_table,
    events_from_records,
    validate_event,
)
from features.fields import MAX_STRING_CHARS
from features.kafka import KafkaSettings, topic_records
from pipelines import build
from pipelines import reference as reference_command
from pipelines.core.event_files import row_payloads
from pipelines.sources.event_stream import publish_raw, read_events
from pipelines.sources.synthetic import GeneratorConfig, validation_now_ms
from pipelines.sources.synthetic.writer import read_events as read_generated

CONFIG = GeneratorConfig(users=20, ads=6, days=1, seed=11)
NOW = validation_now_ms(CONFIG)


def _good_records(dataset: Path, count: int) -> list[dict[str, Any]]:
    """Valid impressions of the generated data set, wire-ready."""
    events = read_generated(dataset)
    rows: dict[str, dict[str, Any]] = {}
    for line in encode_event_table(events):
        record = json.loads(line)
        if record["action"] == "impression":
            rows.setdefault(record["event_id"], record)  # copies once
    return list(rows.values())[:count]


def _with_raw(record: dict[str, Any], name: str, raw: bytes) -> bytes:
    """``record``'s wire form with field ``name``'s JSON value replaced by
    ``raw`` (which need not be JSON, nor UTF-8)."""
    marker = "__raw_value__"
    wire = encode_event({**record, name: marker})
    return wire.replace(json.dumps(marker).encode(), raw)


def hostile_payloads(good: dict[str, Any]) -> list[tuple[str, bytes, str]]:
    """``(what, payload, start of the reason)`` for each hostile input."""
    deep = 5_000
    return [
        ("nesting", b"[" * deep + b"]" * deep, f"JSON nested {deep} levels deep"),
        (
            "nesting in a record",
            _with_raw(good, "event_id", b"[" * 3_000 + b"]" * 3_000),
            f"JSON nested 3001 levels deep, more than the {MAX_NESTING_DEPTH} allowed",
        ),
        (
            "integer of thousands of digits",
            _with_raw(good, "user_id", b"7" * 5_000),
            f"integer of 5000 digits, more than the {MAX_NUMBER_DIGITS} allowed",
        ),
        (
            "id of 2**63",
            _with_raw(good, "user_id", str(2**63).encode()),
            f"field 'user_id' is {2**63}, outside the int64 range",
        ),
        (
            "id below -2**63",
            _with_raw(good, "ad_id", str(-(2**63) - 1).encode()),
            f"field 'ad_id' is {-(2**63) - 1}, outside the int64 range",
        ),
        (
            "surrogate escape in a valid record",
            _with_raw(good, "event_id", b'"\\ud800"'),
            "field 'event_id' is not valid UTF-8 text",
        ),
        (
            "surrogate escape in an invalid record",
            b'{"event_id":"\\udfff","user_id":',
            "not JSON: Expecting value",
        ),
        (
            "surrogate as raw CESU-8 bytes",
            _with_raw(good, "event_id", b'"\xed\xa0\x80"'),
            "not UTF-8: invalid continuation byte",
        ),
        (
            "1e400 in an int field",
            _with_raw(good, "user_id", b"1e400"),
            "field 'user_id' must be an integer, got float",
        ),
        (
            "NaN in an int field",
            _with_raw(good, "user_id", b"NaN"),
            "not JSON: NaN is not a JSON number",
        ),
        (
            "-Infinity in an int field",
            _with_raw(good, "ad_id", b"-Infinity"),
            "not JSON: -Infinity is not a JSON number",
        ),
        (
            "string over the length limit",
            _with_raw(good, "event_id", json.dumps("x" * 300).encode()),
            f"field 'event_id' has 300 characters, more than the "
            f"{MAX_STRING_CHARS} allowed",
        ),
        (
            "string over the message limit",
            _with_raw(good, "event_id", json.dumps("x" * 200_000).encode()),
            "message of ",
        ),
        (
            "many long unknown keys",
            encode_event({**good, **{"k" * 500 + str(i): 1 for i in range(50)}}),
            "unknown field(s) 'kkkk",
        ),
    ]


@pytest.fixture(scope="module")
def good(dataset: Path) -> list[dict[str, Any]]:
    return _good_records(dataset, 8)


@pytest.fixture(scope="module")
def hostile(good: list[dict[str, Any]]) -> list[tuple[str, bytes, str]]:
    return hostile_payloads(good[0])


# --- the contract -------------------------------------------------------------


def test_every_hostile_payload_is_refused_with_its_reason(
    hostile: list[tuple[str, bytes, str]],
) -> None:
    for what, payload, reason in hostile:
        decoded = decode_event(payload, now=NOW)
        assert decoded.event is None, what
        assert decoded.reason is not None, what
        assert decoded.reason.startswith(reason), (what, decoded.reason)
        # A reason is short, printable text whatever the payload held.
        assert len(decoded.reason) < 500, what
        decoded.reason.encode("utf-8")


def test_the_limits_are_inclusive(good: list[dict[str, Any]]) -> None:
    record = good[0]
    at_length = {**record, "event_id": "x" * MAX_STRING_CHARS}
    assert decode_event(encode_event(at_length), now=NOW).event is not None
    top = _with_raw(record, "ad_id", str(2**63 - 1).encode())
    assert decode_event(top, now=NOW).event is not None
    # JSON may end in white space: a valid event padded to the size limit.
    wire = encode_event(record)
    padded = wire + b" " * (MAX_EVENT_BYTES - len(wire))
    assert decode_event(padded, now=NOW).event is not None
    assert decode_event(padded + b" ", now=NOW).reason == (
        f"message of {MAX_EVENT_BYTES + 1} bytes, more than the "
        f"{MAX_EVENT_BYTES} allowed"
    )
    nested = b"[" * MAX_NESTING_DEPTH + b"]" * MAX_NESTING_DEPTH
    assert decode_event(nested, now=NOW).reason == (
        "an event must be a JSON object, got list"
    )


def test_validate_event_applies_the_same_rules_to_mappings(
    good: list[dict[str, Any]],
) -> None:
    record = good[0]
    assert validate_event({**record, "user_id": 2**63}, now=NOW) == (
        f"field 'user_id' is {2**63}, outside the int64 range"
    )
    # Python refuses to write such a number out; the reason does not try.
    huge = validate_event({**record, "user_id": -(10**5000)}, now=NOW)
    assert huge is not None
    assert huge.endswith("digits, outside the int64 range")
    assert validate_event({**record, "event_id": "\udc80"}, now=NOW) == (
        "field 'event_id' is not valid UTF-8 text"
    )
    assert validate_event({**record, "event_time": "9" * 10_000}, now=NOW) == (
        f"field 'event_time' has 10000 characters, more than the "
        f"{MAX_STRING_CHARS} allowed"
    )
    # The calendar's last minute, with an offset that moves it past it.
    edge = {**record, "event_time": "9999-12-31T23:59:59-23:59"}
    assert "in the future" in (validate_event(edge, now=NOW) or "")


def test_decode_event_never_raises_whatever_it_is_given() -> None:
    for payload in (b"", b"\x00" * 100, b'"' + b'\\"' * 30_000 + b"[" * 40, b"{" * 70):
        decoded = decode_event(payload, now=NOW)
        assert decoded.event is None
        assert decoded.reason


# --- files: the batch job and the reference -----------------------------------


def _parquet_rows(good: list[dict[str, Any]]) -> tuple[pa.Table, list[str]]:
    """Three rows: valid, an event_id of bytes that are not UTF-8, one too long."""
    rows = [
        good[3],
        {**good[4], "event_id": "placeholder"},
        {**good[5], "event_id": "y" * 300},
    ]
    table = events_from_records(rows)
    ids = [r["event_id"].encode() for r in rows]
    ids[1] = b"\xed\xa0\x80"  # a surrogate in CESU-8
    offsets = pa.array([0, *_running(len(i) for i in ids)], pa.int32())
    column = pa.Array.from_buffers(
        pa.string(), 3, [None, offsets.buffers()[1], pa.py_buffer(b"".join(ids))]
    )
    index = EVENT_COLUMNS.index("event_id")
    table = table.set_column(index, table.schema.field(index), column)
    reasons = [
        "field 'event_id' is not valid UTF-8 text",
        f"field 'event_id' has 300 characters, more than the {MAX_STRING_CHARS} "
        "allowed",
    ]
    return table, reasons


def _foreign_rows(good: list[dict[str, Any]]) -> tuple[pa.Table, list[str]]:
    """Two rows of a file whose ids are uint64: a valid one, and one whose
    user id is 2**63, which int64 cannot hold."""
    table = events_from_records([good[6], good[7]])
    index = EVENT_COLUMNS.index("user_id")
    ids = pa.array([good[6]["user_id"], 2**63], pa.uint64())
    table = table.set_column(index, "user_id", ids)
    return table, [f"field 'user_id' is {2**63}, outside the int64 range"]


def _running(lengths: Any) -> list[int]:
    total, out = 0, []
    for length in lengths:
        total += length
        out.append(total)
    return out


@pytest.fixture(scope="module")
def hostile_input(
    dataset: Path,
    good: list[dict[str, Any]],
    hostile: list[tuple[str, bytes, str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[DeadLetter], int]:
    """An input folder: a JSONL file of good, hostile and blank lines (outside
    the generator's ``date=`` layout) and a Parquet file with bad rows, deeper.

    Returns:
        The folder, the dead letters expected (set_aside_ms 0), events read.
    """
    root = tmp_path_factory.mktemp("hostile")
    (root / "events" / "nested" / "deeper").mkdir(parents=True)
    for name in ("users.parquet", "ads.parquet", "contents.parquet"):
        (root / name).write_bytes((dataset / name).read_bytes())
    jsonl = root / "events" / "hostile.jsonl"
    lines: list[bytes] = [encode_event(good[0]), b"", encode_event(good[1])]
    expected: list[DeadLetter] = []
    for _, payload, reason in hostile:
        lines.append(payload)
        expected.append(
            DeadLetter(
                source=str(jsonl),
                partition=None,
                offset=len(lines),
                reason=decode_event(payload, now=NOW).reason or "",
                payload=payload,
                set_aside_ms=0,
            )
        )
        assert expected[-1].reason.startswith(reason)
        lines.append(b"   ")  # blank: no event, but a line
    lines.append(encode_event(good[2]))
    jsonl.write_bytes(b"\n".join(lines) + b"\n")

    parquet = root / "events" / "nested" / "deeper" / "rows.parquet"
    table, reasons = _parquet_rows(good)
    pq.write_table(table, parquet)
    wire = encode_event_table(table)
    for row, reason in zip((2, 3), reasons, strict=True):
        expected.append(
            DeadLetter(
                source=str(parquet),
                partition=None,
                offset=row,
                reason=reason,
                payload=wire[row - 1],
                set_aside_ms=0,
            )
        )
    foreign = root / "events" / "nested" / "foreign.parquet"
    uint_table, uint_reasons = _foreign_rows(good)
    pq.write_table(uint_table, foreign)
    expected.append(
        DeadLetter(
            source=str(foreign),
            partition=None,
            offset=2,
            reason=uint_reasons[0],
            payload=row_payloads(uint_table)[1],
            set_aside_ms=0,
        )
    )
    read = sum(1 for line in lines if line.strip())
    read += table.num_rows + uint_table.num_rows
    return root, sorted(expected, key=_where), read


def _where(letter: DeadLetter) -> tuple[str, int, int]:
    return (letter.source, letter.partition or 0, letter.offset)


def _letters(out: Path) -> list[DeadLetter]:
    letters = [
        replace(DeadLetter.from_json(line), set_aside_ms=0)
        for path in sorted((out / "dead_letters").glob("part-*.jsonl"))
        for line in path.read_text(encoding="ascii").splitlines()
    ]
    return sorted(letters, key=_where)


def test_the_batch_job_dead_letters_each_hostile_line_and_row(
    hostile_input: tuple[Path, list[DeadLetter], int], tmp_path: Path
) -> None:
    root, expected, read = hostile_input
    out = tmp_path / "out"
    summary = build.run(
        ["--runner=DirectRunner", "--input", str(root), "--output", str(out),
         "--now-ms", str(NOW), "--shards", "2"]
    )  # fmt: skip
    assert summary["runner"] == "PrismRunner"
    counts = summary["counts"]
    assert counts["events_read"] == read
    assert counts["events_dead_lettered"] == len(expected)
    assert counts["events_valid"] == read - len(expected) == 5
    assert counts["examples"] == 5  # the good impressions went on
    assert _letters(out) == expected


def test_the_reference_reads_the_same_layouts_and_dead_letters_the_same(
    hostile_input: tuple[Path, list[DeadLetter], int], tmp_path: Path
) -> None:
    root, expected, read = hostile_input
    out = tmp_path / "ref"
    argv = ["--input", str(root), "--output", str(out), "--now-ms", str(NOW)]
    assert reference_command.main(argv) == 0
    counts = json.loads((out / "summary.json").read_text())["counts"]
    assert counts["events_read"] == read
    assert counts["events_dead_lettered"] == len(expected)
    assert counts["events_valid"] + counts["events_dead_lettered"] == read
    assert _letters(out) == expected


def test_a_failed_run_leaves_no_summary_behind(
    hostile_input: tuple[Path, list[DeadLetter], int], tmp_path: Path
) -> None:
    root, _, _ = hostile_input
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text('{"counts": {"examples": 1}}\n')
    broken = tmp_path / "broken"
    (broken / "events").mkdir(parents=True)
    for name in ("users.parquet", "ads.parquet", "contents.parquet"):
        (broken / name).write_bytes((root / name).read_bytes())
    # A sound footer (the inputs check passes) over a damaged first page:
    # the file fails once the job reads it.
    data = bytearray((root / "events" / "nested" / "foreign.parquet").read_bytes())
    data[4:200] = b"\xff" * 196
    (broken / "events" / "bad.parquet").write_bytes(bytes(data))
    with pytest.raises(Exception, match=r"bad\.parquet"):
        build.run(
            ["--runner=FnApiRunner", "--input", str(broken), "--output", str(out)]
        )
    assert not (out / "summary.json").exists()


# --- the events topic ---------------------------------------------------------


@pytest.mark.integration
def test_topic_readers_dead_letter_each_hostile_message(
    dataset: Path,
    good: list[dict[str, Any]],
    hostile: list[tuple[str, bytes, str]],
    kafka_settings: KafkaSettings,
    kafka_topic: Callable[[int], str],
    tmp_path: Path,
) -> None:
    topic = kafka_topic(1)
    payloads = [encode_event(good[0]), *(p for _, p, _ in hostile)]
    payloads.append(encode_event(good[1]))
    publish_raw(payloads, kafka_settings, topic, key=b"k")
    expected = sorted(
        (
            DeadLetter(
                source=topic,
                partition=0,
                offset=offset,
                reason=decode_event(payload, now=NOW).reason or "",
                payload=payload,
                set_aside_ms=0,
            )
            for offset, payload in enumerate(payloads)
            if decode_event(payload, now=NOW).event is None
        ),
        key=_where,
    )
    assert len(expected) == len(hostile)

    # The Beam job's bounded topic reader.
    dims = tmp_path / "dims"
    dims.mkdir()
    for name in ("users.parquet", "ads.parquet", "contents.parquet"):
        (dims / name).write_bytes((dataset / name).read_bytes())
    out = tmp_path / "out"
    summary = build.run(
        ["--runner=FnApiRunner", "--input", str(dims), "--output", str(out),
         "--now-ms", str(NOW), "--kafka-bootstrap", str(kafka_settings.bootstrap),
         "--events-topic", topic, "--kafka-group-id", f"g-{uuid.uuid4().hex}",
         "--shards", "2"]
    )  # fmt: skip
    counts = summary["counts"]
    assert counts["events_read"] == len(payloads)
    assert counts["events_valid"] == 2
    assert counts["events_dead_lettered"] == len(hostile)
    assert _letters(out) == expected

    # pipelines.sources.event_stream, with a copy on a dead-letter topic.
    dlq = kafka_topic(1)
    report = read_events(
        kafka_settings, topic, group_id=f"g-{uuid.uuid4().hex}", dead_letter_topic=dlq
    )
    assert report.messages == len(payloads)
    assert report.events.num_rows + len(report.dead_letters) == report.messages
    # Its clock is the wall clock: the generated times are in the past.
    got = sorted((replace(d, set_aside_ms=0) for d in report.dead_letters), key=_where)
    assert got == expected
    copies = list(topic_records(kafka_settings, dlq))
    assert len(copies) == len(hostile)
    largest = max(
        copies, key=lambda r: int(dict(r.headers)["dead-letter-payload-length"])
    )
    headers = dict(largest.headers)
    # The topic takes the largest whole: the copy is the message as sent.
    assert int(headers["dead-letter-payload-length"]) > MAX_EVENT_BYTES
    assert len(largest.value) == int(headers["dead-letter-payload-length"])
    assert headers["dead-letter-truncated"] == b"false"

    # The streaming job's reader, on the same messages: the same letters.
    letters, valid, read = _stream_read(kafka_settings, topic)
    assert read == len(payloads) == valid + len(letters)
    assert [replace(d, set_aside_ms=0) for d in letters] == expected


def _small_topic(settings: KafkaSettings, max_bytes: int) -> str:
    """A topic that takes records of at most ``max_bytes``."""
    from kafka.admin import NewTopic

    name = f"small-{uuid.uuid4().hex[:12]}"
    admin = settings.admin()
    try:
        admin.create_topics(
            [NewTopic(name, 1, 1, topic_configs={"max.message.bytes": str(max_bytes)})]
        )
    finally:
        admin.close()
    return name


def test_a_letter_larger_than_its_topic_is_cut_to_fit_never_dropped(
    kafka_settings: KafkaSettings, kafka_topic: Callable[[int], str]
) -> None:
    """A 200 KB message against dead-letter topics of 64 KiB: the copy of
    ``pipelines.sources.event_stream`` and the streaming job's publisher each write
    the letter, cut, saying so, with the whole message's length and hash."""
    from pipelines.streaming.publish import PublishDeadLettersFn

    huge = b'{"event_id": "' + b"x" * 200_000 + b'"}'
    topic = kafka_topic(1)
    publish_raw([huge], kafka_settings, topic, key=b"0")
    limit = 65_536

    copies = _small_topic(kafka_settings, limit)
    group = f"g-{uuid.uuid4().hex}"
    report = read_events(
        kafka_settings, topic, group_id=group, dead_letter_topic=copies
    )
    (letter,) = report.dead_letters
    assert letter.payload == huge  # the report keeps every byte
    (copy,) = topic_records(kafka_settings, copies)
    headers = dict(copy.headers)
    assert len(copy.value) < limit
    assert copy.value == huge[: len(copy.value)]
    assert headers["dead-letter-truncated"] == b"true"
    assert int(headers["dead-letter-payload-length"]) == len(huge)
    assert headers["dead-letter-payload-sha256"].decode() == letter.payload_sha256

    lines = _small_topic(kafka_settings, limit)
    publisher = PublishDeadLettersFn(kafka_settings, lines)
    publisher.setup()
    try:
        list(publisher.process(letter.to_json()))
        publisher.finish_bundle()
    finally:
        publisher.teardown()
    (record,) = topic_records(kafka_settings, lines)
    published = DeadLetter.from_json(record.value.decode())
    assert published.truncated
    assert huge.startswith(published.payload)
    assert published.payload_length == len(huge)
    assert published.payload_sha256 == letter.payload_sha256
    assert (published.source, published.offset) == (topic, 0)
    assert published.reason == letter.reason


def _stream_read(
    settings: KafkaSettings, topic: str
) -> tuple[list[DeadLetter], int, int]:
    """The streaming job's reader on every message of ``topic``'s partition 0,
    polled from the broker: its dead letters, valid events, messages read."""
    from kafka import TopicPartition

    from pipelines.streaming.kafka_source import ReadTopicFn

    consumer = settings.consumer(group_id=None, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        messages: list[Any] = []
        while consumer.position(tp) < end:
            messages += consumer.poll(timeout_ms=500).get(tp, [])
    finally:
        consumer.close()
    reader = ReadTopicFn(
        settings,
        "unused",
        out_of_orderness_ms=0,
        allowed_lateness_ms=3_600_000,
        idle_seconds=None,
        now_ms=NOW,
    )
    lines, valid, claimed_all = read_one_partition(reader, topic, messages, 0)
    assert claimed_all
    return [DeadLetter.from_json(line) for line in lines], valid, len(messages)
