"""Pyramid-parallel long-sequence encoder (our design; docs/model.md).

No public source defines GEM's "pyramid-parallel structure"; this is the
reconstruction docs/model.md proposes. Each level runs parallel modules over the
**same** jagged tokens:

- (a) causal local-window self-attention (sequence order),
- (b) target-aware attention with the candidate ad embedding as the query:
  a per-token re-weighting ``w_i · L[b] · V x_i`` (``w`` the softmax over the
  example's tokens, so uniform attention is the identity scale) and a
  summary token ``Σ_i w_i V x_i``,
- (c) PMA seed pooling into ``num_seeds`` summary tokens.

The per-token outputs (a, b) are combined by concat + linear with a residual
and LayerNorm, then the level's tokens contract ``T → ceil(T / r)`` by strided
mean pooling aligned to the newest event. Every level contributes its
``1 + num_seeds`` summary tokens; the encoder returns them (B, levels·(1+K), D)
together with the top level's jagged tokens, both of which feed InterFormer.
Nothing pads the batch: all ops are jagged-native.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from trainer.models.config import PyramidConfig
from trainer.modules.attention import (
    PMA,
    CrossAttentionProjections,
    JaggedLocalAttention,
)
from trainer.ops import (
    JaggedTokens,
    Kernel,
    gather_rows,
    jagged_pool,
    jagged_softmax,
    segment_ids,
    segment_sum,
)


class TargetAwareAttention(CrossAttentionProjections):
    """Candidate-ad-as-query attention over the jagged tokens.

    The weights of an example are a softmax over its tokens, so they sum to
    one and the summary is a weighted *mean*.

    Args:
        dim: token width ``D``.
        num_heads: heads ``H``.
        kernel: jagged-op implementation.

    Shapes: target (B, D), values (L, D) jagged → per-token (L, D) and
    summary (B, 1, D). An empty sequence gives a zero summary.

    Example:
        >>> attn = TargetAwareAttention(8, 2)
        >>> tokens, summary = attn(
        ...     torch.randn(3, 8), torch.randn(3, 8), torch.tensor([0, 2, 2, 3]), 2)
        >>> tokens.shape, summary.shape
        (torch.Size([3, 8]), torch.Size([3, 1, 8]))
    """

    def forward(
        self,
        target: torch.Tensor,
        values: torch.Tensor,
        offsets: torch.Tensor,
        max_len: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token re-weighted values and the attention summary."""
        total, dim = values.shape
        seg = segment_ids(offsets, total)
        q = self.q(target).view(-1, self.heads, dim // self.heads)  # (B, H, Dh)
        k, v = self.keys_values(values)
        scores = (k * gather_rows(q, seg)).sum(-1) / math.sqrt(dim // self.heads)
        lengths = (offsets[1:] - offsets[:-1]).to(values.dtype)[seg].unsqueeze(1)
        weights = jagged_softmax(scores, offsets, max_len, self.kernel)
        weighted = weights.unsqueeze(-1) * v  # (L, H, Dh)
        per_token = self.out((weighted * lengths.unsqueeze(-1)).reshape(total, dim))
        summary = segment_sum(weighted.reshape(total, dim), offsets)  # (B, D)
        return per_token, self.out(summary).unsqueeze(1)


class LevelOutput(NamedTuple):
    """What one :class:`PyramidLevel` hands on.

    ``contracted``: the next level's jagged tokens; ``summary``:
    (B, 1 + num_seeds, D).
    """

    contracted: JaggedTokens
    summary: torch.Tensor


class PyramidLevel(nn.Module):
    """One pyramid level: parallel local / target-aware / PMA modules, then contraction.

    Args:
        dim: token width ``D``.
        config: window, heads, seeds, ratio.
        kernel: jagged-op implementation.

    Shapes: values (L, D) jagged, target (B, D) → :class:`LevelOutput` with
    contracted jagged tokens (sum_b ceil(L[b]/r), D) and summary
    (B, 1 + num_seeds, D).

    Example:
        >>> from trainer.models.config import PyramidConfig
        >>> level = PyramidLevel(8, PyramidConfig(ratio=2, num_seeds=2))
        >>> out = level(
        ...     torch.randn(3, 8), torch.tensor([0, 2, 2, 3]), 2, torch.randn(3, 8))
        >>> out.contracted.offsets.tolist(), out.summary.shape
        ([0, 1, 1, 2], torch.Size([3, 3, 8]))
    """

    def __init__(
        self, dim: int, config: PyramidConfig, kernel: Kernel = Kernel.PYTORCH
    ) -> None:
        super().__init__()
        self.ratio = config.ratio
        self.local = JaggedLocalAttention(dim, config.num_heads, config.window, kernel)
        self.target = TargetAwareAttention(dim, config.num_heads, kernel)
        self.pma = PMA(dim, config.num_seeds, config.num_heads, kernel)
        self.combine = nn.Linear(2 * dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(
        self,
        values: torch.Tensor,
        offsets: torch.Tensor,
        max_len: int,
        target: torch.Tensor,
    ) -> LevelOutput:
        """Encode one level."""
        local = self.local(values, offsets)
        aware, target_summary = self.target(target, values, offsets, max_len)
        seeds = self.pma(values, offsets, max_len)
        mixed = self.norm(values + self.combine(torch.cat([local, aware], dim=-1)))
        pooled, pooled_offsets = jagged_pool(mixed, offsets, self.ratio)
        contracted = JaggedTokens(pooled, pooled_offsets, -(-max_len // self.ratio))
        return LevelOutput(contracted, torch.cat([target_summary, seeds], dim=1))


class PyramidOutput(NamedTuple):
    """``tokens``: the top level's jagged tokens; ``summary``: (B, levels·(1+K), D)."""

    tokens: JaggedTokens
    summary: torch.Tensor


class PyramidEncoder(nn.Module):
    """Stack of :class:`PyramidLevel` with token counts ``T, T/r, T/r², …``.

    Args:
        dim: token width ``D``.
        config: levels and per-level settings.
        kernel: jagged-op implementation.

    Shapes: jagged (L, D) + target (B, D) → :class:`PyramidOutput` with
    ``num_summary_tokens = levels · (1 + num_seeds)`` and
    ``ceil(L[b] / r**levels)`` tokens per example.

    Example:
        >>> from trainer.models.config import PyramidConfig
        >>> from trainer.ops import JaggedTokens
        >>> enc = PyramidEncoder(8, PyramidConfig(num_levels=2, ratio=2))
        >>> seq = JaggedTokens(torch.randn(5, 8), torch.tensor([0, 5, 5]), 5)
        >>> out = enc(seq, torch.randn(2, 8))
        >>> out.tokens.offsets.tolist(), out.summary.shape
        ([0, 2, 2], torch.Size([2, 6, 8]))
    """

    def __init__(
        self, dim: int, config: PyramidConfig, kernel: Kernel = Kernel.PYTORCH
    ) -> None:
        super().__init__()
        self.levels = nn.ModuleList(
            PyramidLevel(dim, config, kernel) for _ in range(config.num_levels)
        )
        self.num_summary_tokens = config.num_levels * (1 + config.num_seeds)

    def forward(self, sequence: JaggedTokens, target: torch.Tensor) -> PyramidOutput:
        """Encode the history bottom-up."""
        summaries = []
        for level in self.levels:
            out = level(sequence.values, sequence.offsets, sequence.max_len, target)
            sequence = out.contracted
            summaries.append(out.summary)
        return PyramidOutput(sequence, torch.cat(summaries, dim=1))
