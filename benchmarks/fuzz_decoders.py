"""Coverage-guided fuzzing (atheris, libFuzzer) of every reader of outside bytes.

The contract of every decoder and validator below: it returns a value or a
reason and never raises. An **escape** is an exception out of the decoder, or
a result that breaks the contract (an accepted event that its consumers then
fail on, a dead letter that is not valid JSON, two validators that disagree,
a corrupted message accepted). Targets, one per reader:

=======================  ===================================================
target                   decoder (and what its result must survive)
=======================  ===================================================
decode_event             ``features.events.decode_event`` on one wire message
                         (events topic, JSONL line): an accepted event passes
                         ``validate_event``, converts to Arrow
                         (``events_from_records``), passes
                         ``validate_event_table`` and round-trips through
                         ``encode_event`` and ``encode_event_table``
event_table              ``validate_event_table`` on Arrow tables built from
                         arbitrary rows in ``EVENT_SCHEMA`` (a Parquet batch;
                         a cell may hold bytes that are not UTF-8): row for
                         row the same verdict and reason as
                         ``validate_event``; for a quarter of the inputs
                         with a rejected row the batch job's Parquet path
                         too, ``ValidateEventsFn.compute`` on
                         ``RawEvents(table=)`` (its dead letters)
jsonl_batch              ``pipelines.batch.validate.ValidateEventsFn.compute``
                         on the lines of one JSONL file (``RawEvents`` of
                         payloads): counts balance, every dead-letter line is
                         strict JSON that UTF-8 can encode
parquet_file             the batch job's reader of one Parquet events file
                         (``pipelines.batch.inputs.ReadEventFileFn``) whose columns
                         have the contract's types or foreign ones (uint64
                         ids, float ids, naive or nanosecond times, binary or
                         dictionary strings), written on tmpfs, then
                         ``ValidateEventsFn``: every row valid or one dead
                         letter, or the file refused with a reason
stream_event             the streaming job's reader,
                         ``pipelines.streaming.kafka_source.ReadTopicFn``'s
                         ``_read_partition`` on one poll (a message per input
                         line): events + dead letters = messages read, every
                         dead letter strict JSON
example_message          ``features.example_messages.decode_example_message``
                         on raw record values: tables in the contract schemas;
                         a copy of a valid message with up to 4 adjacent bytes
                         changed is never accepted
example_message_body     the same decoder on messages re-framed with
                         ``frame_streams`` (a valid checksum), so mutations
                         reach the Arrow decoding behind the checksum
trainer_example_record   ``trainer.data.kafka_source.KafkaSource._decode`` (the
                         daemon's consumer thread: decode, ``make_batch``,
                         dead letter) on re-framed messages: a batch, or one
                         dead letter with the original bytes
teacher_message          ``trainer.distill.records.decode_teacher_message``
                         and the student daemon's ``teacher_decoder`` (which
                         adds the teacher's embedding width) on raw values;
                         accepted rows must survive ``TeacherCache.add`` /
                         ``aligned`` and ``AlignedTeacher``
teacher_message_body     the same on IPC streams framed with a valid CRC-32
dead_letter              ``features.deadletter.DeadLetter`` of arbitrary
                         source, reason and payload bytes: ``to_json`` is one
                         line of strict ASCII JSON, ``from_json`` gives the
                         letter back, ``truncated_to`` keeps length and hash,
                         ``kafka_headers`` are bytes
dimension_rows           ``features.dimensions.validate_user`` / ``_ad`` /
                         ``_content`` on JSON objects: an accepted row fits
                         its Arrow schema
=======================  ===================================================

``pipelines.sources.event_stream.read_events`` has no decoder of its own: it calls
``decode_event`` per message and keeps a ``DeadLetter`` (targets
``decode_event`` and ``dead_letter``).

**Escapes do not stop a run.** Each target catches every exception inside the
fuzzed function, counts it, and saves the shortest input of each distinct
escape (exception type and innermost project frame, or the broken rule) to
``benchmarks/results/fuzz-crashes/<target>-<key>.bin`` with its traceback in
a ``.txt`` beside it; libFuzzer never sees a Python exception, so coverage
guidance goes on past it. What libFuzzer does see (a native crash in Arrow, a
hang past ``-timeout``, memory past ``-rss_limit_mb``) ends the process with
its artifact in the same folder; the driver counts it as an escape and
restarts the target for the runs that are left (libFuzzer's ``-fork`` mode is
not used: its executions and coverage are not reported per target). Decoders
with a catch-all that turns any exception into a generic reason get those
hits counted apart (``fallbacks``): within the contract, but a bug hidden.

Each target runs in its own process (``atheris.Fuzz`` exits when done),
seeded with valid messages from the synthetic generator
(``pipelines.sources.synthetic``) and hand-written events, plus the target's inputs
under ``tests/fuzz_corpus/``, with a dictionary of the contract's field names
and vocabulary for the JSON targets. Coverage is
libFuzzer's final ``cov:`` (edges) and ``ft:`` (features) over the
instrumented project packages (``atheris.instrument_imports``).

Usage::

    python -m benchmarks.fuzz_decoders --target all --runs 1000000 \\
        --report benchmarks/results/fuzz.json [--jobs 2] [--max-seconds 600]

``tests/test_fuzz_regressions.py`` replays the inputs kept under
``tests/fuzz_corpus/<target>/`` through the same checks.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import datetime as dt
import functools
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# No decoder is imported at the top (these two import the standard library
# only): the worker imports the decoders inside atheris.instrument_imports(),
# and a module imported before is not instrumented.
from benchmarks.generated import GeneratedTables, generated_tables
from features.cli import CommandError, CommandParser, run_command

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
CRASH_DIR = RESULTS_DIR / "fuzz-crashes"
REGRESSION_CORPUS = REPO_ROOT / "tests" / "fuzz_corpus"
"""Inputs that once escaped, per target: replayed by the tests, and seeds."""
PROJECT_PACKAGES = ("features", "pipelines", "trainer")

FUZZ_NOW_MS = 1_790_985_600_000
"""The validators' clock in every target (the seeds' generator config's)."""

Check = Callable[[bytes], None]


class ContractBreakError(Exception):
    """A result that breaks a decoder's contract (no exception was raised)."""


class FallbackReasonError(Exception):
    """A reason from a decoder's catch-all: an exception it swallowed."""


@contextlib.contextmanager
def consumer(rule: str) -> Iterator[None]:
    """Turn an exception of a consumer of an accepted result into a break of
    ``rule``: the decoder accepted what its own consumers cannot use."""
    try:
        yield
    except ContractBreakError:
        raise
    except Exception as error:
        raise ContractBreakError(f"{rule}: {type(error).__name__}") from error


def _refuse_constant(name: str) -> Any:
    raise ContractBreakError(f"not strict JSON: {name}")


def strict_json(text: str | bytes, what: str) -> Any:
    """``text`` parsed as RFC 8259 JSON (no NaN or Infinity), UTF-8 encodable."""
    if isinstance(text, str):
        with consumer(f"{what} is not UTF-8 encodable"):
            text.encode("utf-8")
    with consumer(f"{what} is not valid JSON"):
        return json.loads(text, parse_constant=_refuse_constant)


