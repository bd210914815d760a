"""Attention blocks over jagged sequences, rotary positions and gating.

All jagged inputs follow :mod:`trainer.ops.jagged`: ``values`` (L, D),
``offsets`` (B + 1,), ``max_len`` a static bound on any sequence's length.
"""

from __future__ import annotations

import torch
from torch import nn

from trainer.ops import (
    Kernel,
    jagged_cross_attention,
    jagged_local_attention,
    jagged_self_attention,
    positions,
)


def rotary(x: torch.Tensor, pos: torch.Tensor, base: float = 10_000.0) -> torch.Tensor:
    """Rotary position embedding (RoPE, rotate-half) of (L, ..., Dh) at positions (L,).

    ``Dh`` must be even. Every vector of a row gets that row's rotation, so
    queries and keys stacked as (L, 2, H, Dh) share one cos/sin table (the
    trigonometry is a visible share of a CPU forward at 128 events).

    Example:
        >>> x = torch.ones(2, 1, 4)
        >>> torch.allclose(rotary(x, torch.tensor([0, 0])), x)
        True
    """
    half = x.shape[-1] // 2
    freq = base ** (-torch.arange(half, device=x.device, dtype=x.dtype) / half)
    angle = pos.to(x.dtype).unsqueeze(-1) * freq  # (L, Dh/2)
    angle = angle.view(angle.shape[0], *([1] * (x.dim() - 2)), half)
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def rotary_qkv(
    qkv: nn.Linear, heads: int, values: torch.Tensor, offsets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries, keys and values (L, H, Dh) of jagged ``values`` (L, D) through
    the fused projection ``qkv``, queries and keys rotated by position.

    Example:
        >>> q, k, v = rotary_qkv(nn.Linear(8, 24), 2, torch.randn(3, 8),
        ...                      torch.tensor([0, 2, 3]))
        >>> q.shape, v.shape
        (torch.Size([3, 2, 4]), torch.Size([3, 2, 4]))
    """
    total, dim = values.shape
    projected = qkv(values).view(total, 3, heads, dim // heads)
    q, k = rotary(projected[:, :2], positions(offsets, total)).unbind(1)
    return q, k, projected[:, 2]


class JaggedSelfAttention(nn.Module):
    """Multi-head bidirectional self-attention with RoPE within each sequence.

    Args:
        dim: token width ``D`` (divisible by ``num_heads``; ``D / H`` even).
        num_heads: heads ``H``.
        kernel: jagged-op implementation.

    Shapes: (L, D) jagged → (L, D). Pads inside the attention op only.

    Example:
        >>> attn = JaggedSelfAttention(8, 2)
        >>> attn(torch.randn(3, 8), torch.tensor([0, 2, 2, 3]), 2).shape
        torch.Size([3, 8])
    """

    def __init__(
        self, dim: int, num_heads: int, kernel: Kernel = Kernel.PYTORCH
    ) -> None:
        super().__init__()
        self.heads = num_heads
        self.kernel = kernel
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(
        self, values: torch.Tensor, offsets: torch.Tensor, max_len: int
    ) -> torch.Tensor:
        """Attend."""
        q, k, v = rotary_qkv(self.qkv, self.heads, values, offsets)
        out = jagged_self_attention(q, k, v, offsets, max_len, self.kernel)
        return self.out(out.reshape(values.shape))


class JaggedLocalAttention(nn.Module):
    """Causal sliding-window multi-head attention with RoPE within each sequence.

    Args:
        dim: token width ``D``.
        num_heads: heads ``H``.
        window: tokens each token sees (itself included).
        kernel: jagged-op implementation.

    Shapes: (L, D) jagged → (L, D); cost O(L · window), no padding.

    Example:
        >>> attn = JaggedLocalAttention(8, 2, window=2)
        >>> attn(torch.randn(3, 8), torch.tensor([0, 2, 2, 3])).shape
        torch.Size([3, 8])
    """

    def __init__(
        self, dim: int, num_heads: int, window: int, kernel: Kernel = Kernel.PYTORCH
    ) -> None:
        super().__init__()
        self.heads = num_heads
        self.window = window
        self.kernel = kernel
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Attend within the window."""
        q, k, v = rotary_qkv(self.qkv, self.heads, values, offsets)
        out = jagged_local_attention(q, k, v, offsets, self.window, self.kernel)
        return self.out(out.reshape(values.shape))


class CrossAttentionProjections(nn.Module):
    """The projections of a multi-head attention whose queries are not its tokens.

    ``q`` maps the queries, a fused ``kv`` the jagged tokens, ``out`` the
    result; subclasses attend with them (:class:`JaggedCrossAttention`,
    :class:`trainer.modules.pyramid.TargetAwareAttention`).

    Args:
        dim: width ``D`` of queries and tokens.
        num_heads: heads ``H``.
        kernel: jagged-op implementation.

    Shapes: :meth:`keys_values` of tokens (L, D) → keys, values (L, H, D / H).

    Example:
        >>> projections = CrossAttentionProjections(8, 2)
        >>> [t.shape for t in projections.keys_values(torch.randn(3, 8))]
        [torch.Size([3, 2, 4]), torch.Size([3, 2, 4])]
    """

    def __init__(
        self, dim: int, num_heads: int, kernel: Kernel = Kernel.PYTORCH
    ) -> None:
        super().__init__()
        self.heads = num_heads
        self.kernel = kernel
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)

    def keys_values(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (L, H, D / H) of the jagged tokens (L, D)."""
        total, dim = values.shape
        k, v = self.kv(values).view(total, 2, self.heads, dim // self.heads).unbind(1)
        return k, v


class JaggedCrossAttention(CrossAttentionProjections):
    """Dense queries attend to their own example's jagged tokens (multi-head).

    Args:
        dim: width ``D`` of queries and tokens.
        num_heads: heads ``H``.
        kernel: jagged-op implementation.

    Shapes: query (B, Q, D), values (L, D) jagged → (B, Q, D). An empty
    sequence yields the output projection's bias.

    Example:
        >>> attn = JaggedCrossAttention(8, 2)
        >>> offsets = torch.tensor([0, 2, 2, 3])
        >>> attn(torch.randn(3, 1, 8), torch.randn(3, 8), offsets, 2).shape
        torch.Size([3, 1, 8])
    """

    def forward(
        self,
        query: torch.Tensor,
        values: torch.Tensor,
        offsets: torch.Tensor,
        max_len: int,
    ) -> torch.Tensor:
        """Attend."""
        batch, nq, dim = query.shape
        q = self.q(query).view(batch, nq, self.heads, -1)
        k, v = self.keys_values(values)
        out = jagged_cross_attention(q, k, v, offsets, max_len, self.kernel)
        return self.out(out.reshape(batch, nq, dim))


class PMA(nn.Module):
    """Pooling by multi-head attention: learnable seeds attend to the sequence.

    Args:
        dim: width ``D``.
        num_seeds: seed queries ``K``.
        num_heads: heads ``H``.
        kernel: jagged-op implementation.

    Shapes: (L, D) jagged → (B, K, D).

    Example:
        >>> pma = PMA(8, num_seeds=2, num_heads=2)
        >>> pma(torch.randn(3, 8), torch.tensor([0, 2, 2, 3]), 2).shape
        torch.Size([3, 2, 8])
    """

    def __init__(
        self, dim: int, num_seeds: int, num_heads: int, kernel: Kernel = Kernel.PYTORCH
    ) -> None:
        super().__init__()
        self.seeds = nn.Parameter(torch.randn(num_seeds, dim) * dim**-0.5)
        self.attention = JaggedCrossAttention(dim, num_heads, kernel)

    def forward(
        self, values: torch.Tensor, offsets: torch.Tensor, max_len: int
    ) -> torch.Tensor:
        """Pool into ``K`` tokens."""
        batch = offsets.numel() - 1
        query = self.seeds.unsqueeze(0).expand(batch, -1, -1)
        return self.attention(query, values, offsets, max_len)


class Gating(nn.Module):
    """Self-gating ``X ⊙ σ(MLP(X))`` (InterFormer Cross arch; docs/model.md).

    Args:
        dim: token width ``D``.

    Shapes: (..., D) → (..., D).

    Example:
        >>> Gating(8)(torch.randn(2, 3, 8)).shape
        torch.Size([2, 3, 8])
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Gate every token."""
        return x * torch.sigmoid(self.gate(x))


class CrossLayerAttention(nn.Module):
    """Cross-layer attention connection (our design, docs/model.md).

    ``X_i ← X_i + MHA(LN(X_i), cat(X_0 … X_{i-1}))``: the input of a layer
    attends over the stored outputs of all earlier layers.

    Args:
        dim: token width ``D``.
        num_heads: heads.

    Shapes: x (B, n, D), memory (B, m, D) → (B, n, D).

    Example:
        >>> cla = CrossLayerAttention(8, 2)
        >>> cla(torch.randn(2, 3, 8), torch.randn(2, 5, 8)).shape
        torch.Size([2, 3, 8])
    """

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, num_heads, batch_first=True)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """Attend to earlier layers, residually."""
        out, _ = self.attention(self.norm(x), memory, memory, need_weights=False)
        return x + out
