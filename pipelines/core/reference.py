"""The feature job in one process: the reference (oracle) implementation.

Plain pyarrow / pandas / numpy, written for clarity: every step is one rule
of :mod:`features.examples` (the spec), vectorized, no per-event Python
(:mod:`pipelines.core.reference_steps`, which also lists the choices the
spec leaves open). The Beam job (``pipelines/build.py``) must produce the
same tables; tests compare the two. Outputs and layout on disk:
:mod:`features.feature_tables`.

Usage::

    python -m pipelines.reference --input DIR --output DIR [--now-ms MS]

``--input`` is a generator or MovieLens output (``events/``,
``users.parquet``, ``ads.parquet``, ``contents.parquet``); its event files
are found and numbered as the Beam job does (:mod:`pipelines.core.event_files`),
and a JSONL line that does not decode is a dead letter with the job's reason,
as is an invalid row. The validation clock is ``--now-ms``, else the input's
``manifest.json`` ``validation_now_ms``, else the wall clock.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features.deadletter import DeadLetter
from features.event_table import event_table_reasons
from features.events import (
    EVENT_COLUMNS,
    EVENT_SCHEMA,
    decode_event,
    encode_event_table,
    events_from_records,
)
from features.feature_tables import COUNT_NAMES, LAYOUT_VERSION, table_folder
from pipelines.core.columns import to_int64
from pipelines.core.event_files import (
    PARQUET_BATCH_ROWS,
    InputFileError,
    event_files,
    jsonl_payloads,
    row_payloads,
)
from pipelines.core.ordering import distinct_sorted
from pipelines.core.output_files import PLAIN_COLUMNS, BackgroundWrites, parquet_options
from pipelines.core.reference_steps import (
    ACTION_ID,
    DAY_MS,
    ad_attribute_frame,
    distinct_events,
    examples_of,
    feature_tables_of,
    timelines_of,
    user_attribute_frame,
    window_counters,
)

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class ReferenceOutput:
    """Everything the feature job produces (see :mod:`features.feature_tables`).

    Attributes:
        examples: ``training_example_schema()``, sorted by example_id.
        timelines: ``TIMELINE_SCHEMA``, sorted by user_id.
        dead_letters: rejected rows (EVENT_SCHEMA + ``reason``), input order.
        counts: :data:`~features.feature_tables.COUNT_NAMES` -> count.
        feature_tables: name -> table in ``FEATURE_TABLES[name].schema``.
        letters: every dead letter (rejected rows and input lines that never
            became rows), by file and line, as the job writes them.
    """

    examples: pa.Table
    timelines: pa.Table
    dead_letters: pa.Table
    counts: dict[str, int]
    feature_tables: dict[str, pa.Table]
    letters: tuple[DeadLetter, ...] = ()


@dataclass(frozen=True)
class EventOrigins:
    """Where each row of an events table came from, and what never became one.

    Attributes:
        files: the event files.
        file_index: (N,) each row's file, an index into ``files``.
        offsets: (N,) each row's 1-based row (Parquet) or line (JSONL) number.
        set_aside: dead letters of input lines that did not decode.
    """

    files: tuple[str, ...]
    file_index: npt.NDArray[np.int32]
    offsets: I64
    set_aside: tuple[DeadLetter, ...] = ()

    def letter(self, row: int, reason: str, payload: bytes) -> DeadLetter:
        """The dead letter of table row ``row``."""
        return DeadLetter(
            source=self.files[int(self.file_index[row])],
            partition=None,
            offset=int(self.offsets[row]),
            reason=reason,
            payload=payload,
        )


# --- the job -----------------------------------------------------------------


def build_reference(
    events: pa.Table,
    users: pa.Table,
    ads: pa.Table,
    contents: pa.Table,
    *,
    now_ms: int | None = None,
    origins: EventOrigins | None = None,
) -> ReferenceOutput:
    """Run the whole feature job in memory.

    Args:
        events: raw events in EVENT_SCHEMA (duplicates and invalid rows allowed).
        users: USER_SCHEMA rows (versions by ``updated_at``).
        ads: AD_SCHEMA rows (versions by ``updated_at``).
        contents: CONTENT_SCHEMA rows.
        now_ms: validation clock (epoch ms); the wall clock when None.
        origins: where the rows came from (:func:`read_event_input`); None:
            one source, ``events``, numbered by row from 1.

    Returns:
        Examples, timelines, dead letters, counts and feature tables.
    """
    if origins is None:
        origins = EventOrigins(
            ("events",),
            np.zeros(events.num_rows, np.int32),
            np.arange(1, events.num_rows + 1, dtype=np.int64),
        )
    valid, dead_letters, letters = _validate(events, origins, now_ms)
    distinct = distinct_events(valid)
    user_attributes = user_attribute_frame(users)
    ad_attributes = ad_attribute_frame(ads)
    timelines, _ = timelines_of(distinct, ad_attributes, contents)
    counters = window_counters(distinct)
    examples = examples_of(distinct, user_attributes, ad_attributes, counters)
    counts = {
        "events_read": events.num_rows + len(origins.set_aside),
        "events_valid": valid.num_rows,
        "events_dead_lettered": len(letters),
        "duplicates_removed": valid.num_rows - distinct.table.num_rows,
        "events_distinct": distinct.table.num_rows,
        "timeline_events": int(
            pc.sum(pc.list_value_length(timelines.column("event_time"))).as_py() or 0
        ),
        "timelines": timelines.num_rows,
        "impressions": int(np.sum(distinct.action == ACTION_ID["impression"])),
        "examples": examples.num_rows,
    }
    assert tuple(counts) == COUNT_NAMES
    return ReferenceOutput(
        examples=examples,
        timelines=timelines,
        dead_letters=dead_letters,
        counts=counts,
        feature_tables=feature_tables_of(
            distinct, timelines, user_attributes, ad_attributes, counters
        ),
        letters=letters,
    )


def _validate(
    events: pa.Table, origins: EventOrigins, now_ms: int | None
) -> tuple[pa.Table, pa.Table, tuple[DeadLetter, ...]]:
    """Valid rows, rejected rows (with ``reason``) and every dead letter,
    by file and line; a rejected row's payload is its wire JSON, as the
    job's."""
    reasons = event_table_reasons(events, now=now_ms)
    bad = pd.notna(reasons)
    rows = np.flatnonzero(bad)
    rejected = events.take(pa.array(rows, pa.int64()))
    wire = encode_event_table(rejected)
    letters = [
        origins.letter(int(row), reasons[row], payload)
        for row, payload in zip(rows, wire, strict=True)
    ]
    letters += origins.set_aside
    order = {path: i for i, path in enumerate(origins.files)}
    letters.sort(key=lambda letter: (order.get(letter.source, -1), letter.offset))
    valid = events if not rows.size else events.filter(pa.array(~bad))
    rejected = rejected.append_column(
        "reason", pa.array(reasons[bad].tolist(), pa.string())
    )
    return valid, rejected, tuple(letters)


