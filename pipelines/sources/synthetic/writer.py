"""Writing a generated data set to disk, and reading its events back.

Layout under the output directory::

    events/date=YYYY-MM-DD/part-0.parquet   (or part-0.jsonl)
    users.parquet  ads.parquet  contents.parquet
    truth.parquet                           (the generator's secret)
    manifest.json

Events are partitioned by their own UTC date in Hive style, so
``pyarrow.dataset.dataset(out / "events", partitioning="hive")`` reads them
(it adds a ``date`` column; select :data:`~features.events.EVENT_COLUMNS` or
use :func:`read_events` to get exactly :data:`EVENT_SCHEMA`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from features.events import EVENT_COLUMNS, EVENT_SCHEMA, events_to_jsonl
from pipelines.sources.synthetic.params import DAY_MS

EventFormat = Literal["parquet", "jsonl"]
FORMATS: tuple[EventFormat, ...] = ("parquet", "jsonl")

# The JSONL wire form: event_time as epoch milliseconds.
_WIRE_SCHEMA = pa.schema(
    [
        pa.field(f.name, pa.int64(), f.nullable) if f.name == "event_time" else f
        for f in EVENT_SCHEMA
    ]
)


def day_partitions(events: pa.Table) -> list[tuple[str, pa.Table]]:
    """Split events by UTC date, keeping their order within each day.

    Args:
        events: events in EVENT_SCHEMA.

    Returns:
        ``(YYYY-MM-DD, rows of that day)`` in date order.
    """
    if events.num_rows == 0:
        return []
    millis = events.column("event_time").cast(pa.int64()).to_numpy()
    days = millis // DAY_MS
    if days.size and np.any(days[1:] < days[:-1]):
        order = np.argsort(days, kind="stable")
        events, days = events.take(pa.array(order)), days[order]
    unique, starts = np.unique(days, return_index=True)
    ends = np.append(starts[1:], days.size)
    return [
        (str(np.datetime64(int(day), "D")), events.slice(int(lo), int(hi - lo)))
        for day, lo, hi in zip(unique, starts, ends, strict=True)
    ]


def write_events(
    events: pa.Table, events_dir: Path, fmt: EventFormat = "parquet"
) -> list[Path]:
    """Write events partitioned by day (``date=YYYY-MM-DD/part-0.<ext>``).

    Parquet partitions are written on a thread pool: Arrow's writer releases
    the GIL, so days compress in parallel; each file's bytes do not depend on
    the scheduling.

    Args:
        events: events in EVENT_SCHEMA.
        events_dir: the ``events/`` directory (created).
        fmt: ``parquet`` or ``jsonl``.

    Returns:
        The files written, in date order.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")
    events_dir.mkdir(parents=True, exist_ok=True)
    parts = day_partitions(events)
    paths = [events_dir / f"date={day}" / f"part-0.{fmt}" for day, _ in parts]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
    writer = _write_parquet if fmt == "parquet" else _write_jsonl
    if fmt == "parquet" and len(parts) > 1:
        with ThreadPoolExecutor(max_workers=min(len(parts), os.cpu_count() or 1)) as ex:
            list(ex.map(writer, [t for _, t in parts], paths))
    else:
        for (_, table), path in zip(parts, paths, strict=True):
            writer(table, path)
    return paths


def _write_parquet(table: pa.Table, path: Path) -> None:
    # Arrow's defaults (snappy, dictionary pages): limiting dictionaries to
    # low-cardinality columns was no faster and gave larger files.
    pq.write_table(table, path)


def _write_jsonl(table: pa.Table, path: Path) -> None:
    """One JSON object per line: the Kafka wire format (features.events)."""
    path.write_text(events_to_jsonl(table), encoding="utf-8")


def write_table(table: pa.Table, path: Path) -> None:
    """Write one dimension / truth table as Parquet."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def write_manifest(manifest: Mapping[str, Any], path: Path) -> None:
    """Write the manifest as stable, human-readable JSON."""
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def event_files(output_dir: Path | str) -> list[Path]:
    """The event files of a generated data set, in date order (either format)."""
    events_dir = Path(output_dir) / "events"
    files = sorted(events_dir.glob("date=*/part-*.parquet"))
    files += sorted(events_dir.glob("date=*/part-*.jsonl"))
    return sorted(files)


def read_event_file(path: Path) -> pa.Table:
    """One event file (Parquet or JSONL) as a table in exactly EVENT_SCHEMA."""
    if path.suffix == ".jsonl":
        wire = pa_json.read_json(
            path,
            parse_options=pa_json.ParseOptions(
                explicit_schema=_WIRE_SCHEMA, unexpected_field_behavior="error"
            ),
        )
        index = wire.schema.get_field_index("event_time")
        wire = wire.set_column(
            index,
            EVENT_SCHEMA.field("event_time"),
            wire.column("event_time").cast(EVENT_SCHEMA.field("event_time").type),
        )
        return wire.select(list(EVENT_COLUMNS)).cast(EVENT_SCHEMA)
    table = pq.read_table(path, columns=list(EVENT_COLUMNS))
    return table.cast(EVENT_SCHEMA)


def read_events(output_dir: Path | str) -> pa.Table:
    """All events of a generated data set, in file (date) and row order.

    Args:
        output_dir: the generator's output directory.

    Returns:
        The events in EVENT_SCHEMA (duplicates included, as written).
    """
    files = event_files(output_dir)
    if not files:
        return EVENT_SCHEMA.empty_table()
    return pa.concat_tables([read_event_file(f) for f in files])
