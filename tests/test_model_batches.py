"""Random but valid :class:`trainer.data.batch.Batch` es for the model tests.

Test helper (not production code): builds batches that honour the layouts in
:mod:`trainer.data.batch` (one id per sparse feature, equal sequence lengths across
sequence keys, ids inside each registry table, lengths that may be 0).
Examples are built one by one so that a test can reorder them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from features.registry import DENSE_FEATURES, SEQUENCE_FEATURES, SPARSE_FEATURES
from features.vocab import DOMAINS, TRAINING_OBJECTIVES
from trainer.data.batch import SEQUENCE_FEATURE_NAMES, SPARSE_FEATURE_NAMES, Batch


@dataclass(frozen=True)
class Example:
    """One example's raw arrays."""

    sparse: np.ndarray  # (F,)
    sequence: np.ndarray  # (S, L)
    dense: np.ndarray  # (len(DENSE_FEATURES),)
    labels: np.ndarray  # (O,)
    domain: int


def random_examples(lengths: list[int], seed: int = 0) -> list[Example]:
    """One example per history length in ``lengths``."""
    rng = np.random.default_rng(seed)
    examples = []
    for n in lengths:
        sparse = np.array([rng.integers(0, f.num_embeddings) for f in SPARSE_FEATURES])
        sequence = np.stack(
            [rng.integers(0, f.num_embeddings, size=n) for f in SEQUENCE_FEATURES]
        ).reshape(len(SEQUENCE_FEATURES), n)
        dense = np.log1p(rng.poisson(3.0, size=len(DENSE_FEATURES))).astype(np.float32)
        labels = (rng.random(len(TRAINING_OBJECTIVES)) < 0.3).astype(np.float32)
        domain = int(rng.integers(0, len(DOMAINS)))
        examples.append(Example(sparse, sequence, dense, labels, domain))
    return examples


def make_batch(examples: list[Example]) -> Batch:
    """Pack examples into a Batch (KJT values key-major, int32 lengths).

    int32 lengths match what :mod:`trainer.data.inputs` produces.
    """
    b = len(examples)
    sparse_values = np.stack([e.sparse for e in examples], axis=1).reshape(-1)
    seq_lengths = np.array([e.sequence.shape[1] for e in examples], dtype=np.int64)
    seq_values = np.concatenate(
        [
            np.concatenate([e.sequence[s] for e in examples])
            for s in range(len(SEQUENCE_FEATURES))
        ]
    ).astype(np.int64)
    return Batch(
        sparse=KeyedJaggedTensor.from_lengths_sync(
            keys=list(SPARSE_FEATURE_NAMES),
            values=torch.from_numpy(sparse_values.astype(np.int64)),
            lengths=torch.ones(len(SPARSE_FEATURES) * b, dtype=torch.int32),
        ),
        sequence=KeyedJaggedTensor.from_lengths_sync(
            keys=list(SEQUENCE_FEATURE_NAMES),
            values=torch.from_numpy(seq_values),
            lengths=torch.from_numpy(
                np.tile(seq_lengths, len(SEQUENCE_FEATURES)).astype(np.int32)
            ),
        ),
        dense=torch.from_numpy(np.stack([e.dense for e in examples])),
        labels=torch.from_numpy(np.stack([e.labels for e in examples])),
        domain=torch.tensor([e.domain for e in examples], dtype=torch.int64),
    )


def random_batch(lengths: list[int], seed: int = 0) -> Batch:
    """A batch with one example per history length."""
    return make_batch(random_examples(lengths, seed))


def test_random_batch_honours_the_layout() -> None:
    batch = random_batch([3, 0, 4096, 1], seed=1)
    assert batch.size == 4
    assert batch.sparse.keys() == list(SPARSE_FEATURE_NAMES)
    assert torch.all(batch.sparse.lengths() == 1)
    lengths = batch.sequence.lengths().view(len(SEQUENCE_FEATURES), -1)
    assert torch.all(lengths == torch.tensor([3, 0, 4096, 1]))
    for feature in SPARSE_FEATURES:
        ids = batch.sparse[feature.name].values()
        assert 0 <= int(ids.min())
        assert int(ids.max()) < feature.num_embeddings
    for feature in SEQUENCE_FEATURES:
        ids = batch.sequence[feature.name].values()
        assert ids.numel() == 4100
        assert int(ids.max()) < feature.num_embeddings
    assert batch.dense.shape == (4, len(DENSE_FEATURES))
    assert batch.labels.shape == (4, len(TRAINING_OBJECTIVES))
