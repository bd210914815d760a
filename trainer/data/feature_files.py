"""A feature-job output's files: read its examples and timelines, and cut it
into time periods, with pyarrow and numpy only (no torch: ``python -m
trainer.data.split`` runs on this alone).

The layout (:data:`features.feature_tables.OUTPUT_LAYOUT`)::

    examples/date=YYYY-MM-DD/part-*.parquet   one row per impression
    timelines/part-*.parquet                   one row per user (list columns)

Time-forward split: :func:`time_forward_split` cuts one output into train
(``event_time < cut``) and eval (``event_time >= cut``) dirs that share the
timelines; :func:`split_periods` into any number of periods (``python -m
trainer.data.split`` cuts train / validation / eval at UTC days). Sharing is
safe: a window only holds events strictly before its own example, so an
eval example's future is never in a train example's window, and the eval
set sees the train period only as history, as in production.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from features.examples import training_example_schema


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
    those with ``event_time >= cut_ms`` (:func:`split_periods` with one cut).

    Returns:
        ``(train examples, eval examples)``.
    """
    train, evals = split_periods(source, [cut_ms], [train_dir, eval_dir])
    return train, evals


def split_periods(
    source: Path | str,
    cuts_ms: Sequence[int],
    targets: Sequence[Path | str | None],
) -> list[int]:
    """Split a feature-job output at ``cuts_ms`` into ``len(cuts_ms) + 1``
    such dirs, one per time period, oldest first.

    ``targets[i]`` gets the examples with ``cuts_ms[i - 1] <= event_time <
    cuts_ms[i]`` (the first from the beginning, the last to the end); each
    gets a copy of the whole timelines (windows only look strictly before
    each example, so the shared timeline leaks nothing from the future into
    an earlier period, and gives a later one its true past). Examples are
    written one file per UTC day, like the feature job. A target that exists
    is replaced; a None target's period is counted and not written.

    Returns:
        The examples of each period.
    """
    if len(targets) != len(cuts_ms) + 1:
        raise ValueError(f"{len(cuts_ms)} cuts make {len(cuts_ms) + 1} periods")
    if list(cuts_ms) != sorted(cuts_ms):
        raise ValueError(f"cuts out of order: {list(cuts_ms)}")
    examples = read_examples(source)
    times = pc.cast(examples.column("event_time"), pa.int64())
    bounds = [None, *cuts_ms, None]
    counts = []
    for target, start, stop in zip(targets, bounds[:-1], bounds[1:], strict=True):
        mask = pa.array(np.ones(examples.num_rows, dtype=bool))
        if start is not None:
            mask = pc.and_(mask, pc.greater_equal(times, pa.scalar(start, pa.int64())))
        if stop is not None:
            mask = pc.and_(mask, pc.less(times, pa.scalar(stop, pa.int64())))
        part = examples.filter(mask)
        counts.append(part.num_rows)
        if target is None:
            continue
        out = Path(target)
        if out.exists():
            shutil.rmtree(out)
        _write_by_day(part, out / "examples")
        (out / "timelines").mkdir(parents=True)
        for file in sorted((Path(source) / "timelines").glob("*.parquet")):
            shutil.copyfile(file, out / "timelines" / file.name)
    return counts


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
