"""Reading the job's inputs and writing its outputs (see ``OUTPUT_LAYOUT``).

Inputs are checked before the pipeline is built (:func:`check_inputs`), so a
missing, truncated or foreign file fails at once with a message naming it
instead of deep inside a runner's stack trace; the read DoFns wrap any later
read error the same way (:class:`InputFileError`). Which files are events,
and how their lines and rows are numbered, is :mod:`pipelines.core.event_files`,
shared with the reference. A bad line or row is no read error: it is a dead
letter (:mod:`pipelines.batch.validate`).

Inputs are found, read and checked, and outputs written, through
``apache_beam.io.filesystems.FileSystems``, so ``--input`` and ``--output``
may be a local folder or a URL of any scheme Beam's filesystems know (GCS,
S3, HDFS...), from any runner. Every part file is named after its shard,
which makes a retried bundle overwrite its own output instead of adding a
second copy.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Final

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam import pvalue
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from features.arrow_ipc import ipc_to_table, table_to_ipc
from features.dimensions import AD_SCHEMA, CONTENT_SCHEMA, USER_SCHEMA
from features.events import EVENT_COLUMNS, EVENT_SCHEMA
from features.examples import TIMELINE_SCHEMA, training_example_schema
from features.feature_tables import FEATURE_TABLES
from pipelines.batch.arrow import ShardedTable, TaggedIpc
from pipelines.batch.tuning import TunedDoFn, pipeline_tuning
from pipelines.batch.validate import METRICS_NAMESPACE, RawEvents
from pipelines.core.columns import concat, to_int64
from pipelines.core.event_files import (
    EVENT_SUFFIXES,
    PARQUET_BATCH_ROWS,
    InputFileError,
    jsonl_payloads,
    row_payloads,
)
from pipelines.core.ordering import int_order, timeline_order
from pipelines.core.output_files import (
    PLAIN_COLUMNS,
    BackgroundWrites,
    parquet_options,
    write_parquet_bytes,
)

JSONL_BATCH_LINES: Final = 65_536
DAY_MS: Final = 86_400_000


def output_location(path: str) -> str:
    """``--output`` as the job names it: a URL as given (without a trailing
    slash), a local path absolute and normalized."""
    if FileSystems.get_scheme(path) is None:
        return str(Path(path).resolve())
    return _served(path).rstrip("/")


def input_location(path: str) -> str:
    """``--input`` as the job names its files: a URL as given (without a
    trailing slash), a local path as ``pathlib`` spells it, which is how
    :func:`pipelines.core.event_files.event_files` (the reference's) names them."""
    if FileSystems.get_scheme(path) is None:
        return str(Path(path))
    return _served(path).rstrip("/")


def _served(url: str) -> str:
    """``url``, once a Beam filesystem is known to serve its scheme."""
    try:
        FileSystems.get_filesystem(url)
    except ValueError:
        scheme = FileSystems.get_scheme(url)
        raise InputFileError(
            f"{url}: no Beam filesystem serves {scheme}://",
            "install the Beam extra that provides it (apache-beam[gcp] for "
            "gs://, apache-beam[aws] for s3://)",
        ) from None
    return url


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


def dimension_path(input_dir: str, name: str) -> str:
    """Where the dimension table ``name`` (users, ads, contents) is."""
    return FileSystems.join(input_location(input_dir), f"{name}.parquet")


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


def read_dimension(path: str, schema: pa.Schema) -> pa.Table:
    """A dimension table in exactly ``schema`` (empty when the file is absent)."""
    if not FileSystems.exists(path):
        return schema.empty_table()
    try:
        with FileSystems.open(path) as handle:
            table = pq.read_table(handle, columns=schema.names)
    except (OSError, pa.ArrowException) as error:
        raise InputFileError(f"{path}: cannot read ({error})") from error
    return table.cast(schema).combine_chunks()


DIMENSION_SCHEMAS: Final = {
    "users": USER_SCHEMA,
    "ads": AD_SCHEMA,
    "contents": CONTENT_SCHEMA,
}


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


def write_parquet(table: pa.Table, path: str, plain: Sequence[str] = ()) -> None:
    """Write one Parquet file through Beam's filesystems (local, GCS, S3...);
    ``plain``: columns without dictionary encoding (``PLAIN_COLUMNS``)."""
    data = write_parquet_bytes(table, plain)
    with FileSystems.create(path) as handle:
        handle.write(memoryview(data))


class ParquetFileWriter:
    """One Parquet file written part by part (a row group or more each), in
    memory until :meth:`close` stores it through Beam's filesystems;
    ``plain`` as for :func:`write_parquet`."""

    def __init__(self, schema: pa.Schema, plain: Sequence[str] = ()) -> None:
        self._schema = schema
        self._sink = pa.BufferOutputStream()
        options = parquet_options(schema, plain)
        self._writer = pq.ParquetWriter(self._sink, schema, **options)

    def write(self, part: pa.Table) -> None:
        """Append ``part`` (cast to the file's schema)."""
        self._writer.write_table(part.cast(self._schema))

    def close(self, path: str) -> None:
        """Finish the file and store it at ``path``."""
        self._writer.close()
        with FileSystems.create(path) as handle:
            handle.write(memoryview(self._sink.getvalue()))


class BackgroundWriteFn(TunedDoFn):
    """Base of the DoFns that write files: writes run on a thread of the
    worker (:class:`~pipelines.core.output_files.BackgroundWrites`) while the
    bundle goes on, and are complete when the bundle finishes (a retried
    bundle rewrites the same paths)."""

    def setup(self) -> None:
        """One writer thread per DoFn instance; the process's memory settings."""
        super().setup()
        self._writes = BackgroundWrites()

    def start_bundle(self) -> None:
        """Leftovers of a failed bundle finish first (their errors were its)."""
        self._writes.forget()

    def write(self, table: pa.Table, path: str, plain: Sequence[str] = ()) -> None:
        """Write ``table`` to ``path`` in the background (see :func:`write_parquet`)."""
        self._writes.submit(write_parquet, table, path, plain)

    def submit(self, job: Callable[..., Any], *args: Any) -> None:
        """Run ``job(*args)`` on the writer thread, after the earlier writes."""
        self._writes.submit(job, *args)

    def finish_bundle(self) -> None:
        """Every file of the bundle is written."""
        self._writes.wait()

    def teardown(self) -> None:
        """Stop the writer thread."""
        self._writes.close()


def _day(day: int) -> str:
    """``YYYY-MM-DD`` of a day number (days since the epoch)."""
    return dt.datetime.fromtimestamp(day * 86_400, dt.UTC).date().isoformat()


def day_parts(table: pa.Table) -> Iterator[tuple[str, pa.Table]]:
    """Rows of ``table`` by the UTC day of ``event_time``, as ``(YYYY-MM-DD,
    rows)``, each day's rows in time order (ties by ``example_id``).

    One sort and one gather of the whole table, then each day is a zero-copy
    slice (time order groups the days).
    """
    if table.num_rows == 0:
        return
    times = to_int64(table.column("event_time"))
    order = timeline_order([times], table.column("example_id"))
    if np.any(order[1:] < order[:-1]):
        table = table.take(pa.array(order))
    days = times[order] // DAY_MS
    bounds = np.flatnonzero(days[1:] != days[:-1]) + 1
    starts = np.concatenate([[0], bounds]).astype(np.int64)
    ends = np.append(bounds, days.size).astype(np.int64)
    for lo, hi in zip(starts, ends, strict=True):
        yield _day(int(days[lo])), table.slice(int(lo), int(hi - lo))


class WriteExamplesFn(BackgroundWriteFn):
    """Write a shard's examples: one part per (day, shard), in impression time
    order (ties by example_id).

    Time order is what a time-forward reader wants, and an integer sort; the
    layout leaves the order within parts open (the reference's one part per
    day is sorted by example_id, a string sort of every example).
    """

    def __init__(self, output: str) -> None:
        self._output = output
        self.examples = Metrics.counter(METRICS_NAMESPACE, "examples")

    def process(self, element: ShardedTable) -> Iterator[str]:
        """Write, count, and yield the paths written."""
        shard, examples = element
        schema = training_example_schema()
        for day, rows in day_parts(examples):
            path = f"{self._output}/examples/date={day}/part-{shard:05d}.parquet"
            self.write(rows.cast(schema), path, PLAIN_COLUMNS["examples"])
            yield path
        self.examples.inc(examples.num_rows)


class WriteExamples(beam.PTransform):  # type: ignore[misc]
    """``examples/date=YYYY-MM-DD/part-SSSSS.parquet`` from (shard, examples)."""

    def __init__(self, output: str) -> None:
        super().__init__()
        self._output = output

    def expand(self, examples: beam.PCollection) -> beam.PCollection:
        """Write every shard; the output is the list of paths."""
        write = WriteExamplesFn(self._output).tuned(pipeline_tuning(examples.pipeline))
        return examples | "WriteParts" >> beam.ParDo(write)


class WriteTimelines(beam.PTransform):  # type: ignore[misc]
    """``timelines/part-SSSSS.parquet`` from (shard, timelines), sorted by user."""

    def __init__(self, output: str) -> None:
        super().__init__()
        self._output = output

    def expand(self, timelines: beam.PCollection) -> beam.PCollection:
        """Write one part per shard."""
        write = WriteTimelinesFn(self._output).tuned(
            pipeline_tuning(timelines.pipeline)
        )
        return timelines | "WriteParts" >> beam.ParDo(write)


class WriteTimelinesFn(BackgroundWriteFn):
    """``(shard, timelines)`` -> ``timelines/part-SSSSS.parquet``, by user."""

    def __init__(self, output: str) -> None:
        self._output = output

    def process(self, element: ShardedTable) -> Iterator[str]:
        """Write the shard's part (in the background); yield its path."""
        shard, table = element
        path = f"{self._output}/timelines/part-{shard:05d}.parquet"
        users = to_int64(table.column("user_id"))
        # BuildTimelines already emits users in order: skip reordering the
        # list columns then (a copy of every event).
        if np.any(users[1:] < users[:-1]):
            table = table.sort_by("user_id")
        self.write(table.cast(TIMELINE_SCHEMA), path, PLAIN_COLUMNS["timelines"])
        yield path


class WriteFeatureTables(beam.PTransform):  # type: ignore[misc]
    """``feature_tables/<name>.parquet`` from (name, piece) pairs, one file each.

    Pieces of a table come from every shard; one GroupByKey per table name
    gathers them (as Arrow IPC) so each table is one file, sorted by (entity,
    event_timestamp). Every table of ``names`` is written, empty ones included.

    Applied to one PCollection of pieces or a tuple of them: they are
    flattened once, straight into the GroupByKey (each chained Flatten costs a
    runner like FnApiRunner one more pass over the bytes).
    """

    def __init__(self, output: str, names: Iterable[str] | None = None) -> None:
        super().__init__()
        self._output = output
        self._names = list(FEATURE_TABLES if names is None else names)

    def expand(self, pieces: beam.PCollection | tuple[beam.PCollection, ...]) -> Any:
        """Group by table name, concatenate, sort and write."""
        output = self._output
        inputs = pieces if isinstance(pieces, tuple) else (pieces,)
        # An empty piece of every table, so that each is written.
        empties = inputs[0].pipeline | "EmptyPieces" >> beam.Create(
            [
                (name, table_to_ipc(FEATURE_TABLES[name].schema.empty_table()))
                for name in self._names
            ],
            reshuffle=False,
        ).with_output_types(TaggedIpc)

        return (
            (*inputs, empties)
            | "AllPieces" >> beam.Flatten().with_output_types(TaggedIpc)
            | "ByTable" >> beam.GroupByKey()
            | "WriteTables"
            >> beam.ParDo(
                WriteFeatureTablesFn(output).tuned(pipeline_tuning(empties.pipeline))
            )
        )


class WriteFeatureTablesFn(BackgroundWriteFn):
    """``(table name, IPC pieces)`` -> ``feature_tables/<name>.parquet``."""

    def __init__(self, output: str) -> None:
        self._output = output

    def process(self, element: tuple[str, Iterable[bytes]]) -> Iterator[str]:
        """Concatenate, sort by (entity, time), write in the background."""
        name, parts = element
        spec = FEATURE_TABLES[name]
        tables = [ipc_to_table(p) for p in parts]
        table = concat([t for t in tables if t.num_rows], spec.schema)
        # One gather in (entity, time) order; a stable sort keeps the table
        # order of equal keys (profile versions), like the reference.
        order = int_order(
            [
                to_int64(table.column(spec.entity)),
                to_int64(table.column("event_timestamp")),
            ]
        )
        table = table.take(pa.array(order))
        path = f"{self._output}/feature_tables/{name}.parquet"
        self.write(table.cast(spec.schema), path)
        yield path


class WriteDeadLetters(beam.PTransform):  # type: ignore[misc]
    """``dead_letters/part-SSSSS-of-NNNNN.jsonl``: one ``DeadLetter.to_json()``
    line per rejected event."""

    def __init__(self, output: str) -> None:
        super().__init__()
        self._output = output

    def expand(self, lines: beam.PCollection) -> beam.PCollection:
        """Beam's text sink (temp files, then an atomic rename)."""
        return lines | "WriteLines" >> beam.io.WriteToText(
            f"{self._output}/dead_letters/part",
            file_name_suffix=".jsonl",
            shard_name_template="-SSSSS-of-NNNNN",
        )


def sorted_unique_days(times: pa.ChunkedArray) -> list[str]:
    """UTC days present in a timestamp column (for summaries and tests)."""
    days = np.unique(to_int64(pc.drop_null(times)) // DAY_MS)
    return [_day(int(d)) for d in days]
