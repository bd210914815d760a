"""DCNv2 baseline (Wang et al. 2021) from torchrec's cross nets, same Batch.

Inputs as in :mod:`trainer.models.dlrm` (sparse sum-pooled, sequences
mean-pooled, dense projected to one ``D`` vector), flattened to
``x0 (B, (1 + F + S)·D)``, then the *stacked* structure: cross network
(``LowRankCrossNet`` when ``baseline.low_rank`` is set, else full-rank
``CrossNet``) → deep MLP → ``NUM_DOMAINS × NUM_OBJECTIVES`` logits.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.modules.crossnet import CrossNet, LowRankCrossNet
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from features.registry import DENSE_FEATURES, SEQUENCE_FEATURES, SPARSE_FEATURES
from trainer.data.batch import Batch
from trainer.models.config import ModelConfig
from trainer.modules.embeddings import MergedIds, pooled_tables
from trainer.modules.heads import NUM_DOMAINS, NUM_OBJECTIVES
from trainer.modules.mlp import mlp


class DCNv2(nn.Module):
    """Stacked DCNv2 with one logit per (domain, objective).

    Args:
        config: ``embedding`` (dim, cap) and ``baseline`` (cross layers, low
            rank, deep widths in ``over_arch``).

    Shapes: ``forward(batch)`` → logits (B, NUM_DOMAINS, NUM_OBJECTIVES).

    Example:
        >>> from trainer.models.config import tiny
        >>> type(DCNv2(tiny()).cross).__name__
        'LowRankCrossNet'
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        dim = config.embedding.dim
        base = config.baseline
        self.merge = MergedIds(config.embedding)
        self.ebc = EmbeddingBagCollection(
            tables=pooled_tables(dim, config.embedding.max_num_embeddings)
        )
        self.dense = nn.Linear(len(DENSE_FEATURES), dim)
        width = (1 + len(SPARSE_FEATURES) + len(SEQUENCE_FEATURES)) * dim
        self.cross: nn.Module = (
            LowRankCrossNet(width, base.cross_layers, base.low_rank)
            if base.low_rank is not None
            else CrossNet(width, base.cross_layers)
        )
        self.deep = mlp(width, (*base.over_arch, NUM_DOMAINS * NUM_OBJECTIVES), False)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits (B, NUM_DOMAINS, NUM_OBJECTIVES)."""
        pooled = self.ebc(self.merge(batch.sparse, batch.sequence)).values()
        x0 = torch.cat([self.dense(batch.dense), pooled], dim=1)
        return self.deep(self.cross(x0)).view(-1, NUM_DOMAINS, NUM_OBJECTIVES)
