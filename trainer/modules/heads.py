"""Multi-domain heads and the domain-masked loss (docs/model.md).

Tasks are the (domain, objective) pairs of :data:`features.vocab.DOMAINS` ×
:data:`features.vocab.TRAINING_OBJECTIVES` (Facebook, Instagram, Messaging ×
click, conversion). The heads are one PLE/CGC extraction level: shared experts
plus per-domain experts, one softmax gate per task over [shared ∪ its domain's
experts] conditioned on ``[h ∥ domain embedding]``, and one tower per task.
STAR-style weight modulation (docs/model.md) is not implemented.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from features.vocab import DOMAINS, TRAINING_OBJECTIVES
from trainer.models.config import HeadsConfig
from trainer.modules.mlp import mlp

NUM_DOMAINS = len(DOMAINS)
NUM_OBJECTIVES = len(TRAINING_OBJECTIVES)


class MultiDomainHeads(nn.Module):
    """PLE/CGC experts and gates, one tower per (domain, objective).

    Args:
        in_features: width of the trunk output ``h``.
        config: expert counts and widths.

    Shapes: h (B, in_features), domain (B,) int64 → logits
    (B, NUM_DOMAINS, NUM_OBJECTIVES). Every tower runs for every example;
    :func:`multi_domain_loss` keeps only the example's own domain.

    Example:
        >>> from trainer.models.config import HeadsConfig
        >>> heads = MultiDomainHeads(16, HeadsConfig())
        >>> heads(torch.randn(4, 16), torch.tensor([0, 1, 2, 0])).shape
        torch.Size([4, 3, 2])
    """

    def __init__(self, in_features: int, config: HeadsConfig) -> None:
        super().__init__()
        width = config.expert_dims[-1]
        self.shared = nn.ModuleList(
            mlp(in_features, config.expert_dims)
            for _ in range(config.num_shared_experts)
        )
        self.specific = nn.ModuleList(
            nn.ModuleList(
                mlp(in_features, config.expert_dims)
                for _ in range(config.num_specific_experts)
            )
            for _ in DOMAINS
        )
        self.domain_embedding = nn.Embedding(NUM_DOMAINS, config.domain_dim)
        experts = config.num_shared_experts + config.num_specific_experts
        tasks = NUM_DOMAINS * NUM_OBJECTIVES
        self.gates = nn.ModuleList(
            nn.Linear(in_features + config.domain_dim, experts) for _ in range(tasks)
        )
        self.towers = nn.ModuleList(
            mlp(width, (*config.tower_dims, 1), last_activation=False)
            for _ in range(tasks)
        )

    def forward(self, h: torch.Tensor, domain: torch.Tensor) -> torch.Tensor:
        """Logits of every task."""
        shared = [expert(h) for expert in self.shared]
        gate_in = torch.cat([h, self.domain_embedding(domain)], dim=-1)
        logits = []
        for d, specific in enumerate(self.specific):
            experts = torch.stack(shared + [expert(h) for expert in specific], dim=1)
            for o in range(NUM_OBJECTIVES):
                t = d * NUM_OBJECTIVES + o
                weights = torch.softmax(self.gates[t](gate_in), dim=-1)  # (B, E)
                mixed = torch.einsum("be,bew->bw", weights, experts)
                logits.append(self.towers[t](mixed))
        return torch.cat(logits, dim=-1).view(-1, NUM_DOMAINS, NUM_OBJECTIVES)


def own_domain(values: torch.Tensor, domain: torch.Tensor) -> torch.Tensor:
    """Pick each example's own domain: (B, NUM_DOMAINS, O) → (B, O).

    Example:
        >>> x = torch.arange(12.0).view(2, 3, 2)
        >>> own_domain(x, torch.tensor([2, 0])).tolist()
        [[4.0, 5.0], [6.0, 7.0]]
    """
    index = domain.view(-1, 1, 1).expand(-1, 1, values.shape[-1])
    return values.gather(1, index).squeeze(1)


def multi_domain_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    domain: torch.Tensor,
    task_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Domain-masked BCE, normalised per task.

    ``loss = Σ_{d,o} w_{d,o} · Σ_i 1[domain_i = d] BCE_i / max(1, #{i: domain_i = d})``:
    an example trains only its own domain's towers (the others get exactly
    zero gradient), and each task's term is the mean over its examples.

    Args:
        logits: (B, NUM_DOMAINS, O).
        labels: (B, O) in {0, 1}.
        domain: (B,) int64.
        task_weights: (NUM_DOMAINS, O), default all ones.

    Returns:
        ``(loss, per_task)``: the scalar loss and the (NUM_DOMAINS, O) per-task
        mean losses (0 where a domain has no examples).

    Example:
        >>> loss, per_task = multi_domain_loss(
        ...     torch.zeros(2, 3, 2), torch.ones(2, 2), torch.tensor([0, 0]))
        >>> round(loss.item(), 4), per_task[1].tolist()
        (1.3863, [0.0, 0.0])
    """
    mask = F.one_hot(domain, logits.shape[1]).to(logits.dtype)  # (B, Dm)
    target = labels.unsqueeze(1).expand_as(logits)
    bce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    summed = torch.einsum("bd,bdo->do", mask, bce)
    count = mask.sum(0).clamp(min=1.0).unsqueeze(-1)
    per_task = summed / count
    if task_weights is not None:
        return (per_task * task_weights).sum(), per_task
    return per_task.sum(), per_task