def check_reason(reason: Any, what: str) -> None:
    """A rejection's reason: non-empty text that a dead letter can carry."""
    if not isinstance(reason, str) or not reason:
        raise ContractBreakError(f"{what}: rejected without a reason ({reason!r})")
    with consumer(f"{what}: reason is not UTF-8 encodable"):
        reason.encode("utf-8")


class ByteSource:
    """Structured values read from fuzz bytes; zeros once they run out, so a
    short input means "the first option" everywhere (a valid default)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def take(self, count: int) -> bytes:
        """The next ``count`` bytes, zero-padded past the end."""
        chunk = self._data[self._at : self._at + count]
        self._at += count
        return chunk + bytes(count - len(chunk))

    def int(self, low: int, high: int) -> int:
        """An integer in ``[low, high]``."""
        span = high - low
        raw = int.from_bytes(self.take((span.bit_length() + 7) // 8), "little")
        return low + raw % (span + 1)

    def pick(self, options: tuple[Any, ...] | list[Any]) -> Any:
        """One of ``options``."""
        return options[self.int(0, len(options) - 1)]

    def text(self, max_chars: int, *, escaped_bytes: bool = False) -> str:
        """A string: mostly ASCII, any code point otherwise; with
        ``escaped_bytes``, also the lone surrogates U+DC80..U+DCFF that
        ``surrogateescape`` makes of undecodable bytes (file names)."""
        chars = []
        for _ in range(self.int(0, max_chars)):
            first = self.int(0, 255)
            if first < 128:
                chars.append(chr(first))
                continue
            code = self.int(0, 0x10FFFF)
            if 0xD800 <= code <= 0xDFFF:
                code = 0xDC80 + code % 0x80 if escaped_bytes else code - 0x800
            chars.append(chr(code))
        return "".join(chars)

    def blob(self, max_bytes: int) -> bytes:
        """A byte string of up to ``max_bytes``."""
        return self.take(self.int(0, max_bytes))


# ---- events -------------------------------------------------------------------


def sample_events(now_ms: int = FUZZ_NOW_MS) -> list[dict[str, Any]]:
    """An impression, a click on it and an organic event, valid at ``now_ms``."""
    impression = {
        "schema_version": 1,
        "event_id": "e-1",
        "event_time": now_ms - 60_000,
        "user_id": 42,
        "domain": "instagram",
        "surface": "reels",
        "action": "impression",
        "ad_id": 7,
        "advertiser_id": 3,
        "campaign_id": 11,
        "ad_format": "video",
        "objective": "conversions",
        "impression_id": None,
        "content_id": None,
    }
    click = {**impression, "event_id": "e-2", "action": "click", "impression_id": "e-1"}
    like = {
        **impression,
        "event_id": "e-3",
        "action": "like",
        "surface": "feed",
        **dict.fromkeys(
            ("ad_id", "advertiser_id", "campaign_id", "ad_format", "objective")
        ),
        "content_id": 99,
    }
    return [impression, click, like]


def _generated_world() -> GeneratedTables:
    from pipelines.sources.synthetic import GeneratorConfig

    return generated_tables(GeneratorConfig(users=12, ads=4, days=1, seed=5))


def event_seeds() -> list[bytes]:
    """Wire messages: hand-written events and some of the generator's."""
    from features.events import encode_event, encode_event_table

    seeds = [encode_event(event) for event in sample_events()]
    iso = dt.datetime.fromtimestamp((FUZZ_NOW_MS - 5000) / 1000, dt.UTC).isoformat()
    seeds.append(encode_event({**sample_events()[0], "event_time": iso}))
    seeds.append(json.dumps(sample_events()[2], indent=1).encode())
    events = _generated_world().events
    seeds += encode_event_table(events.slice(0, 24))
    seeds += [b"", b"{}", b"[]", b'{"event_id": "\\ud800"}', b"null"]
    return seeds


def json_dictionary() -> list[bytes]:
    """libFuzzer dictionary tokens: the contract's names and vocabulary, and
    the values JSON readers trip on (big numbers, surrogates, NaN)."""
    from features import vocab
    from features.dimensions import AD_FIELDS, CONTENT_FIELDS, USER_FIELDS
    from features.events import EVENT_FIELDS

    words: set[str] = set()
    for fields in (EVENT_FIELDS, USER_FIELDS, AD_FIELDS, CONTENT_FIELDS):
        for spec in fields:
            words.add(spec.name)
            words.update(spec.allowed or ())
    for values in (vocab.DOMAINS, vocab.SURFACES, vocab.ACTIONS):
        words.update(values)
    tokens = [f'"{w}"'.encode() for w in sorted(words)]
    tokens += [
        b"null",
        b"true",
        b"false",
        b"NaN",
        b"-Infinity",
        b"1e400",
        b"9223372036854775807",
        b"9223372036854775808",
        b"-9223372036854775809",
        b"32768",
        b"1" * 40,
        b'"\\ud800"',
        b'"\\udfff"',
        b'"\\u0000"',
        b"\xed\xa0\x80",  # a surrogate as CESU-8 bytes
        b"\xc0\x80",  # an overlong NUL
        b'"2026-09-21T10:00:00+00:00"',
        b'"2026-09-21T10:00:00"',
        b"[[[[[[[[",
        b'{"a":{"a":{"a":',
    ]
    return tokens


def _check_accepted_event(event: dict[str, Any]) -> None:
    """An accepted event must be usable by everything downstream of decode."""
    from features.event_table import validate_event_table
    from features.events import (
        EVENT_COLUMNS,
        decode_event,
        encode_event,
        encode_event_table,
        events_from_records,
        validate_event,
    )

    with consumer("validate_event raises on an accepted event"):
        reason = validate_event(event, now=FUZZ_NOW_MS)
    if reason is not None:
        raise ContractBreakError("accepted event fails validate_event")
    with consumer("accepted event does not convert to Arrow (events_from_records)"):
        table = events_from_records([event])
    with consumer("validate_event_table raises on an accepted event"):
        _, rejected = validate_event_table(table, now=FUZZ_NOW_MS)
    if rejected.num_rows:
        raise ContractBreakError("validate_event_table rejects an accepted event")
    with consumer("accepted event does not encode (encode_event)"):
        wire = encode_event(event)
    if decode_event(wire, now=FUZZ_NOW_MS).event != event:
        raise ContractBreakError(
            "accepted event does not round-trip through encode_event"
        )
    with consumer("accepted event does not encode from its table"):
        (line,) = encode_event_table(table)
    # A table has every column: absent nullable keys come back as nulls.
    full = {name: event.get(name) for name in EVENT_COLUMNS}
    if decode_event(line, now=FUZZ_NOW_MS).event != full:
        raise ContractBreakError("accepted event's table wire form decodes differently")


