"""Arrow training examples (+ timelines or segments) to a
:class:`~trainer.data.batch.Batch`.

The one place where Arrow turns into tensors. Everything is vectorized over
the batch: sparse ids are stacked key-major (the KJT layout), windows come
from :mod:`features.windows` as flat values plus lengths, and numpy arrays
become tensors with ``torch.from_numpy`` (no copy).

Ids and ranges:

- ``user_id``, ``ad_id``, ``advertiser_id``, ``campaign_id`` and
  ``seq_item_id`` are raw ids, folded into their tables
  (:func:`features.model_inputs.feature_ids`, which the scoring service
  uses too);
- every other sparse and sequence value is already an id; one outside
  ``[0, num_embeddings)`` means the producer broke the contract, so it raises
  ``ValueError`` (the Kafka consumer sets such a message aside) instead of
  being clipped into some other row's embedding.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from features.examples import LABEL_COLUMNS
from features.model_inputs import dense_inputs, sequence_ids, sparse_ids
from features.registry import DENSE_FEATURES
from features.windows import SEQUENCE_COLUMNS, Windows, example_windows
from trainer.data.batch import SEQUENCE_FEATURE_NAMES, SPARSE_FEATURE_NAMES, Batch


def _column(table: pa.Table, name: str, dtype: type[np.generic]) -> npt.NDArray[Any]:
    """One column as numpy (zero-copy for a single chunk of the same type)."""
    column = table.column(name)
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if pa.types.is_timestamp(array.type):
        array = array.cast(pa.int64())
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=dtype)


def sparse_kjt(examples: pa.Table) -> KeyedJaggedTensor:
    """The sparse KJT: keys = SPARSE_FEATURE_NAMES, one id per (key, example).

    Args:
        examples: B training examples.

    Returns:
        KJT with F * B values (key-major) and all lengths 1.
    """
    n = examples.num_rows
    columns = {name: _column(examples, name, np.int64) for name in SPARSE_FEATURE_NAMES}
    values = sparse_ids(columns, n)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(SPARSE_FEATURE_NAMES),
        values=torch.from_numpy(values.reshape(-1)),
        lengths=torch.ones(len(SPARSE_FEATURE_NAMES) * n, dtype=torch.int32),
    )


def sequence_kjt(windows: Windows) -> KeyedJaggedTensor:
    """The sequence KJT: keys = SEQUENCE_FEATURE_NAMES, every key lengths L.

    Args:
        windows: the B examples' windows (N events in all).

    Returns:
        KJT with S * N int64 values (key-major) and lengths L tiled S times.
    """
    values = sequence_ids(windows.values, int(windows.offsets[-1]))
    lengths = np.tile(windows.lengths.astype(np.int32), len(SEQUENCE_FEATURE_NAMES))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(SEQUENCE_FEATURE_NAMES),
        values=torch.from_numpy(values.reshape(-1)),
        lengths=torch.from_numpy(lengths),
    )


def materialized_windows(examples: pa.Table) -> Windows:
    """The windows already on examples (``training_example_schema(with_sequences=
    True)``): their ``seq_*`` list columns as flat values and lengths."""
    first = examples.column(SEQUENCE_COLUMNS[0]).combine_chunks()
    offsets = np.asarray(first.offsets.to_numpy(), dtype=np.int64)
    values: dict[str, npt.NDArray[np.int64] | npt.NDArray[np.int32]] = {}
    for name in SEQUENCE_COLUMNS:
        lists = examples.column(name).combine_chunks()
        if not np.array_equal(np.diff(lists.offsets.to_numpy()), np.diff(offsets)):
            raise ValueError(f"{name} disagrees with {SEQUENCE_COLUMNS[0]} in lengths")
        flat = lists.flatten().to_numpy(zero_copy_only=False)
        if name == "seq_item_id":
            values[name] = np.asarray(flat, dtype=np.int64)
        else:
            values[name] = np.asarray(flat, dtype=np.int32)
    return Windows(
        lengths=np.diff(offsets), offsets=offsets - offsets[0], values=values
    )


def make_batch(
    examples: pa.Table, timelines: pa.Table | None, *, max_seq_len: int
) -> Batch:
    """A training batch from B Arrow examples.

    Args:
        examples: training examples (``training_example_schema()``, or with
            sequences when ``timelines`` is None).
        timelines: full timelines or segments covering the examples' windows
            (:func:`features.windows.timeline_segments`); None to use the
            examples' own ``seq_*`` columns.
        max_seq_len: longest window L (ignored with materialized windows).

    Returns:
        The batch (layouts in :mod:`trainer.data.batch`).
    """
    if timelines is None:
        windows = materialized_windows(examples)
    else:
        windows = example_windows(examples, timelines, max_seq_len)
    dense = dense_inputs(
        {f.name: _column(examples, f.name, np.float32) for f in DENSE_FEATURES},
        examples.num_rows,
    )
    labels = np.stack(
        [_column(examples, name, np.float32) for name in LABEL_COLUMNS], axis=1
    )
    domain = _column(examples, "domain", np.int64) - 1
    if domain.size and domain.min() < 0:
        raise ValueError("examples with a missing domain (id 0)")
    return Batch(
        sparse=sparse_kjt(examples),
        sequence=sequence_kjt(windows),
        dense=torch.from_numpy(dense),
        labels=torch.from_numpy(labels),
        domain=torch.from_numpy(domain),
    )