# --- files -------------------------------------------------------------------

OUTPUT_PARTS: Final = (
    "examples",
    "timelines",
    "feature_tables",
    "dead_letters",
    "summary.json",
)


def _dead_letter_lines(letters: Sequence[DeadLetter]) -> str:
    """JSONL of dead letters (:meth:`DeadLetter.to_json`), as the job writes."""
    return "".join(letter.to_json() + "\n" for letter in letters)


def write_output(output: ReferenceOutput, out: Path, *, now_ms: int) -> None:
    """Write the reference's outputs in the layout of
    :data:`features.feature_tables.OUTPUT_LAYOUT` (one part-0 per folder).

    Parquet files with the Beam job's settings (:func:`parquet_options`), on
    a writer thread (as the Beam job's writers do) while the next is prepared.
    """
    writes = BackgroundWrites()
    try:
        _write_files(output, out, writes)
        writes.wait()
    finally:
        writes.close()
    (out / "dead_letters").mkdir(parents=True, exist_ok=True)
    (out / "dead_letters" / "part-0.jsonl").write_text(
        _dead_letter_lines(output.letters), encoding="utf-8"
    )
    summary = {
        "layout_version": LAYOUT_VERSION,
        "now_ms": now_ms,
        "counts": output.counts,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def _write_parquet(table: pa.Table, path: Path, plain: Sequence[str] = ()) -> None:
    pq.write_table(table, path, **parquet_options(table.schema, plain))


def _write_files(output: ReferenceOutput, out: Path, writes: BackgroundWrites) -> None:
    examples = output.examples
    days = to_int64(examples.column("event_time")) // DAY_MS
    for day in distinct_sorted(days):
        date = str(np.datetime64(int(day), "D"))
        part = out / "examples" / f"date={date}" / "part-0.parquet"
        part.parent.mkdir(parents=True, exist_ok=True)
        rows = examples.filter(pa.array(days == day))
        writes.submit(_write_parquet, rows, part, PLAIN_COLUMNS["examples"])
    (out / "examples").mkdir(parents=True, exist_ok=True)
    (out / "timelines").mkdir(parents=True, exist_ok=True)
    part = out / "timelines" / "part-0.parquet"
    writes.submit(_write_parquet, output.timelines, part, PLAIN_COLUMNS["timelines"])
    for name, table in output.feature_tables.items():
        folder = table_folder(out, name)
        folder.mkdir(parents=True, exist_ok=True)
        part = folder / "part-0.parquet"
        writes.submit(_write_parquet, table, part, PLAIN_COLUMNS.get(name, ()))


def read_input(source: Path) -> tuple[pa.Table, pa.Table, pa.Table, pa.Table]:
    """Events (EVENT_SCHEMA) and the users / ads / contents tables of a data set
    whose event files all parse (a generated one); :func:`read_event_input`
    reads any, setting aside what does not decode."""
    from pipelines.sources.synthetic.writer import read_event_file

    files = event_files(source)
    events = (
        pa.concat_tables([read_event_file(Path(f)) for f in files])
        if files
        else EVENT_SCHEMA.empty_table()
    )
    return (events, *_dimensions(source))


def _dimensions(source: Path) -> tuple[pa.Table, pa.Table, pa.Table]:
    return (
        _dimension(source / "users.parquet"),
        _dimension(source / "ads.parquet"),
        _dimension(source / "contents.parquet"),
    )


def _dimension(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowException) as error:
        raise InputFileError(
            f"{path}: cannot read the dimension table ({error})"
        ) from error


def read_event_input(
    source: Path, now_ms: int | None
) -> tuple[pa.Table, EventOrigins, pa.Table, pa.Table, pa.Table]:
    """Events, where each came from, and the dimension tables of any input
    the Beam job reads.

    Parquet rows become rows; a JSONL line, or a row of a Parquet file of
    foreign column types, becomes a row when it decodes
    (:func:`features.events.decode_event`, with the job's clock ``now_ms``),
    and a dead letter with the job's reason when not.
    """
    files = event_files(source)
    tables: list[pa.Table] = []
    file_index: list[npt.NDArray[np.int32]] = []
    offsets: list[I64] = []
    set_aside: list[DeadLetter] = []
    for index, path in enumerate(files):
        if path.endswith(".jsonl"):
            with open(path, "rb") as handle:
                lines = list(jsonl_payloads(handle))
            table, numbers = _decoded(path, lines, now_ms, set_aside)
        else:
            table, numbers = _parquet_events(path, now_ms, set_aside)
        tables.append(table)
        file_index.append(np.full(table.num_rows, index, np.int32))
        offsets.append(numbers)
    events = pa.concat_tables(tables) if tables else EVENT_SCHEMA.empty_table()
    origins = EventOrigins(
        tuple(files),
        np.concatenate(file_index) if file_index else np.zeros(0, np.int32),
        np.concatenate(offsets) if offsets else np.zeros(0, np.int64),
        tuple(set_aside),
    )
    return (events, origins, *_dimensions(source))


def _parquet_events(
    path: str, now_ms: int | None, set_aside: list[DeadLetter]
) -> tuple[pa.Table, I64]:
    """A Parquet file's rows and their numbers, in the job's batches: a batch
    of foreign column types row by row (:mod:`pipelines.core.event_files`)."""
    tables: list[pa.Table] = [EVENT_SCHEMA.empty_table()]
    numbers: list[I64] = []
    first = 1
    try:
        batches = pq.ParquetFile(path).iter_batches(
            batch_size=PARQUET_BATCH_ROWS, columns=list(EVENT_COLUMNS)
        )
        for batch in batches:
            table = pa.Table.from_batches([batch])
            try:
                events = table.cast(EVENT_SCHEMA)
                rows = np.arange(first, first + table.num_rows, dtype=np.int64)
            except pa.ArrowException:
                payloads = list(enumerate(row_payloads(table), start=first))
                events, rows = _decoded(path, payloads, now_ms, set_aside)
            tables.append(events)
            numbers.append(rows)
            first += table.num_rows
    except (OSError, pa.ArrowException, ValueError) as error:
        raise InputFileError(f"{path}: cannot read events ({error})") from error
    return pa.concat_tables(tables), np.concatenate([np.zeros(0, np.int64), *numbers])


def _decoded(
    path: str,
    payloads: Sequence[tuple[int, bytes]],
    now_ms: int | None,
    set_aside: list[DeadLetter],
) -> tuple[pa.Table, I64]:
    """The events of ``(line or row number, wire message)`` pairs that
    decode, with their numbers; the others' dead letters are added to
    ``set_aside``."""
    records = []
    numbers = []
    for number, payload in payloads:
        decoded = decode_event(payload, now=now_ms)
        if decoded.event is not None:
            records.append(decoded.event)
            numbers.append(number)
            continue
        reason = decoded.reason or "invalid event"
        set_aside.append(
            DeadLetter(
                source=path,
                partition=None,
                offset=number,
                reason=reason,
                payload=payload,
            )
        )
    table = events_from_records(records) if records else EVENT_SCHEMA.empty_table()
    return table.cast(EVENT_SCHEMA), np.asarray(numbers, dtype=np.int64)


def validation_clock(source: Path, now_ms: int | None) -> int:
    """``now_ms``, else the input manifest's ``validation_now_ms``, else now."""
    if now_ms is not None:
        return now_ms
    try:
        manifest = json.loads((source / "manifest.json").read_text())
        return int(manifest["validation_now_ms"])
    except (OSError, ValueError, KeyError, TypeError):
        return time.time_ns() // 1_000_000