def check_decoded_event(decoded: Any, what: str = "decode_event") -> None:
    """Event xor reason; a reason is text; an accepted event is usable."""
    if (decoded.event is None) == (decoded.reason is None):
        raise ContractBreakError(f"{what}: not exactly one of event and reason")
    if decoded.event is None:
        check_reason(decoded.reason, what)
        if decoded.reason.startswith("undecodable event ("):
            raise FallbackReasonError(decoded.reason)
        return
    _check_accepted_event(decoded.event)


def make_decode_event(seeds: list[bytes]) -> Check:
    """Target ``decode_event``."""
    from features.events import decode_event

    def check(data: bytes) -> None:
        check_decoded_event(decode_event(data, now=FUZZ_NOW_MS))

    return check


def read_one_partition(
    reader: Any, topic: str, messages: list[Any], first_offset: int
) -> tuple[list[str], int, bool]:
    """The streaming job's reader (a ``ReadTopicFn``) on one poll of
    partition 0 of ``topic``, ``messages`` from ``first_offset`` on: its
    dead-letter lines, how many valid events, and whether it claimed them all."""
    from pipelines.streaming.kafka_source import DEAD_LETTERS, EVENTS
    from pipelines.streaming.topic_positions import (
        PartitionWatermarks,
        TopicPositions,
        TopicPositionsTracker,
    )

    tracker = TopicPositionsTracker(TopicPositions(((0, first_offset),)))
    outputs, claimed_all = reader._read_partition(
        topic, 0, messages, tracker, PartitionWatermarks((((0, None),), None))
    )
    letters: list[str] = []
    valid = 0
    for output in outputs:
        # Timestamped (a .value) or a bare (tag, value) pair.
        tag, value = getattr(output, "value", output)
        if tag == DEAD_LETTERS:
            letters.append(value)
        elif tag == EVENTS:
            valid += value.events.num_rows
    return letters, valid, claimed_all


def make_stream_event(seeds: list[bytes]) -> Check:
    """Target ``stream_event``: one poll of one partition, a message per line."""
    from pipelines.streaming.kafka_source import ReadTopicFn

    reader = ReadTopicFn(
        None,
        "fuzz",
        out_of_orderness_ms=60_000,
        allowed_lateness_ms=600_000,
        idle_seconds=None,
        now_ms=FUZZ_NOW_MS,
    )

    def check(data: bytes) -> None:
        messages = [
            SimpleNamespace(value=value, offset=7 + i, timestamp=FUZZ_NOW_MS)
            for i, value in enumerate(data.split(b"\n"))
        ]
        letters, valid, _ = read_one_partition(reader, "events", messages, 7)
        originals = {m.offset: m.value for m in messages}
        for letter in letters:
            check_evidence(letter, "events", originals)
        if len(letters) + valid != len(messages):
            raise ContractBreakError("streaming reader: events + dead letters != read")

    return check


def jsonl_batch(data: bytes, path: str = "fuzz/events.jsonl") -> Any:
    """``data`` as the batch job reads a JSONL file: its non-blank lines with
    their line numbers (``pipelines.core.event_files.jsonl_payloads``), or None."""
    import io

    from pipelines.batch.validate import RawEvents
    from pipelines.core.event_files import jsonl_payloads

    numbered = list(jsonl_payloads(io.BytesIO(data)))
    if not numbered:
        return None
    numbers, lines = zip(*numbered, strict=True)
    return RawEvents(path, numbers[0], payloads=lines, offsets=numbers)


def check_evidence(line: str, source: str, originals: dict[int, bytes]) -> None:
    """A dead-letter line keeps the evidence: valid JSON, a DeadLetter naming
    ``source`` and the offset of one of ``originals`` (offset -> the bytes
    read there), whose length, hash and first bytes it carries."""
    from features.deadletter import DeadLetter

    strict_json(line, "dead-letter line")
    with consumer("a dead-letter line is not a DeadLetter"):
        letter = DeadLetter.from_json(line)
    if letter.source != source or letter.offset not in originals:
        raise ContractBreakError("a dead letter names another source or offset")
    original = originals[letter.offset]
    if (
        letter.payload_length != len(original)
        or letter.payload_sha256 != hashlib.sha256(original).hexdigest()
        or not original.startswith(letter.payload)
        or letter.truncated == (letter.payload == original)
    ):
        raise ContractBreakError("a dead letter does not keep the original bytes")


def _check_validated_batch(batch: Any, result: Any) -> None:
    """ValidateEventsFn's result: counts balance, valid rows in the schema,
    every dead letter the evidence of one line or row of the batch."""
    from features.events import EVENT_SCHEMA

    rows = batch.table.num_rows if batch.payloads is None else len(batch.payloads)
    valid, lines, counted = result
    kept = 0 if valid is None else valid.num_rows
    if counted != rows or kept + len(lines) != rows:
        raise ContractBreakError("ValidateEventsFn: valid + dead-lettered != read")
    if valid is not None and not valid.schema.equals(EVENT_SCHEMA):
        raise ContractBreakError("ValidateEventsFn: valid rows not in EVENT_SCHEMA")
    if batch.payloads is None:
        # A row's evidence is its wire form: only where it came from is known.
        offsets = {batch.offset_of(i) for i in range(rows)}
        for line in lines:
            letter = strict_json(line, "dead-letter line")
            if letter.get("offset") not in offsets:
                raise ContractBreakError("a dead letter names no row of its batch")
        return
    originals = {batch.offset_of(i): p for i, p in enumerate(batch.payloads)}
    for line in lines:
        check_evidence(line, batch.source, originals)


def make_jsonl_batch(seeds: list[bytes]) -> Check:
    """Target ``jsonl_batch``."""
    from pipelines.batch.validate import ValidateEventsFn

    validator = ValidateEventsFn(FUZZ_NOW_MS)

    def check(data: bytes) -> None:
        batch = jsonl_batch(data)
        if batch is not None:
            _check_validated_batch(batch, validator.compute(batch))

    return check


def jsonl_seeds() -> list[bytes]:
    """Files of several lines, valid and not."""
    events = event_seeds()
    return [
        b"\n".join(events[:6]),
        b"\n".join([events[0], b"{not json", events[1], b"", events[2]]),
        b"\r\n".join(events[6:12]),
    ]


_INT64 = (-(2**63), 2**63 - 1)


