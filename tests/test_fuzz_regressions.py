"""Inputs that escaped a decoder, kept so that none escapes again.

Each test holds one distinct escape the fuzzer (benchmarks/fuzz_decoders.py)
found, written as the smallest input that shows it: a decoder must give a
reason for it (or accept it in a form its consumers can use) without
raising. Raw inputs of the byte-level targets live under
``tests/fuzz_corpus/<target>/`` (with a hostile producer's classics: deep
nesting, huge numbers, lone surrogates, NaN) and go through the fuzzer's own
check of that target; the fuzzer starts from them too.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.fuzz_decoders import FUZZ_NOW_MS, Check, load_check
from features.event_table import validate_event_table
from features.events import EVENT_SCHEMA, events_from_records, validate_event
from pipelines.batch.inputs import ReadEventFileFn
from pipelines.batch.validate import RawEvents, ValidateEventsFn
from trainer.distill.records import (
    decode_teacher_message,
    encode_teacher_message,
    teacher_output_schema,
)
from trainer.distill.teacher_cache import TeacherCache

CORPUS = Path(__file__).parent / "fuzz_corpus"

CLICK: dict[str, Any] = {
    "schema_version": 1,
    "event_id": "e-0",
    "event_time": FUZZ_NOW_MS - 60_000,
    "user_id": 42,
    "domain": "instagram",
    "surface": "reels",
    "action": "click",
    "ad_id": 7,
    "advertiser_id": 3,
    "campaign_id": 11,
    "ad_format": "video",
    "objective": "conversions",
    "impression_id": "e-1",
    "content_id": None,
}


@functools.cache
def _check(target: str) -> Check:
    return load_check(target)


def _corpus() -> list[Any]:
    return [
        pytest.param(path.parent.name, path, id=f"{path.parent.name}/{path.stem}")
        for path in sorted(CORPUS.glob("*/*.bin"))
    ]


@pytest.mark.parametrize(("target", "path"), _corpus())
def test_stored_input_keeps_the_contract(target: str, path: Path) -> None:
    _check(target)(path.read_bytes())


@pytest.mark.parametrize(
    "event_time",
    [-(2**63), 2**63 - 1, -62_135_596_800_001, 253_402_300_800_000],
    ids=["int64-min", "int64-max", "before-year-1", "year-10000"],
)
def test_table_validator_gives_a_reason_for_times_outside_datetime(
    event_time: int,
) -> None:
    # A Parquet file's timestamps are int64 milliseconds: any of them can be
    # read, only years 1..9999 are datetimes.
    record = {**CLICK, "event_time": event_time}
    table = events_from_records([record])
    valid, rejected = validate_event_table(table, now=FUZZ_NOW_MS)
    assert valid.num_rows == 0
    assert rejected.column("reason").to_pylist() == [
        validate_event(record, now=FUZZ_NOW_MS)
    ]


@pytest.mark.parametrize(
    "event_time",
    [-(2**63), 2**63 - 1, 253_402_300_800_000],
    ids=["int64-min", "int64-max", "year-10000"],
)
def test_batch_job_dead_letters_parquet_rows_with_such_times(event_time: int) -> None:
    table = events_from_records([{**CLICK, "event_time": event_time}])
    valid, dead, read = ValidateEventsFn(FUZZ_NOW_MS).compute(
        RawEvents("events/day-1.parquet", 1, table=table)
    )
    assert read == 1
    assert len(dead) == 1
    assert valid is None or valid.num_rows == 0


def test_an_empty_teacher_message_is_usable_or_rejected() -> None:
    # The student daemon adds every accepted message to its cache.
    message = encode_teacher_message(teacher_output_schema(4).empty_table())
    table, reason = decode_teacher_message(message)
    if table is not None:
        TeacherCache(4, 64).add(table)
    else:
        assert reason


@pytest.mark.parametrize(
    "event_time", [2**62, -(2**62)], ids=["after-year-9999", "before-year-1"]
)
def test_foreign_parquet_rows_with_times_outside_datetime_are_dead_letters(
    tmp_path: Path, event_time: int
) -> None:
    # schema_version as float64 0.5: the batch does not cast to the contract
    # and is read row by row, where the time must become a reason too.
    record = {**CLICK, "event_time": event_time}
    table = pa.Table.from_pylist([record], schema=EVENT_SCHEMA).set_column(
        0, "schema_version", pa.array([0.5])
    )
    path = tmp_path / "events.parquet"
    pq.write_table(table, path)
    batches = list(ReadEventFileFn().process(str(path)))
    validator = ValidateEventsFn(FUZZ_NOW_MS)
    dead = [line for batch in batches for line in validator.compute(batch)[1]]
    assert len(dead) == 1


@pytest.mark.parametrize("separator", ["\x85", "\u2028", "\u2029"])
def test_a_line_separator_inside_an_id_keeps_one_dead_letter_per_row(
    separator: str,
) -> None:
    # The dead letters' wire JSON is split into rows at "\n" only: pandas
    # writes these separators raw inside strings.
    bad = {**CLICK, "action": "unknown-action"}
    table = events_from_records([{**bad, "event_id": f"e{separator}1"}, bad])
    _, dead, read = ValidateEventsFn(FUZZ_NOW_MS).compute(
        RawEvents("events/day-1.parquet", 1, table=table)
    )
    assert (read, len(dead)) == (2, 2)
