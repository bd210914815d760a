"""Arrow examples + timelines to the trainer's Batch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import (
    EmbeddingBagCollection,
    EmbeddingCollection,
)

from benchmarks.generated import generated_reference
from features.examples import LABEL_COLUMNS
from features.registry import (
    DENSE_FEATURES,
    SEQUENCE_FEATURES,
    SPARSE_FEATURES,
    hash_bucket,
)
from features.windows import (
    SEQUENCE_COLUMNS,
    attach_windows,
    example_windows,
    timeline_segments,
)
from pipelines.core.reference import ReferenceOutput
from pipelines.sources.synthetic import GeneratorConfig
from trainer.data.batch import SEQUENCE_FEATURE_NAMES, SPARSE_FEATURE_NAMES, Batch
from trainer.data.inputs import make_batch

MAX_LEN = 32


@pytest.fixture(scope="module")
def reference() -> ReferenceOutput:
    return generated_reference(GeneratorConfig(users=120, ads=30, days=2, seed=5))


@pytest.fixture(scope="module")
def examples(reference: ReferenceOutput) -> pa.Table:
    # A batch mixing long and empty histories.
    return reference.examples.slice(0, 256)


@pytest.fixture(scope="module")
def batch(examples: pa.Table, reference: ReferenceOutput) -> Batch:
    segments = timeline_segments(examples, reference.timelines, MAX_LEN)
    return make_batch(examples, segments, max_seq_len=MAX_LEN)


def test_shapes_and_dtypes(batch: Batch, examples: pa.Table) -> None:
    b = examples.num_rows
    assert batch.size == b
    assert batch.dense.shape == (b, len(DENSE_FEATURES))
    assert batch.dense.dtype == torch.float32
    assert batch.labels.shape == (b, len(LABEL_COLUMNS))
    assert batch.labels.dtype == torch.float32
    assert batch.domain.shape == (b,)
    assert batch.domain.dtype == torch.int64
    assert 0 <= int(batch.domain.min())
    assert int(batch.domain.max()) < 3
    counters = np.stack([examples[f.name].to_numpy() for f in DENSE_FEATURES], axis=1)
    assert np.allclose(batch.dense.numpy(), np.log1p(counters))
    labels = np.stack([examples[n].to_numpy() for n in LABEL_COLUMNS], axis=1)
    assert np.array_equal(batch.labels.numpy(), labels)


def test_sparse_kjt(batch: Batch, examples: pa.Table) -> None:
    kjt = batch.sparse
    assert kjt.keys() == list(SPARSE_FEATURE_NAMES)
    assert torch.all(kjt.lengths() == 1)
    by_key = kjt.to_dict()
    for feature in SPARSE_FEATURES:
        values = by_key[feature.name].values().numpy()
        assert values.min() >= 0
        assert values.max() < feature.num_embeddings
        raw = examples[feature.name].to_numpy()
        if feature.name in ("user_id", "ad_id", "advertiser_id", "campaign_id"):
            raw = hash_bucket(raw, feature.num_embeddings)
        assert np.array_equal(values, raw)


def test_sequence_kjt_round_trips_the_windows(
    batch: Batch, examples: pa.Table, reference: ReferenceOutput
) -> None:
    kjt = batch.sequence
    assert kjt.keys() == list(SEQUENCE_FEATURE_NAMES)
    windows = example_windows(examples, reference.timelines, MAX_LEN)
    cuts = examples["timeline_cut"].to_numpy()
    assert np.array_equal(windows.lengths, np.minimum(cuts, MAX_LEN))
    assert (windows.lengths == 0).any()
    assert (windows.lengths == MAX_LEN).any()
    by_key = kjt.to_dict()
    for feature in SEQUENCE_FEATURES:
        jagged = by_key[feature.name]
        assert np.array_equal(jagged.lengths().numpy(), windows.lengths)
        values = jagged.values().numpy()
        expected = windows.values[feature.name]
        if feature.name == "seq_item_id":
            expected = hash_bucket(expected, feature.num_embeddings)
        assert np.array_equal(values, expected)
        assert values.size == 0 or values.max() < feature.num_embeddings


def test_materialized_windows_give_the_same_batch(
    batch: Batch, examples: pa.Table, reference: ReferenceOutput
) -> None:
    with_sequences = attach_windows(examples, reference.timelines, MAX_LEN)
    again = make_batch(with_sequences, None, max_seq_len=MAX_LEN)
    for name in ("sparse", "sequence"):
        a, b = getattr(batch, name), getattr(again, name)
        assert torch.equal(a.values(), b.values())
        assert torch.equal(a.lengths(), b.lengths())
    assert torch.equal(batch.dense, again.dense)


def test_embedding_collections_from_the_registry_accept_the_kjts(batch: Batch) -> None:
    dim = 4

    def tables(config: type, features: tuple[Any, ...]) -> list[Any]:
        """One table per feature, named as the models name them."""
        return [
            config(
                name=f"t_{f.name}",
                embedding_dim=dim,
                num_embeddings=f.num_embeddings,
                feature_names=[f.name],
            )
            for f in features
        ]

    cpu = torch.device("cpu")
    ebc = EmbeddingBagCollection(
        tables=tables(EmbeddingBagConfig, SPARSE_FEATURES), device=cpu
    )
    pooled = ebc(batch.sparse)
    assert pooled.values().shape == (batch.size, dim * len(SPARSE_FEATURES))
    ec = EmbeddingCollection(
        tables=tables(EmbeddingConfig, SEQUENCE_FEATURES), device=cpu
    )
    sequences = ec(batch.sequence)
    total = int(batch.sequence.lengths().sum()) // len(SEQUENCE_FEATURES)
    for name in SEQUENCE_COLUMNS:
        assert sequences[name].values().shape == (total, dim)


def test_out_of_range_ids_are_rejected(
    examples: pa.Table, reference: ReferenceOutput
) -> None:
    index = examples.schema.get_field_index("surface")
    broken = examples.set_column(
        index,
        examples.schema.field(index),
        pc.add(examples["surface"], 100),
    )
    with pytest.raises(ValueError, match="surface"):
        make_batch(broken, reference.timelines, max_seq_len=MAX_LEN)
