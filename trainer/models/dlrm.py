"""DLRM baseline: torchrec's ``DLRM`` on the same :class:`trainer.data.batch.Batch`.

Sequences are **mean-pooled** over the whole history (one vector per sequence
feature, through ``PoolingType.MEAN`` tables in the same
``EmbeddingBagCollection``), then interact like any sparse feature. The over
arch ends in ``NUM_DOMAINS × NUM_OBJECTIVES`` logits (a shared-bottom
multi-domain head), trained with the same domain-masked loss as GEM.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.models.dlrm import DLRM
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from features.registry import DENSE_FEATURES
from trainer.data.batch import Batch
from trainer.models.config import ModelConfig
from trainer.modules.embeddings import MergedIds, pooled_tables
from trainer.modules.heads import NUM_DOMAINS, NUM_OBJECTIVES


class DLRMBaseline(nn.Module):
    """torchrec ``DLRM`` with mean-pooled sequences and one logit per task.

    Args:
        config: ``embedding`` (dim, cap) and ``baseline`` (dense / over arch);
            ``baseline.dense_arch[-1]`` must equal ``embedding.dim``.

    Shapes: ``forward(batch)`` → logits (B, NUM_DOMAINS, NUM_OBJECTIVES).

    Example:
        >>> from trainer.models.config import tiny
        >>> model = DLRMBaseline(tiny())
        >>> type(model.dlrm).__name__
        'DLRM'
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        dim = config.embedding.dim
        self.merge = MergedIds(config.embedding)
        ebc = EmbeddingBagCollection(
            tables=pooled_tables(dim, config.embedding.max_num_embeddings)
        )
        self.dlrm = DLRM(
            embedding_bag_collection=ebc,
            dense_in_features=len(DENSE_FEATURES),
            dense_arch_layer_sizes=list(config.baseline.dense_arch),
            over_arch_layer_sizes=[
                *config.baseline.over_arch,
                NUM_DOMAINS * NUM_OBJECTIVES,
            ],
        )

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits (B, NUM_DOMAINS, NUM_OBJECTIVES)."""
        ids = self.merge(batch.sparse, batch.sequence)
        return self.dlrm(batch.dense, ids).view(-1, NUM_DOMAINS, NUM_OBJECTIVES)
