"""InterFormer (Zeng et al., CIKM'25; docs/model.md) with a Wukong interaction arch.

Per layer ``l`` (the paper's Algorithm A.1, bidirectional "int" mode)::

    X_sum = Gating(LCE(X))                          (B, n_cls, D)
    S_sum = Gating([S_CLS ∥ PMA(S) ∥ S_recent])     (B, n_cls + n_pma + n_recent, D)
    X     = Wukong([X ∥ S_sum])                     (B, n_F + n_L, D)
    S     = S + MHA_RoPE(LN(S + PFFN(X_sum, LN(S))))   jagged (L, D)

with ``S`` starting as ``[X_sum ∥ prefix ∥ events]``: the CLS tokens, then the
pyramid's summary tokens, then the (contracted) event tokens. The output is
the final ``[X_sum ∥ S_sum]``. PFFN follows the appendix, ``W_b = X_sum[b]ᵀ W``
(D × D per example), computed without materialising ``W_b``:
``S_i W_bᵀ = (S_i Wᵀ) X_sum[b]`` — a (L, n_cls) × (B, n_cls, D) jagged-dense bmm.

Our choices (not the paper's): pre-LN residuals around PFFN and MHA;
``interleave=False`` is the paper's "sep" ablation (no CLS prefix, no S_sum
into the interaction arch, a plain per-token FFN instead of PFFN).
"""

from __future__ import annotations

import torch
from torch import nn

from trainer.models.config import InterFormerConfig, ModelConfig
from trainer.modules.attention import PMA, Gating, JaggedSelfAttention
from trainer.modules.mlp import mlp
from trainer.modules.wukong import LinearCompressBlock, Wukong
from trainer.ops import (
    JaggedTokens,
    Kernel,
    jagged_dense_bmm,
    jagged_first_k,
    jagged_last_k,
    jagged_prepend,
)


class PersonalizedFFN(nn.Module):
    """PFFN: ``S_i ← S_i (X_sum[b]ᵀ W)ᵀ`` per example (InterFormer appendix).

    Args:
        dim: token width ``D``.
        num_summary: non-sequence summary tokens ``n_sum``.
        kernel: jagged-op implementation.

    Shapes: x_sum (B, n_sum, D), values (L, D) jagged → (L, D).

    Example:
        >>> pffn = PersonalizedFFN(8, 2)
        >>> offsets = torch.tensor([0, 1, 1, 4])
        >>> pffn(torch.randn(3, 2, 8), torch.randn(4, 8), offsets, 3).shape
        torch.Size([4, 8])
    """

    def __init__(
        self, dim: int, num_summary: int, kernel: Kernel = Kernel.PYTORCH
    ) -> None:
        super().__init__()
        self.kernel = kernel
        self.weight = nn.Parameter(torch.randn(num_summary, dim) * dim**-0.5)

    def forward(
        self,
        x_sum: torch.Tensor,
        values: torch.Tensor,
        offsets: torch.Tensor,
        max_len: int,
    ) -> torch.Tensor:
        """Apply the per-example D × D map."""
        low_rank = values @ self.weight.t()  # (L, n_sum)
        return jagged_dense_bmm(low_rank, offsets, x_sum, max_len, self.kernel)


