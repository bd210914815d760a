"""``GEMTrain``: the wrapper that owns the loss (like torchrec's ``DLRMTrain``)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from trainer.data.batch import Batch
from trainer.modules.heads import multi_domain_loss


class TrainOutputs(NamedTuple):
    """Detached outputs of one forward.

    loss (), per_task (Dm, O), logits (B, Dm, O), labels (B, O), domain (B,).
    """

    loss: torch.Tensor
    per_task: torch.Tensor
    logits: torch.Tensor
    labels: torch.Tensor
    domain: torch.Tensor


class GEMTrain(nn.Module):
    """Wraps any model ``batch → logits (B, Dm, O)`` with the domain-masked loss.

    Args:
        model: a model from :func:`trainer.models.registry.build_model`.
        task_weights: optional (Dm, O) loss weights.

    Shapes: ``forward(batch) -> (loss, TrainOutputs)`` with ``loss`` a scalar
    that requires grad and every ``TrainOutputs`` field detached.

    Example:
        >>> from trainer.models.registry import build_model
        >>> wrapper = GEMTrain(build_model("dcnv2", "tiny"))
        >>> isinstance(wrapper.model, nn.Module)
        True
    """

    def __init__(
        self, model: nn.Module, task_weights: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        self.model = model
        self.task_weights: torch.Tensor | None
        self.register_buffer("task_weights", task_weights)

    def forward(self, batch: Batch) -> tuple[torch.Tensor, TrainOutputs]:
        """Loss and detached outputs."""
        logits = self.model(batch)
        loss, per_task = multi_domain_loss(
            logits, batch.labels, batch.domain, self.task_weights
        )
        return loss, TrainOutputs(
            loss.detach(),
            per_task.detach(),
            logits.detach(),
            batch.labels.detach(),
            batch.domain.detach(),
        )
