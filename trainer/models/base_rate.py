"""Output offsets at the prior: every task's bias starts at logit(base rate).

Every model here starts at p ~ 0.5 while clicks are ~1-3 % and conversions
rarer; without this, a short run (and every progressive-validation score of a
fresh daemon) spends its first steps just learning the base rate (Adam moves
a bias by ~lr per step), and NE / calibration then measure that, not the
model. Applied to all models alike: the usual "init the output bias to the
prior" trick.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from features.vocab import DOMAINS, TRAINING_OBJECTIVES


class BaseRateOffset(nn.Module):
    """``model(batch) + b`` with ``b`` (Dm, O) learnable, set to logit(base rate).

    Args:
        model: any model ``batch -> logits (B, Dm, O)``.
        base_logits: (Dm, O) initial offsets, e.g. :func:`prior_logits`.

    Example:
        >>> from trainer.models.registry import build_model
        >>> model = BaseRateOffset(build_model("dcnv2", "tiny"), prior_logits())
        >>> tuple(model.offset.shape)
        (3, 2)
    """

    def __init__(self, model: nn.Module, base_logits: torch.Tensor) -> None:
        super().__init__()
        self.inner = model
        self.offset = nn.Parameter(base_logits.clone())

    def forward(self, batch: Any) -> torch.Tensor:
        return self.inner(batch) + self.offset


def prior_logits(
    click_rate: float = 0.02, conversion_rate: float = 0.002
) -> torch.Tensor:
    """(Dm, O) logits of one prior rate per objective, the same in every domain.

    For a stream whose base rates are not known up front (the daemon); offline
    training uses the training set's own rates instead.

    Example:
        >>> prior_logits(0.5, 0.5).abs().max().item()
        0.0
    """
    rates = {"click": click_rate, "conversion": conversion_rate}
    row = torch.tensor([rates[o] for o in TRAINING_OBJECTIVES], dtype=torch.float64)
    return torch.logit(row).float().expand(len(DOMAINS), -1).clone()
