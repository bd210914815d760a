"""Training data from a feature-job output dir: examples + timelines → Batches.

The feature job (Beam or ``pipelines.reference``) writes, under one dir
(:data:`features.feature_tables.OUTPUT_LAYOUT`)::

    examples/date=YYYY-MM-DD/part-*.parquet   one row per impression
    timelines/part-*.parquet                   one row per user (list columns)

:class:`ExampleDataset` reads both **once** into memory (Arrow), in a fixed
row order (``event_time``, ``example_id``) so that a seed alone decides what a
run sees, whatever order the part files were listed in. Windows are *not*
materialized on disk: each batch's windows are cut out of the shared
timelines by :func:`trainer.inputs.make_batch` (``timeline[:timeline_cut]``,
last ``max_seq_len`` events), which is why the examples stay small.

Shapes: a dataset of ``N`` examples yields ``ceil(N / B)`` :class:`Batch` es
of ``B`` examples (the last one smaller); the layouts are those of
:mod:`trainer.batch` (sparse KJT ``F*B`` ids, sequence KJT ``S*sum(L)`` ids
with ``L[i] = min(timeline_cut[i], max_seq_len)``, dense ``(B, 27)``, labels
``(B, 2)``, domain ``(B,)``).

Building a batch is numpy / Arrow work (gathers and hashing), so
:meth:`ExampleDataset.batches` builds batch ``k + 1`` on a background thread
while the model trains on batch ``k``; numpy and Arrow release the GIL in
their kernels, so the two overlap even in one process.

Time-forward split: :func:`time_forward_split` cuts one output into train
(``event_time < cut``) and eval (``event_time >= cut``) dirs that share the
timelines. Sharing is safe: a window only holds events strictly before its own
example, so an eval example's future is never in a train example's window,
and the eval set sees the train period only as history, as in production.
"""

from __future__ import annotations

import queue
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from features.examples import training_example_schema
from trainer.batch import Batch
from trainer.inputs import make_batch

_DONE = object()


def read_examples(path: Path | str) -> pa.Table:
    """All examples under ``path/examples`` in ``(event_time, example_id)`` order.

    The ``date=`` hive partition column is dropped: it only duplicates
    ``event_time``. Sorting makes the row order independent of file listing
    order (and of how many part files the Beam job wrote).
    """
    dataset = ds.dataset(Path(path) / "examples", format="parquet", partitioning="hive")
    names = [n for n in training_example_schema().names if n in dataset.schema.names]
    table = dataset.to_table(columns=names)
    return table.sort_by([("event_time", "ascending"), ("example_id", "ascending")])


def read_timelines(path: Path | str) -> pa.Table:
    """All timelines under ``path/timelines``, one chunk per column.

    One chunk each, because :func:`features.windows.window_positions` flattens
    the list columns per call: with a single chunk that is a view, not a copy.
    """
    table = ds.dataset(Path(path) / "timelines", format="parquet").to_table()
    return table.combine_chunks()


def event_time_ms(examples: pa.Table) -> np.ndarray:
    """(N,) int64 impression times in epoch ms."""
    column = examples.column("event_time").combine_chunks().cast(pa.int64())
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