def event_row(source: ByteSource, event_id: str) -> dict[str, Any]:
    """One row that fits EVENT_SCHEMA: a valid event with some fields changed."""
    from features import vocab
    from features.events import EVENT_FIELDS, MAX_CLOCK_SKEW_MS, MIN_EVENT_TIME_MS

    row = dict(source.pick(sample_events()))
    row["event_id"] = event_id
    words = (*vocab.DOMAINS, *vocab.SURFACES, *vocab.ACTIONS, *vocab.AD_FORMATS)
    for spec in EVENT_FIELDS:
        how = source.int(0, 7)
        if how < 4:
            continue  # most fields keep their valid value
        if how == 4:
            row[spec.name] = None
            continue
        kind = spec.kind.value
        if kind == "string":
            choices = ("", "x" * 300, *(spec.allowed or ()), *words)
            row[spec.name] = source.pick(choices) if how < 7 else source.text(12) or "?"
        elif kind == "timestamp":
            edges = (
                FUZZ_NOW_MS + MAX_CLOCK_SKEW_MS,
                FUZZ_NOW_MS + MAX_CLOCK_SKEW_MS + 1,
                MIN_EVENT_TIME_MS,
                MIN_EVENT_TIME_MS - 1,
                0,
                *_INT64,
                253_402_300_800_000,  # year 10000
            )
            row[spec.name] = source.pick(edges) if how < 7 else source.int(*_INT64)
        elif spec.arrow_type.bit_width == 16:
            edges16 = (0, 1, 2, -1, -(2**15), 2**15 - 1)
            row[spec.name] = (
                source.pick(edges16) if how < 7 else source.int(-(2**15), 2**15 - 1)
            )
        else:
            edges64 = (0, -1, 1, *_INT64)
            row[spec.name] = source.pick(edges64) if how < 7 else source.int(*_INT64)
    return row


def _invalid_utf8_copy(table: Any, column: str, row: int, raw: bytes) -> Any:
    """``table`` with one string cell replaced by raw bytes (not checked as
    UTF-8, as a Parquet reader would leave them)."""
    import pyarrow as pa

    values = table.column(column).combine_chunks().cast(pa.binary()).to_pylist()
    values[row] = raw
    patched = pa.array(values, pa.binary()).view(pa.string())
    index = table.schema.get_field_index(column)
    return table.set_column(index, table.schema.field(index), patched)


def make_event_table(seeds: list[bytes]) -> Check:
    """Target ``event_table``."""
    import pyarrow as pa

    from features.event_table import validate_event_table
    from features.events import EVENT_SCHEMA, validate_event
    from pipelines.batch.validate import RawEvents, ValidateEventsFn

    validator = ValidateEventsFn(FUZZ_NOW_MS)
    strings = [f.name for f in EVENT_SCHEMA if pa.types.is_string(f.type)]

    def check(data: bytes) -> None:
        source = ByteSource(data)
        rows = [event_row(source, f"e-{i}") for i in range(source.int(1, 4))]
        try:
            table = pa.Table.from_pylist(rows, schema=EVENT_SCHEMA)
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            return  # not a row of the schema: outside this target
        raw_cell = source.int(0, 3) == 3
        if raw_cell:
            column, row = source.pick(strings), source.int(0, len(rows) - 1)
            table = _invalid_utf8_copy(table, column, row, source.blob(8))
        valid, rejected = validate_event_table(table, now=FUZZ_NOW_MS)
        if valid.num_rows + rejected.num_rows != table.num_rows:
            raise ContractBreakError("validate_event_table: valid + rejected != rows")
        reasons = rejected.column("reason").to_pylist()
        for reason in reasons:
            check_reason(reason, "validate_event_table")
        # The batch job's Parquet path validates the table again and writes
        # dead letters: a quarter of the inputs, as it costs twice the rest,
        # and only those with a rejected row (all valid, it runs only what
        # the first validation did, and parquet_file covers that branch).
        # 3, not 0: a short input, zero-padded, would always take it.
        if rejected.num_rows and source.int(0, 3) == 3:
            batch = RawEvents("fuzz/events.parquet", 1, table=table)
            _check_validated_batch(batch, validator.compute(batch))
        if raw_cell:
            return  # no mapping holds those bytes: nothing to compare with
        expected = [validate_event(r, now=FUZZ_NOW_MS) for r in rows]
        if reasons != [r for r in expected if r is not None]:
            raise ContractBreakError("validate_event and validate_event_table disagree")
        keep = pa.array([r is None for r in expected])
        if not valid.equals(table.filter(keep)):
            raise ContractBreakError("validate_event_table keeps other rows")

    return check


@functools.cache
def _foreign_types() -> dict[str, tuple[Any, ...]]:
    """Per column kind, the contract's type and the foreign ones a producer
    may write (built once, not for each column of each input)."""
    import pyarrow as pa

    return {
        "int": ("contract", pa.uint64(), pa.int32(), pa.float64(), pa.string()),
        "string": (
            "contract",
            pa.large_string(),
            pa.binary(),
            pa.dictionary(pa.int32(), pa.string()),
            pa.int64(),
        ),
        "timestamp": (
            "contract",
            pa.timestamp("ms"),
            pa.timestamp("ns", tz="UTC"),
            pa.timestamp("s", tz="+05:00"),
            pa.int64(),
            pa.string(),
        ),
    }


def _foreign_column(source: ByteSource, base: list[Any], kind: str) -> Any:
    """One column of an events file as a foreign producer may have typed it;
    ``base`` holds the valid values, kept for the first type of each kind."""
    import pyarrow as pa

    from features import vocab

    types = _foreign_types()[kind]
    chosen = source.pick(types) if source.int(0, 1) else "contract"
    foreign = None if chosen == "contract" else chosen
    textual = foreign is not None and (
        pa.types.is_string(foreign) or pa.types.is_large_string(foreign)
    )
    values = []
    for value in base:
        how = source.int(0, 7)
        if how < 5:
            values.append(value)
        elif how == 5:
            values.append(None)
        elif kind == "string" or textual:
            values.append(source.pick(("", "é" * 300, *vocab.SURFACES, source.text(8))))
        elif foreign is not None and pa.types.is_floating(foreign):
            values.append(source.pick((float("nan"), float("inf"), 0.5, 2.0**63)))
        elif foreign is not None and pa.types.is_unsigned_integer(foreign):
            values.append(source.int(0, 2**64 - 1))
        else:
            values.append(source.int(*_INT64))
    if foreign is None:
        return values
    if kind == "string" and pa.types.is_binary(foreign):
        values = [v.encode("utf-8") + source.blob(2) if v else v for v in values]
    elif textual:
        values = [None if v is None else str(v) for v in values]
    elif pa.types.is_floating(foreign):
        values = [None if v is None else float(v) for v in values]
    return pa.array(values, foreign)


def foreign_event_table(source: ByteSource) -> Any:
    """A table with every event column, each in the contract's type or in a
    foreign one (uint64 ids, float ids, naive or nanosecond times, ...);
    None when the drawn values do not fit the drawn types."""
    import pyarrow as pa

    from features.events import EVENT_FIELDS, EVENT_SCHEMA

    rows = [event_row(source, f"e-{i}") for i in range(source.int(1, 3))]
    columns = {}
    try:
        for spec in EVENT_FIELDS:
            kind = "int" if spec.kind.value == "int" else spec.kind.value
            base = [row[spec.name] for row in rows]
            column = _foreign_column(source, base, kind)
            if isinstance(column, list):
                column = pa.array(column, EVENT_SCHEMA.field(spec.name).type)
            columns[spec.name] = column
        return pa.table(columns)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return None


_SCRATCH_DIRS: list[Path] = []
"""Folders the targets write per-input files to; removed when the process
ends, by Python's exit or by libFuzzer's (``run_worker``)."""