class NonSequenceSummary(nn.Module):
    """Cross arch, non-sequence side: ``X_sum = Gating(LCE(X))``.

    Args:
        num_tokens: non-sequence tokens ``n`` this layer sees.
        dim: token width ``D``.
        num_summary: summary tokens ``n_cls``.

    Shapes: (B, n, D) → (B, n_cls, D).

    Example:
        >>> NonSequenceSummary(5, 8, 4)(torch.randn(2, 5, 8)).shape
        torch.Size([2, 4, 8])
    """

    def __init__(self, num_tokens: int, dim: int, num_summary: int) -> None:
        super().__init__()
        self.lce = LinearCompressBlock(num_tokens, num_summary)
        self.gate = Gating(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Summarise the non-sequence tokens."""
        return self.gate(self.lce(x))


class SequenceSummary(nn.Module):
    """Cross arch, sequence side: ``S_sum = Gating([S_CLS ∥ PMA(S) ∥ S_recent])``.

    Args:
        dim: token width ``D``.
        config: ``num_cls``, ``num_pma``, ``num_recent``, ``num_heads``.
        num_front: leading tokens read out as they are (the CLS tokens when
            they were prepended, with interleaving); ``None``: ``num_cls``.
        kernel: jagged-op implementation.

    Shapes: jagged (L, D) → (B, num_front + n_pma + n_recent, D). Sequences
    shorter than ``num_recent`` give zero "recent" tokens.

    Example:
        >>> from trainer.models.config import InterFormerConfig
        >>> summary = SequenceSummary(8, InterFormerConfig())
        >>> summary(torch.randn(9, 8), torch.tensor([0, 4, 9]), 5).shape
        torch.Size([2, 8, 8])
    """

    def __init__(
        self,
        dim: int,
        config: InterFormerConfig,
        num_front: int | None = None,
        kernel: Kernel = Kernel.PYTORCH,
    ) -> None:
        super().__init__()
        self.num_front = config.num_cls if num_front is None else num_front
        self.num_recent = config.num_recent
        self.pma = PMA(dim, config.num_pma, config.num_heads, kernel)
        self.gate = Gating(dim)

    def forward(
        self, values: torch.Tensor, offsets: torch.Tensor, max_len: int
    ) -> torch.Tensor:
        """Summarise the sequence."""
        parts = []
        if self.num_front:
            parts.append(jagged_first_k(values, offsets, self.num_front))
        parts.append(self.pma(values, offsets, max_len))
        parts.append(jagged_last_k(values, offsets, self.num_recent)[0])
        return self.gate(torch.cat(parts, dim=1))


class SequenceArch(nn.Module):
    """InterFormer Sequence arch: PFFN (or FFN) then RoPE MHA, pre-LN residuals.

    Args:
        dim: token width ``D``.
        config: heads, ``num_cls``, ``interleave``.
        kernel: jagged-op implementation.

    Shapes: values (L, D) jagged, x_sum (B, n_cls, D) → (L, D).

    Example:
        >>> from trainer.models.config import InterFormerConfig
        >>> arch = SequenceArch(8, InterFormerConfig(num_cls=2))
        >>> offsets = torch.tensor([0, 1, 4])
        >>> arch(torch.randn(4, 8), offsets, 3, torch.randn(2, 2, 8)).shape
        torch.Size([4, 8])
    """

    def __init__(
        self, dim: int, config: InterFormerConfig, kernel: Kernel = Kernel.PYTORCH
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.pffn = (
            PersonalizedFFN(dim, config.num_cls, kernel) if config.interleave else None
        )
        # "sep" has this FFN in place of the PFFN.
        self.ffn = (
            None if config.interleave else mlp(dim, (dim, dim), last_activation=False)
        )
        self.attention = JaggedSelfAttention(dim, config.num_heads, kernel)

    def forward(
        self,
        values: torch.Tensor,
        offsets: torch.Tensor,
        max_len: int,
        x_sum: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One sequence layer."""
        normed = self.norm1(values)
        if self.pffn is not None and x_sum is not None:
            values = values + self.pffn(x_sum, normed, offsets, max_len)
        elif self.ffn is not None:
            values = values + self.ffn(normed)
        return values + self.attention(self.norm2(values), offsets, max_len)


class InterFormer(nn.Module):
    """The interleaving trunk: ``L`` × (Cross → Interaction ∥ Sequence) + final Cross.

    Without interleaving ("sep") or without sequences the two arches run
    separately and only the final summaries meet.

    Args:
        num_tokens: non-sequence input tokens ``n`` (dense + sparse).
        config: the model config (``embedding.dim``, ``wukong``,
            ``interformer``, ``use_sequences``, ``kernel``).

    Shapes: tokens (B, n, D), sequence jagged (L, D), prefix (B, P, D) →
    (B, ``num_out_tokens``, D), the final ``[X_sum ∥ S_sum]`` (``X_sum`` only
    without sequences).

    Example:
        >>> from trainer.models.config import tiny
        >>> from trainer.ops import JaggedTokens
        >>> trunk = InterFormer(5, tiny())
        >>> seq = JaggedTokens(torch.randn(3, 8), torch.tensor([0, 3, 3]), 3)
        >>> trunk(torch.randn(2, 5, 8), seq).shape
        torch.Size([2, 12, 8])
    """

    def __init__(self, num_tokens: int, config: ModelConfig) -> None:
        super().__init__()
        dim, icfg, kernel = config.embedding.dim, config.interformer, config.kernel
        self.interleave = icfg.interleave and config.use_sequences
        n_x = config.wukong.num_fm_tokens + config.wukong.num_lc_tokens
        inputs = [num_tokens] + [n_x] * icfg.num_layers
        # Tokens in front of the events that the sequence summary reads out.
        num_front = icfg.num_cls if self.interleave else 0
        n_s_sum = num_front + icfg.num_pma + icfg.num_recent
        extra = n_s_sum if self.interleave else 0
        self.interaction = nn.ModuleList(
            Wukong(n + extra, dim, config.wukong) for n in inputs[:-1]
        )
        # Interleaving needs a summary before every layer and after the last;
        # otherwise only the final ones.
        summarised = inputs if self.interleave else inputs[-1:]
        self.x_summary = nn.ModuleList(
            NonSequenceSummary(n, dim, icfg.num_cls) for n in summarised
        )
        self.s_summary = nn.ModuleList(
            SequenceSummary(dim, icfg, num_front, kernel)
            for _ in (summarised if config.use_sequences else ())
        )
        self.sequence = nn.ModuleList(
            SequenceArch(dim, icfg, kernel)
            for _ in range(icfg.num_layers if config.use_sequences else 0)
        )
        self.num_out_tokens = icfg.num_cls + (n_s_sum if config.use_sequences else 0)

    def forward(
        self,
        tokens: torch.Tensor,
        sequence: JaggedTokens | None = None,
        prefix: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the trunk."""
        x = tokens
        use_sequence = sequence is not None and len(self.sequence) > 0
        x_sum = self.x_summary[0](x) if self.interleave else None
        if use_sequence:
            values, offsets, max_len = sequence
            front = [t for t in (x_sum, prefix) if t is not None]
            if front:
                head = torch.cat(front, dim=1)
                values, offsets = jagged_prepend(head, values, offsets)
                max_len += head.shape[1]
        if not self.interleave:
            for interaction in self.interaction:
                x = interaction(x)
            out = [self.x_summary[-1](x)]
            if use_sequence:
                for layer in self.sequence:
                    values = layer(values, offsets, max_len)
                out.append(self.s_summary[-1](values, offsets, max_len))
            return torch.cat(out, dim=1)
        for i, interaction in enumerate(self.interaction):
            s_sum = self.s_summary[i](values, offsets, max_len)
            x = interaction(torch.cat([x, s_sum], dim=1))
            values = self.sequence[i](values, offsets, max_len, x_sum)
            x_sum = self.x_summary[i + 1](x)
        s_sum = self.s_summary[-1](values, offsets, max_len)
        return torch.cat([x_sum, s_sum], dim=1)