class ExampleDataset:
    """The examples and timelines of one feature-job output dir, in memory.

    Args:
        path: the feature job's ``--output`` dir.
        max_seq_len: longest history window L (oldest events dropped).

    Example:
        >>> data = ExampleDataset("out/features", max_seq_len=64)  # doctest: +SKIP
        >>> for batch in data.batches(512, seed=0, epoch=0):       # doctest: +SKIP
        ...     ...
    """

    def __init__(self, path: Path | str, *, max_seq_len: int) -> None:
        self.path = Path(path)
        self.max_seq_len = max_seq_len
        self.examples = read_examples(self.path)
        self.timelines = read_timelines(self.path)

    def __len__(self) -> int:
        return self.examples.num_rows

    def order(self, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
        """Row order of one epoch: a permutation seeded by ``(seed, epoch)``.

        A fresh generator per epoch (not one advanced across epochs) means
        epoch ``e`` has the same order whether or not a run was resumed.
        """
        n = len(self)
        if not shuffle:
            return np.arange(n, dtype=np.int64)
        return np.random.default_rng([seed, epoch]).permutation(n)

    def batch(self, rows: np.ndarray) -> Batch:
        """The :class:`Batch` of the given example rows."""
        examples = self.examples.take(pa.array(rows, pa.int64()))
        return make_batch(examples, self.timelines, max_seq_len=self.max_seq_len)

    def batches(
        self,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        epoch: int = 0,
        max_batches: int | None = None,
        prefetch: int = 2,
        pin_memory: bool = False,
    ) -> Iterator[Batch]:
        """Batches of one epoch, built ``prefetch`` ahead on a background thread.

        Args:
            batch_size: examples per batch (the last batch may be smaller).
            shuffle: permute rows with a generator seeded by ``(seed, epoch)``.
            seed: run seed.
            epoch: epoch index.
            max_batches: stop after this many (``None``: the whole epoch).
            prefetch: batches built ahead (0: build in the caller's thread).
            pin_memory: pin each batch in page-locked host memory where it
                is built (on the prefetch thread), so the trainer's copy to a
                GPU can be non-blocking.
        """
        order = self.order(shuffle=shuffle, seed=seed, epoch=epoch)
        chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        if max_batches is not None:
            chunks = chunks[:max_batches]
        if prefetch <= 0:
            for rows in chunks:
                batch = self.batch(rows)
                yield batch.pin_memory() if pin_memory else batch
            return
        yield from _prefetched(self, chunks, prefetch, pin_memory)


def _prefetched(
    data: ExampleDataset, chunks: list[np.ndarray], depth: int, pin_memory: bool
) -> Iterator[Batch]:
    """Yield ``data.batch(rows)`` for each chunk, built by a daemon thread.

    The bounded queue caps memory at ``depth`` batches ahead; an exception in
    the producer is re-raised in the consumer; stopping early (the consumer
    breaks out) sets ``stop`` so the producer exits instead of blocking.
    """
    out: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for rows in chunks:
                if stop.is_set():
                    return
                batch = data.batch(rows)
                item: object = batch.pin_memory() if pin_memory else batch
                while not stop.is_set():
                    try:
                        out.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as error:
            out.put(error)
            return
        out.put(_DONE)

    thread = threading.Thread(target=produce, name="batch-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = out.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, Batch)
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


def cut_at_fraction(path: Path | str, fraction: float) -> int:
    """The epoch-ms timestamp before which ``fraction`` of the examples lie.

    Used to *choose* a fixed cut once; report the number, then split with it.
    """
    times = np.sort(event_time_ms(read_examples(path)))
    if times.size == 0:
        raise ValueError(f"no examples under {path}")
    return int(times[min(int(fraction * times.size), times.size - 1)])


def time_forward_split(
    source: Path | str, cut_ms: int, train_dir: Path | str, eval_dir: Path | str
) -> tuple[int, int]:
    """Split a feature-job output by impression time into two such dirs.

    ``train_dir`` gets the examples with ``event_time < cut_ms``, ``eval_dir``
    those with ``event_time >= cut_ms``; both get a copy of the whole
    timelines (windows only look strictly before each example, so the shared
    timeline leaks nothing from the future into train, and gives eval its true
    past). Examples are written one file per UTC day, like the feature job.

    Returns:
        ``(train examples, eval examples)``.
    """
    examples = read_examples(source)
    times = pc.cast(examples.column("event_time"), pa.int64())
    before = pc.less(times, pa.scalar(cut_ms, pa.int64()))
    counts = []
    for target, mask in ((train_dir, before), (eval_dir, pc.invert(before))):
        part = examples.filter(mask)
        out = Path(target)
        if out.exists():
            shutil.rmtree(out)
        _write_by_day(part, out / "examples")
        (out / "timelines").mkdir(parents=True)
        for file in sorted((Path(source) / "timelines").glob("*.parquet")):
            shutil.copyfile(file, out / "timelines" / file.name)
        counts.append(part.num_rows)
    return counts[0], counts[1]


def _write_by_day(examples: pa.Table, root: Path) -> None:
    """``root/date=YYYY-MM-DD/part-0.parquet`` per UTC day of ``event_time``."""
    root.mkdir(parents=True, exist_ok=True)
    day = event_time_ms(examples) // 86_400_000
    schema = training_example_schema()
    for d in np.unique(day):
        rows = examples.filter(pa.array(day == d))
        date = np.datetime64(int(d), "D").astype(str)
        (root / f"date={date}").mkdir()
        pq.write_table(rows.cast(schema), root / f"date={date}" / "part-0.parquet")