def _scratch_dir(prefix: str) -> Path:
    """A new folder on tmpfs (RAM) where there is one, removed at exit."""
    shm = Path("/dev/shm")
    where = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
    _SCRATCH_DIRS.append(folder)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _remove_scratch_dirs() -> None:
    for folder in _SCRATCH_DIRS:
        shutil.rmtree(folder, ignore_errors=True)


def make_parquet_file(seeds: list[bytes]) -> Check:
    """Target ``parquet_file``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.batch.inputs import ReadEventFileFn
    from pipelines.batch.validate import ValidateEventsFn
    from pipelines.core.event_files import InputFileError

    reader, validator = ReadEventFileFn(), ValidateEventsFn(FUZZ_NOW_MS)
    # The file is built in memory and lands on tmpfs in one write: the reader
    # still opens a real file, without a disk file system's cost per input.
    path = _scratch_dir("fuzz-parquet-") / "events.parquet"

    def check(data: bytes) -> None:
        table = foreign_event_table(ByteSource(data))
        if table is None:
            return
        sink = pa.BufferOutputStream()
        try:
            pq.write_table(table, sink)
        except pa.ArrowException:
            return  # Parquet cannot hold it (seconds overflowing as ms): no file
        path.write_bytes(sink.getvalue())
        try:
            batches = list(reader.process(str(path)))
        except InputFileError as error:
            check_reason(str(error), "ReadEventFileFn")  # a whole file refused
            return
        read = 0
        for batch in batches:
            _check_validated_batch(batch, validator.compute(batch))
            read += len(batch.payloads) if batch.table is None else batch.table.num_rows
        if read != table.num_rows:
            raise ContractBreakError("ReadEventFileFn: rows lost or made up")

    return check


# ---- example messages ---------------------------------------------------------


def example_message_seeds() -> list[bytes]:
    """Valid messages of 1 to 3 generated examples, and the empty message."""
    from features.example_messages import encode_example_message
    from features.examples import TIMELINE_SEGMENT_SCHEMA, training_example_schema
    from features.windows import timeline_segments

    reference = _generated_world().reference()
    seeds = []
    for start, count, window in ((0, 1, 4), (3, 2, 8), (7, 3, 16)):
        chunk = reference.examples.slice(start, count)
        segments = timeline_segments(chunk, reference.timelines, window)
        seeds.append(encode_example_message(chunk, segments, max_seq_len=window))
    seeds.append(
        encode_example_message(
            training_example_schema().empty_table(),
            TIMELINE_SEGMENT_SCHEMA.empty_table(),
            max_seq_len=1,
        )
    )
    return seeds


def reframe_example_message(data: bytes) -> bytes:
    """``data`` framed again with ``frame_streams``: the examples stream's
    length read from the header (clamped), magic, version and CRC-32 made
    valid, so that mutations are judged by the Arrow decoding."""
    from features.example_messages import frame_streams

    if len(data) < 18:
        return data
    body = data[18:]
    (length,) = struct.unpack_from("<Q", data, 6)
    length = min(length, len(body))
    return bytes(frame_streams(body[:length], body[length:]))


def _small_burst(a: bytes, b: bytes) -> bool:
    """``a`` and ``b`` differ, only within 4 adjacent bytes (a CRC-32 catches
    every such burst)."""
    if len(a) != len(b) or a == b:
        return False
    diffs = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    return diffs[-1] - diffs[0] < 4


def check_decoded_message(decoded: Any) -> None:
    """Tables in the contract schemas xor a reason."""
    from features.examples import TIMELINE_SEGMENT_SCHEMA, training_example_schema

    if decoded.reason is not None:
        check_reason(decoded.reason, "decode_example_message")
        if decoded.examples is not None or decoded.segments is not None:
            raise ContractBreakError("decode_example_message: tables and a reason")
        return
    if decoded.examples is None or decoded.segments is None:
        raise ContractBreakError("decode_example_message: no reason and no tables")
    if not decoded.examples.schema.equals(
        training_example_schema(), check_metadata=False
    ) or not decoded.segments.schema.equals(
        TIMELINE_SEGMENT_SCHEMA, check_metadata=False
    ):
        raise ContractBreakError("decode_example_message: tables outside the contract")
    if not isinstance(decoded.max_seq_len, int) or decoded.max_seq_len < 1:
        raise ContractBreakError("decode_example_message: no window length")


def make_example_message(seeds: list[bytes]) -> Check:
    """Target ``example_message``."""
    from features.example_messages import decode_example_message, message_headers

    headers = message_headers()

    def check(data: bytes) -> None:
        decoded = decode_example_message(data, headers)
        check_decoded_message(decoded)
        if decoded.ok and any(_small_burst(data, seed) for seed in seeds):
            raise ContractBreakError("a corrupted copy of a valid message is accepted")

    return check


def make_example_message_body(seeds: list[bytes]) -> Check:
    """Target ``example_message_body``."""
    from features.example_messages import decode_example_message, message_headers

    headers = message_headers()

    def check(data: bytes) -> None:
        framed = reframe_example_message(data)
        check_decoded_message(decode_example_message(framed, headers))

    return check


def make_trainer_example_record(seeds: list[bytes]) -> Check:
    """Target ``trainer_example_record``."""
    from features.example_messages import message_headers
    from trainer.data.kafka_source import KafkaSource

    # _decode appends each dead letter to a .jsonl path, emptied per input.
    sink = Path(tempfile.mkdtemp(prefix="fuzz-dead-letters-")) / "dead.jsonl"
    source = KafkaSource(
        None, "examples", "fuzz", max_seq_len=16, dead_letter=str(sink)
    )
    headers = message_headers()

    def check(data: bytes) -> None:
        value = reframe_example_message(data)
        sink.write_bytes(b"")
        item = source._decode(
            0, SimpleNamespace(value=value, headers=headers, offset=5)
        )
        letters = sink.read_text().splitlines()
        if item.batch is not None:
            if item.batch.size == 0:
                raise ContractBreakError(
                    "KafkaSource._decode: an empty batch to train on"
                )
            if letters:
                raise ContractBreakError("KafkaSource: trains on a dead letter")
            return
        if len(letters) != 1:
            raise ContractBreakError(
                "KafkaSource._decode: poison without one dead letter"
            )
        check_evidence(letters[0], "examples", {5: value})

    return check


# ---- teacher outputs ----------------------------------------------------------


def teacher_seeds() -> list[bytes]:
    """Valid teacher-output messages of 0 to 3 rows."""
    import numpy as np
    import pyarrow as pa

    from trainer.distill.records import (
        NUM_LOGITS,
        encode_teacher_message,
        teacher_output_schema,
        teacher_output_table,
    )

    seeds = [encode_teacher_message(teacher_output_schema(4).empty_table())]
    for rows, dim in ((1, 2), (3, 4)):
        table = teacher_output_table(
            pa.array([f"ex-{i}" for i in range(rows)]),
            np.arange(rows, dtype=np.int64) + FUZZ_NOW_MS,
            np.linspace(-2, 2, rows * NUM_LOGITS, dtype=np.float32),
            np.ones((rows, dim), np.float32),
            step=17,
            teacher_time_ms=FUZZ_NOW_MS,
        )
        seeds.append(encode_teacher_message(table))
    return seeds


_TEACHER_FRAME = struct.Struct("<4sHI")


def teacher_body_seeds() -> list[bytes]:
    """The IPC streams inside the teacher seeds."""
    return [seed[_TEACHER_FRAME.size :] for seed in teacher_seeds()]


def frame_teacher_stream(body: bytes) -> bytes:
    """The documented teacher frame around an IPC stream:
    ``b"GEMT" + version (uint16 LE) + CRC-32 (uint32 LE) + stream``."""
    from trainer.distill.records import MAGIC, MESSAGE_VERSION

    return _TEACHER_FRAME.pack(MAGIC, MESSAGE_VERSION, zlib.crc32(body)) + body


TEACHER_WIDTH = 4
"""The embedding width of the student daemon's teacher in the targets."""


