"""Reading the batch job's inputs.

Inputs are checked before the pipeline is built (:func:`check_inputs`), so a
missing, truncated or foreign file fails at once with a message naming it
instead of deep inside a runner's stack trace; the read DoFns wrap any later
read error the same way (:class:`InputFileError`). Which files are events,
and how their lines and rows are numbered, is :mod:`pipelines.core.event_files`,
shared with the reference. A bad line or row is no read error: it is a dead
letter (:mod:`pipelines.batch.validate`). Files are found and read through
Beam's filesystems (:mod:`pipelines.beam.files`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any, Final

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam import pvalue
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from features.events import EVENT_COLUMNS, EVENT_SCHEMA
from pipelines.batch.tuning import TunedDoFn, pipeline_tuning
from pipelines.batch.validate import METRICS_NAMESPACE, RawEvents
from pipelines.beam.files import (
    DIMENSION_SCHEMAS,
    dimension_path,
    input_location,
    read_dimension,
)
from pipelines.core.event_files import (
    EVENT_SUFFIXES,
    PARQUET_BATCH_ROWS,
    InputFileError,
    jsonl_payloads,
    row_payloads,
)

JSONL_BATCH_LINES: Final = 65_536


def find_event_files(input_dir: str, *, required: bool = True) -> list[str]:
    """Event files under ``input_dir/events`` (any depth), sorted: the rule
    of :func:`pipelines.core.event_files.event_files`, on any Beam filesystem."""
    root = FileSystems.join(input_location(input_dir), "events")
    found = FileSystems.match([FileSystems.join(root, "**")])[0].metadata_list
    files = sorted(
        meta.path for meta in found if PurePosixPath(meta.path).suffix in EVENT_SUFFIXES
    )
    # An events folder with no file is an empty input; none at all is an error
    # (a store without folders has the folder exactly when it has files).
    if not files and required and not FileSystems.exists(root):
        raise InputFileError(
            f"{root}: no events directory in --input {input_dir}",
            "give --input the folder pipelines.generate or pipelines.movielens wrote",
        )
    return files


def check_inputs(input_dir: str, *, events_required: bool = True) -> list[str]:
    """Fail early, naming the file, on inputs the job could not read.

    Parquet footers are read (a truncated file has none) and event files must
    hold every event column; JSONL is checked line by line later, where a bad
    line is a dead letter rather than an error.

    Returns:
        The event files.
    """
    files = find_event_files(input_dir, required=events_required)
    for path in files:
        if path.endswith(".parquet"):
            names = _parquet_schema(path).names
            missing = [c for c in EVENT_COLUMNS if c not in names]
            if missing:
                raise InputFileError(
                    f"{path}: not an events file, missing columns {missing}"
                )
    for name in ("users", "ads"):
        path = dimension_path(input_dir, name)
        if not FileSystems.exists(path):
            raise InputFileError(
                f"{path}: missing dimension table",
                "give --input the folder pipelines.generate or "
                "pipelines.movielens wrote",
            )
        _parquet_schema(path)
    contents = dimension_path(input_dir, "contents")
    if FileSystems.exists(contents):
        _parquet_schema(contents)
    return files


def _parquet_schema(path: str) -> pa.Schema:
    try:
        with FileSystems.open(path) as handle:
            return pq.read_schema(handle)
    except (OSError, pa.ArrowException) as error:
        raise InputFileError(f"{path}: unreadable Parquet file ({error})") from error


class ReadEventFileFn(TunedDoFn):
    """One event file in, :class:`RawEvents` batches out (bounded memory)."""

    def __init__(self) -> None:
        # What the progress bar counts (pipelines.batch.progress).
        self.files_read = Metrics.counter(METRICS_NAMESPACE, "event_files_read")

    def process(self, path: str) -> Iterator[RawEvents]:
        """Yield the file's events in batches; errors name the file."""
        try:
            if path.endswith(".jsonl"):
                yield from _jsonl_batches(path)
            else:
                yield from _parquet_batches(path)
            self.files_read.inc()
        except (OSError, pa.ArrowException, ValueError) as error:
            if isinstance(error, InputFileError):
                raise
            raise InputFileError(f"{path}: cannot read events ({error})") from error


