"""Writing the batch job's outputs (see ``OUTPUT_LAYOUT``).

Outputs are written through Beam's filesystems, so ``--output`` may be a
local folder or a URL of any scheme they know, from any runner. Every part
file is named after its shard, which makes a retried bundle overwrite its own
output instead of adding a second copy.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from features.arrow_ipc import ipc_to_table
from features.examples import TIMELINE_SCHEMA, training_example_schema
from features.feature_tables import FEATURE_TABLES
from pipelines.batch.arrow import ShardedTable, TablePart
from pipelines.batch.tuning import TunedDoFn, pipeline_tuning
from pipelines.batch.validate import METRICS_NAMESPACE
from pipelines.core.columns import to_int64
from pipelines.core.ordering import int_order, timeline_order
from pipelines.core.output_files import (
    PLAIN_COLUMNS,
    BackgroundWrites,
    parquet_options,
    write_parquet_bytes,
)

DAY_MS: Final = 86_400_000


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
    """Base of the DoFns that write files: writes run on writer threads of
    the worker (:class:`~pipelines.core.output_files.BackgroundWrites`) while the
    bundle goes on, and are complete when the bundle finishes (a retried
    bundle rewrites the same paths)."""

    ordered_writes = False
    """Whether the writes must run one after the other, in submission order
    (the parts of one file). Otherwise each write is a whole file, and two
    run side by side where the tuning gives the worker a core to spare."""

    def setup(self) -> None:
        """The DoFn instance's writer threads; the process's memory settings."""
        super().setup()
        spare_core = self.tuning.threads > 0 and not self.ordered_writes
        self._writes = BackgroundWrites(threads=2 if spare_core else 1)

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


def in_user_order(timelines: pa.Table) -> pa.Table:
    """``timelines`` sorted by ``user_id``."""
    users = to_int64(timelines.column("user_id"))
    # BuildTimelines already emits users in order: skip reordering the list
    # columns then (a copy of every event).
    if np.any(users[1:] < users[:-1]):
        return timelines.sort_by("user_id")
    return timelines


class WriteTimelinesFn(BackgroundWriteFn):
    """``(shard, timelines)`` -> ``timelines/part-SSSSS.parquet``, by user."""

    def __init__(self, output: str) -> None:
        self._output = output

    def process(self, element: ShardedTable) -> Iterator[str]:
        """Write the shard's part (in the background); yield its path."""
        shard, table = element
        path = f"{self._output}/timelines/part-{shard:05d}.parquet"
        table = in_user_order(table)
        self.write(table.cast(TIMELINE_SCHEMA), path, PLAIN_COLUMNS["timelines"])
        yield path


def feature_table_part(output: str, name: str, part: int) -> str:
    """``feature_tables/<name>/part-PPPPP.parquet`` under ``output``."""
    return f"{output}/feature_tables/{name}/part-{part:05d}.parquet"


class WriteFeatureTables(beam.PTransform):  # type: ignore[misc]
    """``feature_tables/<name>/part-PPPPP.parquet`` from ``(name, part, rows)``.

    Each piece is a part of its own, sorted by (entity, event_timestamp) and
    written where it is made: a piece holds whole entities (one shard's), so
    no table is ever gathered to one worker, whose memory then does not grow
    with the input. Applied to one PCollection of pieces or a tuple of them.
    The output is ``(name, path)`` for every part written.
    """

    def __init__(self, output: str) -> None:
        super().__init__()
        self._output = output

    def expand(self, pieces: beam.PCollection | tuple[beam.PCollection, ...]) -> Any:
        """Sort and write each piece."""
        inputs = pieces if isinstance(pieces, tuple) else (pieces,)
        pipeline = inputs[0].pipeline
        write = WriteFeatureTablePartFn(self._output).tuned(pipeline_tuning(pipeline))
        return (
            inputs
            | "AllPieces" >> beam.Flatten().with_output_types(TablePart)
            | "WriteParts" >> beam.ParDo(write)
        )


class WriteFeatureTablePartFn(BackgroundWriteFn):
    """``(table name, part, IPC rows)`` -> that part's file, by (entity, time)."""

    def __init__(self, output: str) -> None:
        self._output = output

    def process(self, element: TablePart) -> Iterator[tuple[str, str]]:
        """Sort by (entity, time), write in the background; yield (name, path)."""
        name, part, rows = element
        spec = FEATURE_TABLES[name]
        table = ipc_to_table(rows)
        # One gather in (entity, time) order; a stable sort keeps the table
        # order of equal keys (profile versions), like the reference.
        order = int_order(
            [
                to_int64(table.column(spec.entity)),
                to_int64(table.column("event_timestamp")),
            ]
        )
        if np.any(order[1:] < order[:-1]):
            table = table.take(pa.array(order))
        path = feature_table_part(self._output, name, part)
        self.write(table.cast(spec.schema), path)
        yield name, path


class WriteMissingTables(beam.PTransform):  # type: ignore[misc]
    """An empty ``part-00000`` for each table of ``names`` that no part was
    written for (no user had an event, say), so that every table exists.

    Applied to the ``(name, path)`` of the parts written (a PCollection or a
    tuple of them); only the names are counted, never the rows.
    """

    def __init__(self, output: str, names: Iterable[str] | None = None) -> None:
        super().__init__()
        self._output = output
        self._names = list(FEATURE_TABLES if names is None else names)

    def expand(self, written: beam.PCollection | tuple[beam.PCollection, ...]) -> Any:
        """Count the parts of each table (one more for the table itself)."""
        inputs = written if isinstance(written, tuple) else (written,)
        pipeline = inputs[0].pipeline
        every_table = pipeline | "EveryTable" >> beam.Create(
            [(name, 0) for name in self._names], reshuffle=False
        )
        parts = [
            paths | f"PartOf{i}" >> beam.Map(lambda e: (e[0], 1))
            for i, paths in enumerate(inputs)
        ]
        write = WriteEmptyTableFn(self._output).tuned(pipeline_tuning(pipeline))
        return (
            (*parts, every_table)
            | "AllParts" >> beam.Flatten()
            | "PartsPerTable" >> beam.CombinePerKey(sum)
            | "WriteEmpty" >> beam.ParDo(write)
        )


class WriteEmptyTableFn(BackgroundWriteFn):
    """``(table name, parts written)`` -> an empty part where there were none."""

    def __init__(self, output: str) -> None:
        self._output = output

    def process(self, element: tuple[str, int]) -> Iterator[str]:
        """Write the empty part; yield its path."""
        name, parts = element
        if parts == 0:
            path = feature_table_part(self._output, name, 0)
            self.write(FEATURE_TABLES[name].schema.empty_table(), path)
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