def _teacher_check(frame: Callable[[bytes], bytes]) -> Check:
    from trainer.distill.records import (
        AlignedTeacher,
        decode_teacher_message,
        teacher_message_headers,
    )
    from trainer.distill.teacher_cache import TeacherCache, teacher_decoder

    headers = teacher_message_headers()
    daemon_decoder = teacher_decoder(TEACHER_WIDTH)

    def check(data: bytes) -> None:
        framed = frame(data)
        for decoder in (decode_teacher_message, daemon_decoder):
            table, reason = decoder(framed, headers)
            if (table is None) == (reason is None):
                raise ContractBreakError(
                    "teacher decoder: not exactly one of rows and reason"
                )
            if table is None:
                check_reason(reason, "teacher decoder")
        if table is None:
            return
        # What the student daemon does with the rows it accepts.
        with consumer("accepted teacher rows break TeacherCache"):
            cache = TeacherCache(TEACHER_WIDTH, 64)
            cache.add(table)
            ids = table.column("example_id").to_pylist()
            cache.aligned([*ids, "absent"])
        with consumer("accepted teacher rows break AlignedTeacher"):
            AlignedTeacher(table.column("example_id"), table)

    return check


def make_teacher_message(seeds: list[bytes]) -> Check:
    """Target ``teacher_message``."""
    return _teacher_check(lambda data: data)


def make_teacher_message_body(seeds: list[bytes]) -> Check:
    """Target ``teacher_message_body``."""
    return _teacher_check(frame_teacher_stream)


# ---- dead letters and dimension rows ------------------------------------------


def make_dead_letter(seeds: list[bytes]) -> Check:
    """Target ``dead_letter``."""
    from features.deadletter import DeadLetter

    def check(data: bytes) -> None:
        source = ByteSource(data)
        letter = DeadLetter(
            source=source.text(24, escaped_bytes=True),
            partition=source.pick((None, 0, source.int(0, 2**31 - 1))),
            offset=source.int(0, 2**63 - 1),
            reason=source.text(48, escaped_bytes=True),
            set_aside_ms=source.int(0, 2**63 - 1),
            payload=source.blob(256),
        )
        cut = source.int(-1, 300)
        for each in (letter, letter.truncated_to(cut)):
            line = each.to_json()
            if not line.isascii() or "\n" in line:
                raise ContractBreakError("DeadLetter.to_json is not one line of ASCII")
            strict_json(line, "DeadLetter.to_json")
            with consumer("DeadLetter.from_json fails on to_json's output"):
                back = DeadLetter.from_json(line)
            if back != each:
                raise ContractBreakError("DeadLetter does not round-trip through JSON")
            for name, value in each.kafka_headers():
                if not isinstance(name, str) or not isinstance(value, bytes):
                    raise ContractBreakError(
                        "DeadLetter.kafka_headers: not (str, bytes)"
                    )
        short = letter.truncated_to(cut)
        if (short.payload_length, short.payload_sha256) != (
            letter.payload_length,
            letter.payload_sha256,
        ):
            raise ContractBreakError(
                "truncated_to changes the original's length or hash"
            )
        if len(short.payload) > max(cut, 0) or short.truncated != (
            len(letter.payload) > cut
        ):
            raise ContractBreakError("truncated_to: payload or flag wrong")

    return check


def dimension_seeds() -> list[bytes]:
    """A valid row of each dimension table, as JSON."""
    world = _generated_world()
    seeds = []
    for table in (world.users, world.ads, world.contents):
        row = table.slice(0, 1).to_pylist()[0]
        seeds.append(json.dumps(row, default=lambda t: int(t.timestamp() * 1000)))
    return [seed.encode() for seed in seeds]


def make_dimension_rows(seeds: list[bytes]) -> Check:
    """Target ``dimension_rows``."""
    import pyarrow as pa

    from features.dimensions import (
        AD_SCHEMA,
        CONTENT_SCHEMA,
        USER_SCHEMA,
        validate_ad,
        validate_content,
        validate_user,
    )
    from features.fields import to_epoch_ms

    tables = (
        (validate_user, USER_SCHEMA),
        (validate_ad, AD_SCHEMA),
        (validate_content, CONTENT_SCHEMA),
    )

    def check(data: bytes) -> None:
        try:
            record = json.loads(data)
        except (ValueError, RecursionError):
            return  # not JSON: the harness's parser, not a validator, refused it
        if not isinstance(record, dict):
            return
        for validate, schema in tables:
            reason = validate(record)
            if reason is not None:
                check_reason(reason, validate.__name__)
                continue
            row = dict(record)
            for field in schema:
                if pa.types.is_timestamp(field.type) and row.get(field.name):
                    row[field.name] = to_epoch_ms(row[field.name])
            with consumer(f"a row {validate.__name__} accepts does not fit its table"):
                pa.Table.from_pylist([row], schema=schema)

    return check


# ---- the targets --------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One fuzz target: its check factory, its seeds, and libFuzzer's knobs."""

    make: Callable[[list[bytes]], Check]
    seeds: Callable[[], list[bytes]]
    max_len: int
    json_tokens: bool = False


def _no_seeds() -> list[bytes]:
    return [b"", bytes(64), bytes(range(256))]


TARGETS: dict[str, Target] = {
    "decode_event": Target(make_decode_event, event_seeds, 4096, json_tokens=True),
    "event_table": Target(make_event_table, _no_seeds, 512),
    "jsonl_batch": Target(make_jsonl_batch, jsonl_seeds, 8192, json_tokens=True),
    "parquet_file": Target(make_parquet_file, _no_seeds, 512),
    "stream_event": Target(make_stream_event, jsonl_seeds, 8192, json_tokens=True),
    "example_message": Target(make_example_message, example_message_seeds, 32768),
    "example_message_body": Target(
        make_example_message_body, example_message_seeds, 32768
    ),
    "trainer_example_record": Target(
        make_trainer_example_record, example_message_seeds, 32768
    ),
    "teacher_message": Target(make_teacher_message, teacher_seeds, 8192),
    "teacher_message_body": Target(make_teacher_message_body, teacher_body_seeds, 8192),
    "dead_letter": Target(make_dead_letter, _no_seeds, 1024),
    "dimension_rows": Target(
        make_dimension_rows, dimension_seeds, 2048, json_tokens=True
    ),
}