def _parquet_batches(path: str) -> Iterator[RawEvents]:
    with FileSystems.open(path) as handle:
        parquet = pq.ParquetFile(handle)
        offset = 1  # row numbers, like line numbers, start at 1
        for batch in parquet.iter_batches(
            batch_size=PARQUET_BATCH_ROWS, columns=list(EVENT_COLUMNS)
        ):
            table = pa.Table.from_batches([batch])
            try:
                events = RawEvents(path, offset, table=table.cast(EVENT_SCHEMA))
            except pa.ArrowException:
                # Foreign column types: row by row (pipelines.core.event_files).
                events = RawEvents(path, offset, payloads=tuple(row_payloads(table)))
            yield events
            offset += table.num_rows


def _jsonl_batches(path: str) -> Iterator[RawEvents]:
    with FileSystems.open(path) as handle:
        lines: list[bytes] = []
        numbers: list[int] = []
        for number, body in jsonl_payloads(handle):
            lines.append(body)
            numbers.append(number)
            if len(lines) == JSONL_BATCH_LINES:
                yield _line_batch(path, lines, numbers)
                lines, numbers = [], []
        if lines:
            yield _line_batch(path, lines, numbers)


def _line_batch(path: str, lines: list[bytes], numbers: list[int]) -> RawEvents:
    """A batch of lines with their own numbers (blank lines leave gaps)."""
    return RawEvents(path, numbers[0], payloads=tuple(lines), offsets=tuple(numbers))


class ReadEvents(beam.PTransform):  # type: ignore[misc]
    """Raw event batches (:class:`RawEvents`) from event files."""

    def __init__(self, files: list[str]) -> None:
        super().__init__()
        self._files = files

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        """Files, spread over workers, each read in batches."""
        return (
            pbegin
            # One reshuffle, ours, spreads the files over workers (Create's
            # own would be a second one: more transforms, one more stage).
            | "ListFiles" >> beam.Create(self._files, reshuffle=False)
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadFiles"
            >> beam.ParDo(
                ReadEventFileFn().tuned(pipeline_tuning(pbegin.pipeline))
            ).with_output_types(RawEvents)
        )


class ReadDimension(beam.PTransform):  # type: ignore[misc]
    """One dimension table (``users`` / ``ads`` / ``contents``) as one element.

    Small enough to be a side input of every shard (the tables hold one row
    per entity version, not per event).
    """

    def __init__(self, input_dir: str, name: str) -> None:
        super().__init__()
        self._path = dimension_path(input_dir, name)
        self._schema = DIMENSION_SCHEMAS[name]

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        """Read the file in a DoFn (not at construction), as a pa.Table."""
        schema = self._schema
        return (
            pbegin
            | "Path" >> beam.Create([self._path])
            | "Read"
            >> beam.Map(lambda path: read_dimension(path, schema)).with_output_types(
                pa.Table
            )
        )


class ReadDimensionFn(beam.DoFn):  # type: ignore[misc]
    """A dimension table's name in, the table out on the output of that name."""

    def __init__(self, input_dir: str) -> None:
        self._input_dir = input_dir

    def process(self, name: str) -> Iterator[pvalue.TaggedOutput]:
        """Read ``<input>/<name>.parquet`` (empty when absent)."""
        path = dimension_path(self._input_dir, name)
        yield pvalue.TaggedOutput(name, read_dimension(path, DIMENSION_SCHEMAS[name]))


class ReadDimensions(beam.PTransform):  # type: ignore[misc]
    """The ``users``, ``ads`` and ``contents`` tables, one element each.

    One read step with an output per table (rather than one
    :class:`ReadDimension` each): the tables are small side inputs, and every
    extra step costs the runner fixed start-up work.

    Returns a ``DoOutputsTuple``: ``.users``, ``.ads``, ``.contents``.
    """

    def __init__(self, input_dir: str) -> None:
        super().__init__()
        self._input_dir = input_dir

    def expand(self, pbegin: beam.pvalue.PBegin) -> Any:
        """Read each table in a DoFn (not at construction)."""
        return (
            pbegin
            | "Names" >> beam.Create(list(DIMENSION_SCHEMAS), reshuffle=False)
            | "Read"
            >> beam.ParDo(ReadDimensionFn(self._input_dir)).with_outputs(
                *DIMENSION_SCHEMAS
            )
        )
