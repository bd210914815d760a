"""The Student Adapter (ExFM §3.4, Eq. 6; docs/model.md).

Public (ExFM): a lightweight network ``ŷ_SA = MLP(ŷ_F)`` on the teacher's
prediction, trained on the freshest labels with its own loss
``h(ŷ_SA, y)``; its stop-gradient output is a second soft target for the
student (Eq. 7).

Our design (docs/model.md): besides the teacher logit
it reads the example's domain (an embedding), the objective (one-hot) and
the teacher's staleness (``log1p`` of hours since the teacher's checkpoint
time), so one adapter can learn *how* a stale teacher drifts; it is an MLP
[16, 16] with SiLU, initialised to the identity (``z_SA = z_F + δ`` with
the last layer zero), trained with its own Adam at a higher learning rate
(1e-2), and it scores each batch *before* it is trained on that batch (so
the soft target it hands the student never saw that batch's labels).

On top of the MLP, a :class:`OffsetTracker` (our design) owns the adapter's
*calibration*: per (domain, objective) a logit offset with a level and a
slope in teacher staleness, updated by a Kalman filter on every batch's
labels. Why a filter and not the MLP's own bias: a stale teacher's error is
mostly an intercept that moves with staleness (base rates drift); an Adam
step per batch of 256 (a handful of clicks) makes that intercept a noisy
random walk, whereas the filter weighs each batch by the information its
labels carry (``Σ p(1-p)``) and, through the slope, extrapolates a steady
drift instead of lagging it. Its time constant is set by two process-noise
variances (how fast the level and the slope may change per day), not by a
learning rate.
"""

from __future__ import annotations

import math
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

    def __init__(
        self,
        hidden: Sequence[int] = (16, 16),
        domain_dim: int = 4,
        tracker: OffsetTracker | None = None,
    ) -> None:
        super().__init__()
        self.tracker = tracker
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

    def mlp_logits(
        self,
        teacher_logits: torch.Tensor,
        domain: torch.Tensor,
        staleness_hours: torch.Tensor,
    ) -> torch.Tensor:
        """The output without the tracker's offset (what the tracker corrects)."""
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
        logits: torch.Tensor = teacher_logits + self.mlp(features).squeeze(-1)
        return logits

    def forward(
        self,
        teacher_logits: torch.Tensor,
        domain: torch.Tensor,
        staleness_hours: torch.Tensor,
    ) -> torch.Tensor:
        logits = self.mlp_logits(teacher_logits, domain, staleness_hours)
        if self.tracker is not None:
            logits = logits + self.tracker.offset(domain, staleness_hours)
        return logits