def load_check(name: str) -> Check:
    """The check of target ``name`` (what the regression tests replay)."""
    target = TARGETS[name]
    return target.make(target.seeds())


# ---- the worker: one target in this process -----------------------------------


def _project_frame(error: BaseException) -> str:
    """``file:line`` of the innermost frame in the project's packages."""
    where = "?"
    cause: BaseException | None = error
    while cause is not None:
        for frame in traceback.extract_tb(cause.__traceback__):
            relative = Path(frame.filename).resolve()
            if relative.is_relative_to(REPO_ROOT):
                path = relative.relative_to(REPO_ROOT)
                if path.parts[0] in PROJECT_PACKAGES:
                    where = f"{path}:{frame.lineno}"
        cause = cause.__cause__
    return where


def escape_key(error: BaseException) -> str:
    """What makes two escapes the same: the broken rule, or the exception's
    type and the innermost project frame it came through."""
    if isinstance(error, ContractBreakError | FallbackReasonError):
        return f"{type(error).__name__}: {error}"
    return f"{type(error).__name__} at {_project_frame(error)}"


class Tally:
    """Executions and escapes of one worker, written to ``stats_path``."""

    def __init__(self, target: str, stats_path: Path, crash_dir: Path) -> None:
        self.target = target
        self.stats_path = stats_path
        self.crash_dir = crash_dir
        self.executions = 0
        self.escapes = 0
        self.fallbacks = 0
        self.distinct: dict[str, dict[str, Any]] = {}
        self.started = time.monotonic()
        self.last_dump = self.started

    def record(self, data: bytes, error: BaseException) -> None:
        """Count one escape; keep the shortest input of each distinct one."""
        key = escape_key(error)
        fallback = isinstance(error, FallbackReasonError)
        if fallback:
            self.fallbacks += 1
        else:
            self.escapes += 1
        seen = self.distinct.get(key)
        if seen is not None:
            seen["count"] += 1
            if len(data) >= seen["input_bytes"]:
                return
        else:
            seen = self.distinct[key] = {"key": key, "count": 1, "fallback": fallback}
        digest = hashlib.sha1(key.encode()).hexdigest()[:10]
        stem = self.crash_dir / f"{self.target}-{digest}"
        stem.with_suffix(".bin").write_bytes(data)
        stem.with_suffix(".txt").write_text(
            key + "\n\n" + "".join(traceback.format_exception(error))[-4000:]
        )
        seen.update(input_bytes=len(data), input=str(stem.with_suffix(".bin")))
        self.dump()

    def dump(self) -> None:
        """Write the figures so far (atomically: the driver may read any time)."""
        self.last_dump = time.monotonic()
        figures = {
            "executions": self.executions,
            "seconds": round(self.last_dump - self.started, 2),
            "escapes": self.escapes,
            "fallbacks": self.fallbacks,
            "distinct": list(self.distinct.values()),
        }
        part = self.stats_path.with_suffix(".part")
        part.write_text(json.dumps(figures))
        part.replace(self.stats_path)


def _at_process_exit(callback: Callable[[], None]) -> Any:
    """Run ``callback`` when libFuzzer calls exit(): it ends the process from
    C, past Python's atexit; glibc's __cxa_atexit still runs it."""
    handler = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: callback())
    ctypes.CDLL("libc.so.6").__cxa_atexit(handler, None, None)
    return handler  # the caller keeps it alive


def run_worker(
    name: str, stats_path: Path, corpus: Path, libfuzzer_args: list[str]
) -> None:
    """Fuzz one target in this process until libFuzzer's limits; never returns."""
    import atheris

    # Decoders log each dead letter; a million lines would be the bottleneck.
    logging.disable(logging.CRITICAL)
    target = TARGETS[name]
    with atheris.instrument_imports(include=list(PROJECT_PACKAGES)):
        seeds = target.seeds()
        check = target.make(seeds)
    corpus.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        (corpus / f"seed-{hashlib.sha1(seed).hexdigest()[:12]}").write_bytes(seed)
    CRASH_DIR.mkdir(parents=True, exist_ok=True)
    tally = Tally(name, stats_path, CRASH_DIR)

    def one_input(data: bytes) -> None:
        tally.executions += 1
        try:
            check(data)
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # every escape is counted; the run goes on
            tally.record(data, error)
        if time.monotonic() - tally.last_dump > 2:
            tally.dump()

    def at_exit() -> None:
        tally.dump()
        _remove_scratch_dirs()

    keep = _at_process_exit(at_exit)
    # libFuzzer adds what it finds to the first folder; the others seed it.
    corpora = [str(corpus)]
    if (REGRESSION_CORPUS / name).is_dir():
        corpora.append(str(REGRESSION_CORPUS / name))
    atheris.Setup([sys.argv[0], *libfuzzer_args, *corpora], one_input)
    atheris.Fuzz()
    del keep


# ---- the driver: every target in its own process ------------------------------


_STATS_LINE = re.compile(r"^#(\d+)\s+(\w+)\s+cov: (\d+) ft: (\d+) corp: (\d+)/")
_ARTIFACT = re.compile(r"Test unit written to (\S+)")


def _last_coverage(log: str) -> dict[str, int]:
    figures: dict[str, int] = {}
    for line in log.splitlines():
        match = _STATS_LINE.match(line)
        if match:
            figures = {
                "libfuzzer_executions": int(match[1]),
                "cov": int(match[3]),
                "ft": int(match[4]),
                "corpus": int(match[5]),
            }
    return figures


def _write_dictionary(path: Path) -> Path:
    tokens = json_dictionary()
    lines = []
    for token in tokens:
        escaped = "".join(
            chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\x{b:02x}"
            for b in token
        )
        lines.append(f'"{escaped}"')
    path.write_text("\n".join(lines) + "\n")
    return path


