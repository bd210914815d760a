"""How the feature job writes its Parquet outputs, and on which thread.

:func:`parquet_options` are the writer settings of every output file (the
batch job's and the reference's alike, so their files compare byte for byte
in layout); :class:`BackgroundWrites` runs the writes on a thread while the
caller prepares the next part.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

PLAIN_COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    "examples": ("event_time",),
    "timelines": ("event_time",),
    "user_sequence": ("seq_event_time_ms", "seq_item_id"),
}
"""Columns of each output written without dictionary encoding
(:func:`parquet_options`); outputs not named here use it for every column."""


def parquet_options(schema: pa.Schema, plain: Collection[str] = ()) -> dict[str, Any]:
    """``pyarrow.parquet.write_table`` settings for an output of ``schema``.

    Min / max statistics only for flat columns: readers filter on keys and
    times, never on the values inside a list, and the statistics of list
    columns (the timelines' and sequences' values) cost a good part of
    their write time. Dictionary encoding for every column but those named
    in ``plain``: values that seldom repeat (event times, the sequences' item
    keys) overflow the dictionary and fall back to plain pages after paying
    for it.

    Example:
        >>> parquet_options(pa.schema([("a", pa.int64()),
        ...                            ("b", pa.list_(pa.int64()))]), plain=["b"])
        {'write_statistics': ['a'], 'use_dictionary': ['a']}
    """
    flat = [f.name for f in schema if not pa.types.is_nested(f.type)]
    options: dict[str, Any] = {"write_statistics": flat}
    if plain:
        unknown = set(plain) - set(schema.names)
        if unknown:
            raise ValueError(f"no columns {sorted(unknown)} in the schema")
        nested = [f for f in schema if pa.types.is_nested(f.type)]
        if all(pa.types.is_list(f.type) for f in nested):
            options["use_dictionary"] = [
                _parquet_leaf(f) for f in schema if f.name not in plain
            ]
    return options


def _parquet_leaf(field: pa.Field) -> str:
    """The Parquet column path of a flat or list field's values."""
    return f"{field.name}.list.element" if pa.types.is_list(field.type) else field.name


def write_parquet_bytes(table: pa.Table, plain: Collection[str] = ()) -> pa.Buffer:
    """``table`` as the bytes of one Parquet file (:func:`parquet_options`).

    Written to an Arrow buffer, not a Python file object, so the whole write
    runs without the GIL: another thread can write while Python goes on.
    """
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **parquet_options(table.schema, plain))
    return sink.getvalue()


class BackgroundWrites:
    """Write jobs run on a thread (or ``threads`` of them), while the caller
    goes on; on one thread, in submission order.

    A Parquet write (encoding, compression) runs in Arrow's C++ without the
    GIL, so on a machine with a second core it costs the caller almost
    nothing: the caller computes the next part while this thread writes the
    last; with ``threads`` above one, jobs that write independent files run
    side by side, in no set order. At most ``max_pending`` jobs wait (each
    holds its table); a
    further :meth:`submit` blocks until the oldest is done. Owners call
    :meth:`wait` where the writes must be complete (a DoFn: at the end of
    every bundle, so a committed bundle's files exist), and :meth:`close`
    when done (a DoFn: teardown).

    Example:
        >>> done = []
        >>> writes = BackgroundWrites()
        >>> writes.submit(done.append, 1)
        >>> writes.wait(); writes.close(); done
        [1]
    """

    def __init__(self, max_pending: int = 2, threads: int = 1) -> None:
        self._threads = max(1, threads)
        self._max_pending = max(self._threads, max_pending)
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[Future[Any]] = deque()

    def submit(self, job: Callable[..., Any], *args: Any) -> None:
        """Queue ``job(*args)``; errors surface in :meth:`submit` or :meth:`wait`."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="writes")
        while len(self._pending) >= self._max_pending:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(job, *args))

    def wait(self) -> None:
        """Block until every queued job is done; re-raise the first error."""
        while self._pending:
            self._pending.popleft().result()

    def forget(self) -> None:
        """Let the queued jobs finish, dropping their errors (the jobs of a
        failed bundle, before the next one starts)."""
        while self._pending:
            self._pending.popleft().exception()

    def close(self) -> None:
        """Finish the queued jobs (re-raising the first error) and stop the
        thread."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
