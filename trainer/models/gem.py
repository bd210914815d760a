"""The GEM model: input adapter → pyramid encoder → InterFormer(Wukong) → PLE heads."""

from __future__ import annotations

import torch
from torch import nn

from trainer.data.batch import Batch
from trainer.models.config import ModelConfig
from trainer.modules.embeddings import InputAdapter
from trainer.modules.heads import MultiDomainHeads
from trainer.modules.interformer import InterFormer
from trainer.modules.pyramid import PyramidEncoder
from trainer.ops import JaggedTokens, jagged_truncate_last


class GEM(nn.Module):
    """GEM-style ranking model; returns logits, the loss lives in ``GEMTrain``.

    Data flow, ``n = num_dense_tokens + F`` tokens of width ``D``::

        sparse KJT ─ EBC ─┐
        dense ─ MLP ──────┴─ X (B, n, D) ───────────────┐
        sequence KJT ─ EC ─ sum ─ S jagged (L, D)         │
           └─ pyramid(S, target ad) ─ tokens + summary ─ InterFormer ─ [X_sum ∥ S_sum]
                                                           └─ PLE heads ─ (B, Dm, O)

    Ablations are config flags: ``use_sequences=False`` (no sequence KJT at
    all), ``interformer.interleave=False`` ("sep" mode),
    ``pyramid.enabled=False`` (InterFormer on the newest
    ``interformer.no_pyramid_max_len`` raw events).

    Args:
        config: the model config.

    Shapes: ``forward(batch)`` → logits (B, NUM_DOMAINS, NUM_OBJECTIVES).

    Example:
        >>> from trainer.models.config import tiny
        >>> model = GEM(tiny())
        >>> model.trunk.num_out_tokens
        12
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        dim = config.embedding.dim
        use_pyramid = config.use_sequences and config.pyramid.enabled
        self.inputs = InputAdapter(config.embedding, config.use_sequences, use_pyramid)
        self.pyramid = (
            PyramidEncoder(dim, config.pyramid, config.kernel) if use_pyramid else None
        )
        self.no_pyramid_max_len = config.interformer.no_pyramid_max_len
        self.trunk = InterFormer(self.inputs.num_tokens, config)
        self.heads = MultiDomainHeads(self.trunk.num_out_tokens * dim, config.heads)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits (B, NUM_DOMAINS, NUM_OBJECTIVES)."""
        inputs = self.inputs(batch.sparse, batch.dense, batch.sequence)
        sequence, prefix = inputs.sequence, None
        if sequence is not None and self.pyramid is not None:
            assert inputs.target is not None
            sequence, prefix = self.pyramid(sequence, inputs.target)
        elif sequence is not None:
            k = min(self.no_pyramid_max_len, sequence.max_len)
            values, offsets = jagged_truncate_last(sequence.values, sequence.offsets, k)
            sequence = JaggedTokens(values, offsets, k)
        h = self.trunk(inputs.tokens, sequence, prefix)
        return self.heads(h.flatten(1), batch.domain)