class OffsetTracker(nn.Module):
    """Per (domain, objective) logit offset ``b + s·Δt``: a Kalman filter with a
    local linear trend, clocked by the teacher's staleness (hours).

    State per (domain, objective): level ``b`` (logit offset at the last
    update) and slope ``s`` (logit per day of staleness), with covariance
    ``P``. Between updates the state moves by ``F = [[1, Δ], [0, 1]]`` (Δ in
    days) and gains ``diag(level_noise², slope_noise²)·Δ`` of variance. A
    batch with base logits ``z`` (teacher + MLP) and labels ``y`` is a
    logistic observation of the line, each row at its own staleness
    (``a_i = [1, Δ_i]``, Δ_i its days from the filter's clock); the update is
    one Newton step from the prediction (the Laplace / extended Kalman
    update of a GLM): ``g = Σ a_i (y_i - σ(z_i + a_i·x))``,
    ``H = Σ σ(1-σ) a_i a_iᵀ``, ``P ← (P⁻¹ + H)⁻¹``, ``x ← x + P·g``.

    A batch of ``n`` examples at rate ``p`` moves the level by about
    ``g / (h + 1/P_bb)``: a batch with few positives moves it little,
    and a long steady stream pins both level and slope (so a linear drift is
    followed without lag). A new teacher (staleness back near 0) reads the
    line back at its own staleness.

    Args:
        level_noise: sd of the level's random walk per sqrt(day) (logit).
        slope_noise: sd of the slope's random walk per sqrt(day) (logit/day).
        prior_level: prior sd of the level before any label.
        prior_slope: prior sd of the slope before any label.

    Example:
        >>> t = OffsetTracker()
        >>> d, st = torch.zeros(4, dtype=torch.long), torch.full((4,), 5.0)
        >>> t.offset(d, st).abs().sum().item()    # nothing learnt yet
        0.0
        >>> t.update(torch.zeros(4, 2), torch.ones(4, 2), torch.ones(4, 1), d, st)
        >>> bool((t.offset(d, st) > 0).all())     # all positive: offset rises
        True
    """

    state: torch.Tensor  # (D, O, 2) level, slope
    cov: torch.Tensor  # (D, O, 2, 2)
    clock: torch.Tensor  # (D, O) staleness hours of the last update

    def __init__(
        self,
        *,
        level_noise: float = 0.03,
        slope_noise: float = 0.01,
        prior_level: float = 1.0,
        prior_slope: float = 0.2,
    ) -> None:
        super().__init__()
        d, o = len(DOMAINS), len(TRAINING_OBJECTIVES)
        self.process_noise = (level_noise**2, slope_noise**2)
        self.register_buffer("state", torch.zeros(d, o, 2, dtype=torch.float64))
        cov = torch.diag(torch.tensor([prior_level**2, prior_slope**2]))
        self.register_buffer("cov", cov.expand(d, o, 2, 2).clone().double())
        # Staleness (hours) at each filter's last update; NaN = never updated.
        self.register_buffer("clock", torch.full((d, o), math.nan, dtype=torch.float64))

    def offset(
        self, domain: torch.Tensor, staleness_hours: torch.Tensor
    ) -> torch.Tensor:
        """(B, O) offsets at each example's staleness (the line extrapolated)."""
        level = self.state[domain, :, 0]  # (B, O)
        slope = self.state[domain, :, 1]
        clock = self.clock[domain]
        days = torch.nan_to_num((staleness_hours.double().unsqueeze(1) - clock) / 24)
        return (level + slope * days).to(torch.float32)

    @torch.no_grad()
    def update(
        self,
        base_logits: torch.Tensor,
        labels: torch.Tensor,
        mask: torch.Tensor,
        domain: torch.Tensor,
        staleness_hours: torch.Tensor,
    ) -> None:
        """One filter step per (domain, objective) present in the batch.

        Args:
            base_logits: (B, O) the adapter's logits without this offset.
            labels: (B, O) in {0, 1}.
            mask: (B, O) or (B, 1), 1 where the row counts (has a teacher output).
            domain: (B,) domain indices.
            staleness_hours: (B,) the rows' teacher staleness.
        """
        q_level, q_slope = self.process_noise
        weight = mask.double().expand_as(labels)
        hours = staleness_hours.double()
        for d in torch.unique(domain).tolist():
            rows = domain == d
            for o in range(labels.shape[1]):
                w = weight[rows, o]
                taught = w > 0
                if not bool(taught.any()):
                    continue
                x, cov = self.state[d, o].clone(), self.cov[d, o].clone()
                last = float(self.clock[d, o])
                newest = float(hours[rows][taught].max())
                clock = newest if math.isnan(last) else max(newest, last)
                days = 0.0 if math.isnan(last) else (clock - last) / 24
                if days > 0:  # predict: move along the line, gain variance
                    f = torch.tensor([[1.0, days], [0.0, 1.0]], dtype=torch.float64)
                    x = f @ x
                    cov = f @ cov @ f.T + torch.diag(
                        torch.tensor([q_level * days, q_slope * days], dtype=f.dtype)
                    )
                # Each row observes the line at its own staleness (Δ ≤ 0 days
                # from the clock; far below 0 for rows of a newer teacher).
                design = torch.stack(
                    [torch.ones_like(hours[rows]), (hours[rows] - clock) / 24], 1
                )  # (n, 2)
                p = torch.sigmoid(base_logits[rows, o].double() + design @ x)
                g = design.T @ (w * (labels[rows, o].double() - p))
                h = design.T @ (design * (w * p * (1 - p)).unsqueeze(1))
                cov = torch.linalg.inv(torch.linalg.inv(cov) + h)
                self.state[d, o] = x + cov @ g
                self.cov[d, o] = 0.5 * (cov + cov.T)
                self.clock[d, o] = clock
