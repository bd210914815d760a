"""Wukong interaction stack (Zhang et al., ICML'24; docs/model.md).

``X_{i+1} = LN(concat(FMB_i(X_i), LCB_i(X_i)) + X_i)`` with the optimized FM
``FM(X) = X (Xᵀ Y)``, plus our optional cross-layer attention (docs/model.md).
"""

from __future__ import annotations

import torch
from torch import nn

from trainer.models.config import WukongConfig
from trainer.modules.attention import CrossLayerAttention
from trainer.modules.mlp import mlp


class LinearCompressBlock(nn.Module):
    """LCB: ``W_L X`` recombines embeddings linearly, ``n → n_out`` tokens.

    Args:
        num_tokens: input tokens ``n``.
        num_out: output tokens ``n_L``.

    Shapes: (B, n, D) → (B, n_L, D).

    Example:
        >>> LinearCompressBlock(5, 3)(torch.randn(2, 5, 8)).shape
        torch.Size([2, 3, 8])
    """

    def __init__(self, num_tokens: int, num_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_out, num_tokens) * num_tokens**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Compress tokens."""
        return torch.einsum("mn,bnd->bmd", self.weight, x)


class FactorizationMachineBlock(nn.Module):
    """FMB: ``reshape(MLP(LN(flatten(X (Xᵀ Y)))))`` with a learnable ``Y`` (n × k).

    Computing ``X (Xᵀ Y)`` costs O(n k D) instead of O(n² D) (Wukong §3.4).

    Args:
        num_tokens: input tokens ``n``.
        dim: token width ``D``.
        config: ``fm_rank`` k, ``num_fm_tokens`` n_F, ``mlp_dims``.

    Shapes: (B, n, D) → (B, n_F, D).

    Example:
        >>> from trainer.models.config import WukongConfig
        >>> fmb = FactorizationMachineBlock(5, 8, WukongConfig(num_fm_tokens=3))
        >>> fmb(torch.randn(2, 5, 8)).shape
        torch.Size([2, 3, 8])
    """

    def __init__(self, num_tokens: int, dim: int, config: WukongConfig) -> None:
        super().__init__()
        self.dim = dim
        self.num_out = config.num_fm_tokens
        self.y = nn.Parameter(
            torch.randn(num_tokens, config.fm_rank) * num_tokens**-0.5
        )
        self.norm = nn.LayerNorm(num_tokens * config.fm_rank)
        self.mlp = mlp(
            num_tokens * config.fm_rank,
            (*config.mlp_dims, config.num_fm_tokens * dim),
            last_activation=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Interact."""
        xty = torch.einsum("bnd,nk->bdk", x, self.y)  # (B, D, k)
        fm = torch.bmm(x, xty)  # (B, n, k)
        out = self.mlp(self.norm(fm.flatten(1)))  # (B, n_F * D)
        return out.view(-1, self.num_out, self.dim)


class WukongLayer(nn.Module):
    """One Wukong layer: FMB ∥ LCB, concatenated, residual, LayerNorm.

    When ``n != n_F + n_L`` the residual is linearly compressed to match.

    Args:
        num_tokens: input tokens ``n``.
        dim: token width ``D``.
        config: block sizes.

    Shapes: (B, n, D) → (B, n_F + n_L, D).

    Example:
        >>> from trainer.models.config import WukongConfig
        >>> layer = WukongLayer(6, 8, WukongConfig(num_fm_tokens=2, num_lc_tokens=2))
        >>> layer(torch.randn(2, 6, 8)).shape
        torch.Size([2, 4, 8])
    """

    def __init__(self, num_tokens: int, dim: int, config: WukongConfig) -> None:
        super().__init__()
        num_out = config.num_fm_tokens + config.num_lc_tokens
        self.fmb = FactorizationMachineBlock(num_tokens, dim, config)
        self.lcb = LinearCompressBlock(num_tokens, config.num_lc_tokens)
        self.residual = (
            LinearCompressBlock(num_tokens, num_out) if num_tokens != num_out else None
        )
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One interaction layer."""
        out = torch.cat([self.fmb(x), self.lcb(x)], dim=1)
        residual = x if self.residual is None else self.residual(x)
        return self.norm(out + residual)


class Wukong(nn.Module):
    """A stack of Wukong layers with optional cross-layer attention.

    With ``config.cross_layer_attention``, before layer ``i > 0`` its input
    attends over ``cat(X_0, …, X_{i-1})`` (the stack input and the earlier
    layer outputs) through :class:`CrossLayerAttention`.

    Args:
        num_tokens: input tokens ``n``.
        dim: token width ``D``.
        config: stack config.

    Shapes: (B, n, D) → (B, n_F + n_L, D).

    Example:
        >>> from trainer.models.config import WukongConfig
        >>> cfg = WukongConfig(num_layers=2, cross_layer_attention=True)
        >>> Wukong(6, 8, cfg)(torch.randn(2, 6, 8)).shape
        torch.Size([2, 8, 8])
    """

    def __init__(self, num_tokens: int, dim: int, config: WukongConfig) -> None:
        super().__init__()
        self.num_out = config.num_fm_tokens + config.num_lc_tokens
        sizes = [num_tokens] + [self.num_out] * (config.num_layers - 1)
        self.layers = nn.ModuleList(WukongLayer(n, dim, config) for n in sizes)
        self.cross = (
            nn.ModuleList(
                CrossLayerAttention(dim, config.attention_heads)
                for _ in range(config.num_layers - 1)
            )
            if config.cross_layer_attention
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run the stack."""
        history = [x]
        for i, layer in enumerate(self.layers):
            if i > 0 and self.cross is not None:
                x = self.cross[i - 1](x, torch.cat(history[:-1], dim=1))
            x = layer(x)
            history.append(x)
        return x
