"""The Student Adapter (ExFM §3.4, Eq. 6; model.md §6.1).

Public (ExFM): a lightweight network ``ŷ_SA = MLP(ŷ_F)`` on the teacher's
prediction, trained on the freshest labels with its own loss
``h(ŷ_SA, y)``; its stop-gradient output is a second soft target for the
student (Eq. 7).

Our design (model.md §6.1, "for our project"): besides the teacher logit
it reads the example's domain (an embedding), the objective (one-hot) and
the teacher's staleness (``log1p`` of hours since the teacher's checkpoint
time), so one adapter can learn *how* a stale teacher drifts; it is an MLP
[16, 16] with SiLU, initialised to the identity (``z_SA = z_F + δ`` with
the last layer zero), trained with its own Adam at a higher learning rate
(1e-2), and it scores each batch *before* it is trained on that batch (so
the soft target it hands the student never saw that batch's labels).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from features.vocab import DOMAINS, TRAINING_OBJECTIVES


class StudentAdapter(nn.Module):
    """Refines teacher logits towards the freshest labels.

    Args:
        hidden: hidden widths of the MLP.
        domain_dim: width of the domain embedding.

    Shapes: ``forward(teacher_logits (B, O), domain (B,), staleness_hours (B,))``
    → adapted logits (B, O).

    Example:
        >>> adapter = StudentAdapter()
        >>> z = torch.randn(4, 2)
        >>> out = adapter(z, torch.zeros(4, dtype=torch.long), torch.ones(4))
        >>> torch.equal(out, z)   # identity at initialisation
        True
    """

    def __init__(self, hidden: Sequence[int] = (16, 16), domain_dim: int = 4) -> None:
        super().__init__()
        self.num_objectives = len(TRAINING_OBJECTIVES)
        self.domain_embedding = nn.Embedding(len(DOMAINS), domain_dim)
        layers: list[nn.Module] = []
        width = 3 + self.num_objectives + domain_dim
        for size in hidden:
            layers += [nn.Linear(width, size), nn.SiLU()]
            width = size
        last = nn.Linear(width, 1)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        self.mlp = nn.Sequential(*layers, last)

    def forward(
        self,
        teacher_logits: torch.Tensor,
        domain: torch.Tensor,
        staleness_hours: torch.Tensor,
    ) -> torch.Tensor:
        b, o = teacher_logits.shape
        z = teacher_logits.unsqueeze(-1)  # (B, O, 1)
        stale = torch.log1p(staleness_hours.clamp(min=0)).view(b, 1, 1).expand(b, o, 1)
        objective = F.one_hot(torch.arange(o, device=z.device), self.num_objectives).to(
            z.dtype
        )
        features = torch.cat(
            [
                z,
                torch.sigmoid(z),
                stale,
                objective.unsqueeze(0).expand(b, o, -1),
                self.domain_embedding(domain).unsqueeze(1).expand(b, o, -1),
            ],
            dim=-1,
        )
        return teacher_logits + self.mlp(features).squeeze(-1)
