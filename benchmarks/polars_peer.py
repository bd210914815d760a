"""The feature job in one process, written with Polars: the build benchmark's peer.

What a data engineer would write with Polars for the job the reference
(:mod:`pipelines.core.reference`, the oracle) and the Beam job
(``pipelines/build.py``) run, with the same outputs, row for row: the same
validation rules and dead-letter reasons (:mod:`benchmarks.polars_peer_rules`),
the same dedupe, timelines, counters, labels, as-of joins, examples and
feature tables (:mod:`benchmarks.polars_peer_features`), written in the
layout of :data:`features.feature_tables.OUTPUT_LAYOUT`.

The heavy work is Polars expressions (scans, ``group_by``, sorts, joins,
``join_asof``, rolling windows, exploded ranges), on all of Polars' threads. What
is not Polars, and why:

- the Parquet files are written by pyarrow with the job's settings
  (:func:`pipelines.core.output_files.parquet_options`), from the frames
  cast to the contract's exact schemas (non-null fields, 32-bit list
  offsets), which Polars' own writer cannot declare;
- the few rejected rows get their reason text and wire payload
  (:func:`features.events.encode_event_table`) in Python, and the copies of
  an event_id that tie on time and user but differ get their digest
  (:func:`features.duplicates.copy_digests`): both are contract functions,
  called on a handful of rows;
- ``user_location`` is the contract's FNV-1a bucket
  (:func:`features.registry.string_bucket`), a numpy kernel, on the users
  table.

Input: a ``pipelines.generate`` folder whose event files are Parquet in
:data:`~features.events.EVENT_SCHEMA`. JSONL event files, Parquet files of
other column types and strings that are not UTF-8 are left to the reference
(which decodes them row by row): the peer refuses them
(:class:`~pipelines.core.event_files.InputFileError`).

Usage::

    python -m benchmarks.polars_peer --input DIR --output DIR [--now-ms MS]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.polars_peer_features import (
    ad_frame,
    counter_tables,
    distinct_events,
    examples_of,
    profile_table,
    timeline_events,
    timelines_of,
    user_frame,
    user_sequence_of,
)
from benchmarks.polars_peer_rules import TIME_MS, Rule, event_rules, first_rule
from features.cli import CommandError, CommandParser, run_command
from features.deadletter import DeadLetter
from features.events import EVENT_COLUMNS, EVENT_SCHEMA, encode_event_table
from features.examples import TIMELINE_SCHEMA, training_example_schema
from features.feature_tables import (
    COUNT_NAMES,
    EVENT_TIMESTAMP,
    FEATURE_TABLES,
    LAYOUT_VERSION,
    table_folder,
)
from features.registry import COUNTER_ENTITIES
from pipelines.core.event_files import InputFileError, event_files
from pipelines.core.output_files import PLAIN_COLUMNS, BackgroundWrites, parquet_options

_EVENT_TYPES = pl.DataFrame(EVENT_SCHEMA.empty_table()).schema


@dataclass(frozen=True)
class PeerInput:
    """A data set as Polars frames.

    Attributes:
        events: the event columns, plus ``_file`` (index into ``files``) and
            ``_offset`` (1-based row in that file).
        files: the event files, in the reference's order.
        users, ads, contents: the dimension tables.
    """

    events: pl.DataFrame
    files: tuple[str, ...]
    users: pl.DataFrame
    ads: pl.DataFrame
    contents: pl.DataFrame


@dataclass(frozen=True)
class PeerOutput:
    """Everything the job writes (:data:`features.feature_tables.OUTPUT_LAYOUT`)."""

    examples: pl.DataFrame
    timelines: pl.DataFrame
    feature_tables: dict[str, pl.DataFrame]
    letters: tuple[DeadLetter, ...]
    counts: dict[str, int]


def read_input(source: Path) -> PeerInput:
    """The events (every file's rows, numbered) and dimension tables of ``source``."""
    files = tuple(event_files(source))
    for path in files:
        if not path.endswith(".parquet"):
            raise InputFileError(f"{path}: the Polars peer reads Parquet events only")
        schema = pl.read_parquet_schema(path)
        if any(schema.get(name) != kind for name, kind in _EVENT_TYPES.items()):
            raise InputFileError(f"{path}: not in the event schema's column types")
    scans = [
        pl.scan_parquet(path)
        .select(EVENT_COLUMNS)
        .with_row_index("_offset", offset=1)
        .with_columns(pl.col("_offset").cast(pl.Int64), _file=pl.lit(i, pl.Int32))
        for i, path in enumerate(files)
    ]
    try:
        events = (
            pl.concat(scans).collect()
            if scans
            else pl.DataFrame(schema=_EVENT_TYPES).with_columns(
                _offset=pl.lit(0, pl.Int64), _file=pl.lit(0, pl.Int32)
            )
        )
        dimensions = [
            pl.read_parquet(source / f"{name}.parquet")
            for name in ("users", "ads", "contents")
        ]
    except (OSError, pl.exceptions.PolarsError) as error:
        raise InputFileError(f"{source}: cannot read the data set ({error})") from error
    return PeerInput(events, files, *dimensions)


def _letters(
    rejected: pl.DataFrame, files: tuple[str, ...], rules: list[Rule]
) -> tuple[DeadLetter, ...]:
    """The dead letters of the rejected rows, by file and row."""
    rejected = rejected.sort("_file", "_offset")
    wire = encode_event_table(
        rejected.select(EVENT_COLUMNS).to_arrow().cast(EVENT_SCHEMA)
    )
    return tuple(
        DeadLetter(
            source=files[row["_file"]],
            partition=None,
            offset=row["_offset"],
            reason=rules[row["_rule"]].text(row),
            payload=payload,
        )
        for row, payload in zip(rejected.iter_rows(named=True), wire, strict=True)
    )


def build(data: PeerInput, now_ms: int) -> PeerOutput:
    """Run the whole job on ``data`` with the validation clock ``now_ms``."""
    rules = event_rules(now_ms)
    events = (
        data.events.lazy()
        .with_columns(pl.col("event_time").dt.epoch("ms").alias(TIME_MS))
        .with_columns(_rule=first_rule(rules))
        .collect()
    )
    rejected = events.filter(pl.col("_rule").is_not_null())
    valid = events.filter(pl.col("_rule").is_null()).drop("_rule", "_file", "_offset")
    letters = _letters(rejected, data.files, rules)
    distinct = distinct_events(valid)
    users, ads = user_frame(data.users), ad_frame(data.ads)
    ordered = timeline_events(distinct, ads, data.contents)
    timelines = timelines_of(ordered)
    counters = counter_tables(distinct)
    examples = examples_of(ordered, users, ads, counters)
    tables = {
        "user_profile": profile_table(users, "user_profile"),
        "ad_profile": profile_table(ads, "ad_profile"),
        **{
            f"{e}_counters": counters[e].rename({TIME_MS: EVENT_TIMESTAMP})
            for e in COUNTER_ENTITIES
        },
        "user_sequence": user_sequence_of(ordered),
    }
    counts = {
        "events_read": events.height,
        "events_valid": valid.height,
        "events_dead_lettered": len(letters),
        "duplicates_removed": valid.height - distinct.height,
        "events_distinct": distinct.height,
        "timeline_events": int(timelines.get_column("event_time").list.len().sum()),
        "timelines": timelines.height,
        "impressions": int((distinct.get_column("action") == "impression").sum()),
        "examples": examples.height,
    }
    assert tuple(counts) == COUNT_NAMES
    return PeerOutput(examples, timelines, tables, letters, counts)


# --- files -------------------------------------------------------------------


def _arrow(frame: pl.DataFrame, schema: pa.Schema) -> pa.Table:
    """A frame as an Arrow table of exactly ``schema`` (times from epoch ms)."""
    table = frame.to_arrow()
    arrays = []
    for field in schema:
        column = table.column(field.name)
        if pa.types.is_timestamp(field.type) and pa.types.is_integer(column.type):
            column = column.cast(pa.int64()).cast(field.type)
        arrays.append(column.cast(field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _write_parquet(table: pa.Table, path: Path, plain: Sequence[str] = ()) -> None:
    pq.write_table(table, path, **parquet_options(table.schema, plain))


def write_output(output: PeerOutput, out: Path, *, now_ms: int) -> None:
    """Write every output under ``out`` (one part-0 per folder), on a writer
    thread while the next table is converted."""
    writes = BackgroundWrites()
    try:
        days = output.examples.with_columns(
            _date=pl.col("event_time").dt.strftime("%Y-%m-%d")
        ).partition_by("_date", as_dict=True, maintain_order=True)
        (out / "examples").mkdir(parents=True, exist_ok=True)
        for (date,), rows in sorted(days.items()):
            part = out / "examples" / f"date={date}" / "part-0.parquet"
            part.parent.mkdir(parents=True, exist_ok=True)
            table = _arrow(rows.drop("_date"), training_example_schema())
            writes.submit(_write_parquet, table, part, PLAIN_COLUMNS["examples"])
        (out / "timelines").mkdir(parents=True, exist_ok=True)
        table = _arrow(output.timelines, TIMELINE_SCHEMA)
        part = out / "timelines" / "part-0.parquet"
        writes.submit(_write_parquet, table, part, PLAIN_COLUMNS["timelines"])
        for name, frame in output.feature_tables.items():
            table = _arrow(frame, FEATURE_TABLES[name].schema)
            folder = table_folder(out, name)
            folder.mkdir(parents=True, exist_ok=True)
            part = folder / "part-0.parquet"
            writes.submit(_write_parquet, table, part, PLAIN_COLUMNS.get(name, ()))
        writes.wait()
    finally:
        writes.close()
    (out / "dead_letters").mkdir(parents=True, exist_ok=True)
    (out / "dead_letters" / "part-0.jsonl").write_text(
        "".join(letter.to_json() + "\n" for letter in output.letters),
        encoding="utf-8",
    )
    summary = {
        "layout_version": LAYOUT_VERSION,
        "now_ms": now_ms,
        "counts": output.counts,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


# --- the command -------------------------------------------------------------


def build_parser() -> CommandParser:
    """The command's flags."""
    parser = CommandParser(
        "benchmarks.polars_peer",
        "The feature job in one process with Polars: the same outputs as "
        "python -m pipelines.reference, for the build benchmark.",
    )
    parser.add_argument("--input", type=Path, required=True, help="data set folder")
    parser.add_argument(
        "--output", type=Path, required=True, help="output folder, new or empty"
    )
    parser.add_argument(
        "--now-ms",
        type=int,
        default=None,
        help="validation clock in epoch ms (default: as python -m pipelines.reference)",
    )
    return parser


def _peer(args: argparse.Namespace) -> int:
    from pipelines.core.reference import validation_clock

    out: Path = args.output
    if out.is_dir() and any(out.iterdir()):
        raise CommandError(f"{out} is not empty", "give a new or empty folder")
    now_ms = validation_clock(args.input, args.now_ms)
    output = build(read_input(args.input), now_ms)
    write_output(output, out, now_ms=now_ms)
    print(json.dumps({"counts": output.counts}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; its exit status (2 with one line for bad input)."""
    return run_command(build_parser(), _peer, argv)


if __name__ == "__main__":
    sys.exit(main())
