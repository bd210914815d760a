"""Where a data set's event files are, and how each is read, for every reader.

The Beam job (:mod:`pipelines.batch.inputs`) and the reference
(:mod:`pipelines.core.reference`) find the same files and number the same lines,
so their dead letters name the same file and line (no Beam import here: the
reference runs without it).

- Event files are every ``*.parquet`` and ``*.jsonl`` file under
  ``<input>/events``, at any depth, in sorted path order.
- A JSONL line's number is its 1-based line in the file; blank lines hold no
  event and are skipped, but counted. A Parquet row's number is its 1-based
  row in the file.
- A Parquet file is read in batches of :data:`PARQUET_BATCH_ROWS` rows; a
  batch whose columns cast to the event schema is a table. One that does not
  (an id column of uint64 holding 2**63, ids as floats or text, naive times)
  is still read: each row becomes a wire message (:func:`row_payloads`) and is
  decoded like a JSONL line, so each bad row is one dead letter with its own
  reason and the good rows go on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final

import pyarrow as pa

from features.cli import CommandError

EVENT_SUFFIXES: Final = (".parquet", ".jsonl")
PARQUET_BATCH_ROWS: Final = 262_144


class InputFileError(CommandError, ValueError):
    """An input file is missing, unreadable or not what it should be: a
    :class:`~features.cli.CommandError`, so a command reports it as one line
    naming the file (exit status 2)."""


def event_files(input_dir: str | Path, *, required: bool = True) -> list[str]:
    """Event files under ``input_dir/events`` (any depth), sorted."""
    root = Path(input_dir) / "events"
    if not root.is_dir():
        if not required:
            return []
        raise InputFileError(
            f"{root}: no events directory in --input {input_dir}",
            "give --input the folder pipelines.generate or pipelines.movielens wrote",
        )
    return sorted(
        str(p) for p in root.rglob("*") if p.is_file() and p.suffix in EVENT_SUFFIXES
    )


def jsonl_payloads(lines: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)`` of each non-blank line of a JSONL file.

    Args:
        lines: the file's lines as read (binary, line endings included).
    """
    for number, line in enumerate(lines, start=1):
        body = line.rstrip(b"\r\n")
        if body.strip():
            yield number, body


def row_payloads(table: pa.Table) -> list[bytes]:
    """Each row of a table of foreign column types as a JSON wire message.

    Values go in as the file holds them: strings that are not UTF-8 as their
    bytes, times with a zone as epoch milliseconds and naive ones as ISO text
    (which the contract refuses), NaN as ``NaN`` (which JSON does not have).
    """
    columns = {
        field.name: _wire_values(table.column(field.name), field.type)
        for field in table.schema
    }
    names = list(columns)
    return [
        _row_json(dict(zip(names, values, strict=True)))
        for values in zip(*columns.values(), strict=True)
    ]


_MS_PER_UNIT: Final = {"s": (1000, 1), "ms": (1, 1), "us": (1, 1000), "ns": (1, 10**6)}


def _wire_values(column: pa.ChunkedArray, kind: pa.DataType) -> list[Any]:
    """A column's values as the wire form would hold them, never raising:
    times go through integers, so one outside Python's calendar (years 1 to
    9999) is still a value for the validator to refuse."""
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        # As bytes: a Parquet string column need not hold UTF-8.
        return list(column.cast(pa.binary()).to_pylist())
    if pa.types.is_timestamp(kind):
        if kind.tz is None:
            # Naive times as text without an offset, which the contract refuses.
            return list(column.cast(pa.string()).to_pylist())
        scale, divide = _MS_PER_UNIT[kind.unit]
        ticks = column.cast(pa.int64()).to_pylist()
        return [None if t is None else t * scale // divide for t in ticks]
    return list(column.to_pylist())


def _row_json(row: dict[str, Any]) -> bytes:
    record = {name: _json_value(value) for name, value in row.items()}
    text = json.dumps(record, separators=(",", ":"), ensure_ascii=False, default=str)
    # surrogateescape gives undecodable bytes back as they were.
    return text.encode("utf-8", "surrogateescape")


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value
