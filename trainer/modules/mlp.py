"""The plain MLP that the model's blocks and the students build on."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def mlp(
    in_features: int, dims: Sequence[int], last_activation: bool = True
) -> nn.Sequential:
    """Linear layers with SiLU (Swish) between them.

    Example:
        >>> import torch
        >>> mlp(4, (8, 2))(torch.zeros(3, 4)).shape
        torch.Size([3, 2])
    """
    layers: list[nn.Module] = []
    width = in_features
    for i, out in enumerate(dims):
        layers.append(nn.Linear(width, out))
        if last_activation or i < len(dims) - 1:
            layers.append(nn.SiLU())
        width = out
    return nn.Sequential(*layers)