def fuzz_target(
    name: str,
    runs: int,
    work: Path,
    *,
    max_seconds: int | None,
    timeout_s: int,
    seed: int | None,
    max_restarts: int = 5,
) -> dict[str, Any]:
    """Fuzz one target in subprocesses; its figures for the report."""
    target = TARGETS[name]
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus"
    for stale in CRASH_DIR.glob(f"{name}-*"):
        stale.unlink()
    CRASH_DIR.mkdir(parents=True, exist_ok=True)
    args = [
        f"-max_len={target.max_len}",
        f"-timeout={timeout_s}",
        "-rss_limit_mb=4096",
        f"-artifact_prefix={CRASH_DIR}/{name}-native-",
        "-print_final_stats=1",
    ]
    if seed is not None:
        args.append(f"-seed={seed}")
    if target.json_tokens:
        args.append(f"-dict={_write_dictionary(work / 'tokens.dict')}")
    totals: dict[str, Any] = {"executions": 0, "seconds": 0.0, "escapes": 0}
    totals.update(fallbacks=0, distinct={}, native=[], coverage={}, restarts=0)
    started = time.monotonic()
    for attempt in range(max_restarts + 1):
        left = runs - totals["executions"]
        if left <= 0:
            break
        budget = []
        if max_seconds is not None:
            remaining = int(max_seconds - (time.monotonic() - started))
            if remaining <= 0:
                break
            budget = [f"-max_total_time={remaining}"]
        stats_path = work / f"stats-{attempt}.json"
        log_path = work / f"libfuzzer-{attempt}.log"
        command = [
            sys.executable,
            "-m",
            "benchmarks.fuzz_decoders",
            "--worker",
            name,
            "--stats",
            str(stats_path),
            "--corpus",
            str(corpus),
            "--",
            f"-runs={left}",
            *args,
            *budget,
        ]
        with open(log_path, "w") as log:
            done = subprocess.run(
                command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT
            )
        text = log_path.read_text(errors="replace")
        stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
        coverage = _last_coverage(text)
        totals["executions"] += max(
            stats.get("executions", 0), coverage.get("libfuzzer_executions", 0)
        )
        totals["seconds"] += stats.get("seconds", 0.0)
        totals["escapes"] += stats.get("escapes", 0)
        totals["fallbacks"] += stats.get("fallbacks", 0)
        for item in stats.get("distinct", []):
            merged = totals["distinct"].setdefault(item["key"], {**item, "count": 0})
            merged["count"] += item["count"]
            if item.get("input_bytes", 1 << 62) < merged.get("input_bytes", 1 << 62):
                merged.update(input=item["input"], input_bytes=item["input_bytes"])
        if coverage:
            totals["coverage"] = coverage
        artifacts = _ARTIFACT.findall(text)
        if done.returncode == 0 and not artifacts:
            break
        if not artifacts:
            # The worker failed to start or died without a unit: no escape
            # to count, and restarting would fail the same way.
            totals["failure"] = text[-3000:]
            break
        # A native crash, a hang or an out-of-memory: an escape libFuzzer saw.
        kind = next(
            (k for k in ("deadly signal", "timeout", "out-of-memory") if k in text),
            f"exit {done.returncode}",
        )
        totals["escapes"] += 1
        totals["native"].append(
            {"kind": kind, "artifacts": artifacts, "log_tail": text[-3000:]}
        )
        totals["restarts"] += 1
    seconds = totals["seconds"] or 1e-9
    return {
        "target": name,
        "runs_requested": runs,
        "executions": totals["executions"],
        "seconds": round(totals["seconds"], 1),
        "executions_per_s": round(totals["executions"] / seconds),
        "coverage": totals["coverage"],
        "escapes": totals["escapes"],
        "fallbacks": totals["fallbacks"],
        "distinct_escapes": sorted(
            totals["distinct"].values(), key=lambda item: -item["count"]
        ),
        "native_escapes": totals["native"],
        "restarts": totals["restarts"],
        "complete": totals["executions"] >= runs,
        "failure": totals.get("failure"),
    }


def _machine() -> dict[str, Any]:
    from benchmarks.machine import cpu_model

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_avg_start": os.getloadavg(),
        "nice": os.nice(0),
        "python": platform.python_version(),
        "atheris": version("atheris"),
    }


def _table(results: list[dict[str, Any]]) -> str:
    rows = [
        f"{'target':24} {'executions':>11} {'exec/s':>7} {'cov':>5} {'ft':>6} "
        f"{'escapes':>7} {'distinct':>8} {'fallbk':>6}"
    ]
    for r in results:
        cov = r["coverage"]
        rows.append(
            f"{r['target']:24} {r['executions']:>11} {r['executions_per_s']:>7} "
            f"{cov.get('cov', '-'):>5} {cov.get('ft', '-'):>6} {r['escapes']:>7} "
            f"{len([d for d in r['distinct_escapes'] if not d['fallback']]):>8} "
            f"{r['fallbacks']:>6}"
        )
    return "\n".join(rows)


def build_parser() -> CommandParser:
    """The flags of ``python -m benchmarks.fuzz_decoders``."""
    parser = CommandParser("benchmarks.fuzz_decoders", __doc__.split("\n\n")[0])
    parser.add_argument("--target", default="all", help="a name, a,b,c, or all")
    parser.add_argument(
        "--runs", type=int, default=1_000_000, help="inputs to run per target"
    )
    parser.add_argument(
        "--report",
        type=Path,
        default=RESULTS_DIR / "fuzz.json",
        help="where the JSON report goes",
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="targets fuzzed at a time (a core each)"
    )
    parser.add_argument(
        "--max-seconds", type=int, help="time limit per target (default: none)"
    )
    parser.add_argument(
        "--timeout", type=int, default=20, help="seconds one input may take"
    )
    parser.add_argument("--seed", type=int, help="libFuzzer's seed (reproducible)")
    parser.add_argument("--work", type=Path, help="corpora and logs (default: tmp)")
    # The driver's own call of one target in a subprocess (fuzz_target).
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--stats", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("libfuzzer", nargs="*", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Fuzz the chosen targets, each in its own process; write the report."""
    return run_command(build_parser(), fuzz, argv)


def fuzz(args: argparse.Namespace) -> int:
    """The command: a worker's one target, or the driver's report."""
    if args.worker:
        run_worker(args.worker, args.stats, args.corpus, args.libfuzzer)
        return 0
    names = list(TARGETS) if args.target == "all" else args.target.split(",")
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        raise CommandError(
            f"--target: unknown target(s) {', '.join(unknown)}",
            f"known: {', '.join(TARGETS)}",
        )
    machine = _machine()
    work = args.work or Path(tempfile.mkdtemp(prefix="fuzz-decoders-"))
    started = dt.datetime.now(dt.UTC)
    results: dict[str, dict[str, Any]] = {}

    def one(name: str) -> None:
        results[name] = fuzz_target(
            name,
            args.runs,
            work / name,
            max_seconds=args.max_seconds,
            timeout_s=args.timeout,
            seed=args.seed,
        )
        r = results[name]
        print(
            f"{name}: {r['executions']} executions, {r['executions_per_s']}/s, "
            f"cov {r['coverage'].get('cov')}, {r['escapes']} escapes",
            flush=True,
        )

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        list(pool.map(one, names))
    ordered = [results[n] for n in names]
    report = {
        "benchmark": "fuzz_decoders",
        "started": started.isoformat(timespec="seconds"),
        "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "runs_per_target": args.runs,
        "max_seconds_per_target": args.max_seconds,
        "jobs": args.jobs,
        "machine": {**machine, "load_avg_end": os.getloadavg()},
        "escape_handling": (
            "Python exceptions and contract breaks are caught inside the target, "
            "counted and saved (shortest input per distinct escape); native "
            "crashes, hangs and OOMs end the worker and it is restarted"
        ),
        "targets": ordered,
        "total_escapes": sum(r["escapes"] for r in ordered),
    }
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    print(_table(ordered))
    print(f"report: {args.report}; crash inputs: {CRASH_DIR}; work: {work}")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
