"""Every public module: output shapes, and every parameter gets a finite gradient."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from features.registry import DENSE_FEATURES, SEQUENCE_FEATURES, SPARSE_FEATURES
from tests.test_model_batches import random_batch
from trainer.data.batch import Batch
from trainer.models.config import HeadsConfig, InterFormerConfig, PyramidConfig, tiny
from trainer.modules.attention import (
    PMA,
    CrossLayerAttention,
    Gating,
    JaggedCrossAttention,
    JaggedLocalAttention,
    JaggedSelfAttention,
)
from trainer.modules.embeddings import (
    DenseTokens,
    InputAdapter,
    SequenceEmbeddings,
    SparseEmbeddings,
)
from trainer.modules.heads import MultiDomainHeads
from trainer.modules.interformer import (
    InterFormer,
    NonSequenceSummary,
    PersonalizedFFN,
    SequenceArch,
    SequenceSummary,
)
from trainer.modules.pyramid import PyramidEncoder, PyramidLevel, TargetAwareAttention
from trainer.modules.target_match import TargetMatch
from trainer.modules.wukong import (
    FactorizationMachineBlock,
    LinearCompressBlock,
    Wukong,
    WukongLayer,
)
from trainer.ops import JaggedTokens

D = 8
LENGTHS = [3, 0, 9, 1]
OFFSETS = torch.tensor([0, 3, 3, 12, 13])
B, L = 4, 13
CFG = tiny()
BATCH = random_batch([3, 0, 40, 1], seed=5)


def seq() -> torch.Tensor:
    return torch.randn(L, D)


def flatten(out: Any) -> torch.Tensor:
    """Sum every tensor in a (nested) output, for backward."""
    if isinstance(out, torch.Tensor):
        return out.float().sum() if out.is_floating_point() else out.new_zeros(())
    if isinstance(out, tuple | list):
        return sum((flatten(o) for o in out), torch.zeros(()))
    return torch.zeros(())


def shape_of(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return tuple(out.shape)
    if isinstance(out, JaggedTokens):
        return tuple(out.values.shape)
    return tuple(shape_of(o) for o in out)


CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple[Any, ...]], Any]] = {
    "LinearCompressBlock": (
        lambda: LinearCompressBlock(5, 3),
        lambda: (torch.randn(2, 5, D),),
        (2, 3, D),
    ),
    "FactorizationMachineBlock": (
        lambda: FactorizationMachineBlock(5, D, CFG.wukong),
        lambda: (torch.randn(2, 5, D),),
        (2, CFG.wukong.num_fm_tokens, D),
    ),
    "WukongLayer": (
        lambda: WukongLayer(5, D, CFG.wukong),
        lambda: (torch.randn(2, 5, D),),
        (2, 8, D),
    ),
    "Wukong": (
        lambda: Wukong(5, D, CFG.wukong),
        lambda: (torch.randn(2, 5, D),),
        (2, 8, D),
    ),
    "JaggedSelfAttention": (
        lambda: JaggedSelfAttention(D, 2),
        lambda: (seq(), OFFSETS, 9),
        (L, D),
    ),
    "JaggedLocalAttention": (
        lambda: JaggedLocalAttention(D, 2, 3),
        lambda: (seq(), OFFSETS),
        (L, D),
    ),
    "JaggedCrossAttention": (
        lambda: JaggedCrossAttention(D, 2),
        lambda: (torch.randn(B, 2, D), seq(), OFFSETS, 9),
        (B, 2, D),
    ),
    "PMA": (lambda: PMA(D, 3, 2), lambda: (seq(), OFFSETS, 9), (B, 3, D)),
    "Gating": (lambda: Gating(D), lambda: (torch.randn(2, 3, D),), (2, 3, D)),
    "CrossLayerAttention": (
        lambda: CrossLayerAttention(D, 2),
        lambda: (torch.randn(2, 3, D), torch.randn(2, 6, D)),
        (2, 3, D),
    ),
    "TargetAwareAttention": (
        lambda: TargetAwareAttention(D, 2),
        lambda: (torch.randn(B, D), seq(), OFFSETS, 9),
        ((L, D), (B, 1, D)),
    ),
    "PyramidLevel": (
        lambda: PyramidLevel(D, PyramidConfig(ratio=2, num_seeds=2)),
        lambda: (seq(), OFFSETS, 9, torch.randn(B, D)),
        ((2 + 0 + 5 + 1, D), (B, 3, D)),
    ),
    "PyramidEncoder": (
        lambda: PyramidEncoder(D, PyramidConfig(num_levels=2, ratio=2)),
        lambda: (JaggedTokens(seq(), OFFSETS, 9), torch.randn(B, D)),
        ((1 + 0 + 3 + 1, D), (B, 6, D)),
    ),
    "PersonalizedFFN": (
        lambda: PersonalizedFFN(D, 4),
        lambda: (torch.randn(B, 4, D), seq(), OFFSETS, 9),
        (L, D),
    ),
    "NonSequenceSummary": (
        lambda: NonSequenceSummary(5, D, 4),
        lambda: (torch.randn(2, 5, D),),
        (2, 4, D),
    ),
    "SequenceSummary": (
        lambda: SequenceSummary(D, InterFormerConfig(num_cls=1)),
        lambda: (seq() + 0, torch.tensor([0, 3, 4, 12, 13]), 9),
        (B, 1 + 2 + 2, D),
    ),
    "SequenceArch": (
        lambda: SequenceArch(D, InterFormerConfig()),
        lambda: (seq(), OFFSETS, 9, torch.randn(B, 4, D)),
        (L, D),
    ),
    "InterFormer": (
        lambda: InterFormer(5, CFG),
        lambda: (
            torch.randn(B, 5, D),
            JaggedTokens(seq(), OFFSETS, 9),
            torch.randn(B, 2, D),
        ),
        (B, 12, D),
    ),
    "MultiDomainHeads": (
        lambda: MultiDomainHeads(16, HeadsConfig()),
        lambda: (torch.randn(B, 16), torch.tensor([0, 1, 2, 0])),
        (B, 3, 2),
    ),
    "SparseEmbeddings": (
        lambda: SparseEmbeddings(CFG.embedding),
        lambda: (BATCH.sparse,),
        (4, len(SPARSE_FEATURES), D),
    ),
    "SequenceEmbeddings": (
        lambda: SequenceEmbeddings(CFG.embedding),
        lambda: (BATCH.sequence, _candidate_category(BATCH)),
        (44, D),
    ),
    "TargetMatch shared": (
        lambda: TargetMatch(D, shared=True),
        lambda: (
            torch.tensor([3, 5, 3]),
            torch.tensor([1, 2, 3]),
            torch.tensor([4, 4, 4]),
            torch.tensor([3, 0]),
            torch.tensor([0, 3, 3]),
        ),
        (3, D),
    ),
    "DenseTokens": (
        lambda: DenseTokens(CFG.embedding),
        lambda: (torch.randn(B, len(DENSE_FEATURES)),),
        (B, 1, D),
    ),
    "InputAdapter": (
        lambda: InputAdapter(CFG.embedding),
        lambda: (BATCH.sparse, BATCH.dense, BATCH.sequence),
        ((4, 15, D), (4, D), (44, D)),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_shapes_and_gradients(name: str) -> None:
    torch.manual_seed(0)
    make, inputs, expected = CASES[name]
    module = make()
    out = module(*inputs())
    assert shape_of(out) == expected
    flatten(out).backward()
    for pname, param in module.named_parameters():
        assert param.grad is not None, pname
        assert torch.isfinite(param.grad).all(), pname
    assert any(p.grad.abs().sum() > 0 for p in module.parameters())


def test_embedding_tables_come_from_the_registry() -> None:
    uncapped = SparseEmbeddings(
        type(CFG.embedding)(dim=2, max_num_embeddings=None)
    ).ebc.embedding_bag_configs()
    assert [t.num_embeddings for t in uncapped] == [
        f.num_embeddings for f in SPARSE_FEATURES
    ]
    capped = SequenceEmbeddings(CFG.embedding).ec.embedding_configs()
    assert [t.num_embeddings for t in capped] == [
        min(f.num_embeddings, 1_000) for f in SEQUENCE_FEATURES
    ]


def test_capped_ids_are_folded_into_the_table() -> None:
    module = SparseEmbeddings(CFG.embedding)
    folded = module.modulo(BATCH.sparse)
    assert int(folded.values().max()) < 1_000
    small = [f.name for f in SPARSE_FEATURES if f.num_embeddings <= 1_000]
    for name in small:  # tables under the cap see the ids unchanged
        torch.testing.assert_close(folded[name].values(), BATCH.sparse[name].values())


def _candidate_category(batch: Batch) -> torch.Tensor:
    names = [f.name for f in SPARSE_FEATURES]
    ids = batch.sparse.values().view(len(names), -1)
    return ids[names.index("ad_creative_category")]


def test_target_match_embeds_same_category_events_only() -> None:
    match = TargetMatch(D)
    category = torch.tensor([3, 5, 0, 3, 3])
    time_bucket = torch.tensor([4, 4, 4, 4, 9])
    action = torch.tensor([4, 4, 4, 4, 4])
    offsets = torch.tensor([0, 3, 5])
    candidate = torch.tensor([3, 0])  # example 1's candidate has no category
    out = match(category, time_bucket, action, candidate, offsets)
    # Event 0 matches (3 == 3); 1 does not; 2 has no category; example 1's
    # events never match a missing candidate category.
    torch.testing.assert_close(out[1], out[3])
    assert not torch.equal(out[0], out[1])
    torch.testing.assert_close(out[2], out[1])
    assert not torch.equal(out[3], out[4])  # same match bit, other time bucket
    # Without a candidate the module is not applied at all.
    seq = SequenceEmbeddings(CFG.embedding)
    with_match = seq(BATCH.sequence, _candidate_category(BATCH)).values
    assert not torch.equal(seq(BATCH.sequence).values, with_match)


def test_shared_target_match_gives_every_match_one_direction() -> None:
    match = TargetMatch(D, shared=True)
    assert match.same is not None
    with torch.no_grad():
        match.table.weight.zero_()  # leave only the shared match-bit rows
    category = torch.tensor([3, 3, 5, 3])
    time_bucket = torch.tensor([1, 9, 1, 4])
    action = torch.tensor([1, 2, 1, 3])
    out = match(category, time_bucket, action, torch.tensor([3]), torch.tensor([0, 4]))
    # Matches in other time buckets and actions share one embedding...
    torch.testing.assert_close(out[0], out[1])
    torch.testing.assert_close(out[0], out[3])
    # ...which a non-match does not have.
    assert not torch.equal(out[0], out[2])
    torch.testing.assert_close(out[2], match.same.weight[0])


def test_sequence_concat_combine() -> None:
    cfg = dataclasses.replace(CFG.embedding, sequence_combine="concat", max_seq_len=5)
    out = SequenceEmbeddings(cfg)(BATCH.sequence)
    assert out.offsets.tolist() == [0, 3, 3, 8, 9]  # 40 events truncated to 5
    assert out.values.shape == (9, D)
