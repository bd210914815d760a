"""Training data from a feature-job output dir: examples + timelines → Batches.

The feature job (Beam or ``pipelines.core.reference``) writes, under one dir
(:data:`features.feature_tables.OUTPUT_LAYOUT`)::

    examples/date=YYYY-MM-DD/part-*.parquet   one row per impression
    timelines/part-*.parquet                   one row per user (list columns)

:class:`ExampleDataset` reads both **once** into memory (Arrow), in a fixed
row order (``event_time``, ``example_id``) so that a seed alone decides what a
run sees, whatever order the part files were listed in. Windows are *not*
materialized on disk: each batch's windows are cut out of the shared
timelines by :func:`trainer.data.inputs.make_batch` (``timeline[:timeline_cut]``,
last ``max_seq_len`` events), which is why the examples stay small.

Shapes: a dataset of ``N`` examples yields ``ceil(N / B)`` :class:`Batch` es
of ``B`` examples (the last one smaller); the layouts are those of
:mod:`trainer.data.batch` (sparse KJT ``F*B`` ids, sequence KJT ``S*sum(L)`` ids
with ``L[i] = min(timeline_cut[i], max_seq_len)``, dense ``(B, 27)``, labels
``(B, 2)``, domain ``(B,)``).

Building a batch is numpy / Arrow work (gathers and hashing), so
:meth:`ExampleDataset.batches` builds batch ``k + 1`` on a background thread
while the model trains on batch ``k``; numpy and Arrow release the GIL in
their kernels, so the two overlap even in one process.

Reading the files and cutting them into time periods (train / validation /
eval) is :mod:`trainer.data.feature_files`'s (pyarrow only); its functions are
importable from here too.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from features.prefetch import prefetch as prefetch_items
from trainer.data.batch import Batch
from trainer.data.feature_files import (
    cut_at_fraction,
    event_time_ms,
    read_examples,
    read_timelines,
    split_periods,
    time_forward_split,
)
from trainer.data.inputs import make_batch

__all__ = [
    "ExampleDataset",
    "cut_at_fraction",
    "event_time_ms",
    "read_examples",
    "read_timelines",
    "split_periods",
    "time_forward_split",
]


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

    def split_at(self, cut_ms: int) -> tuple[ExampleDataset, ExampleDataset]:
        """The examples before ``cut_ms`` (event time) and those from it,
        as two datasets that share this one's timelines (each example's
        history is where it was: only its rows move)."""
        before = event_time_ms(self.examples) < cut_ms
        return (
            self._with_examples(self.examples.filter(pa.array(before))),
            self._with_examples(self.examples.filter(pa.array(~before))),
        )

    def _with_examples(self, examples: pa.Table) -> ExampleDataset:
        data = copy.copy(self)
        data.examples = examples
        return data

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
        built = (self._built(rows, pin_memory) for rows in chunks)
        if prefetch <= 0:
            yield from built
            return
        yield from prefetch_items(built, prefetch, name="batch-prefetch")

    def _built(self, rows: np.ndarray, pin_memory: bool) -> Batch:
        batch = self.batch(rows)
        return batch.pin_memory() if pin_memory else batch
