"""Transfer losses: every term a masked mean of BCE-with-logits (ExFM Eq. 1).

All logits and targets are ``(B, O)`` (one column per training objective, the
student's own domain only). ``mask`` ``(B, O)`` (or ``(B, 1)``) is 1 where the
term applies: a label loss is masked by nothing but the batch; a
distillation term is masked where the example has no teacher output. A term
whose mask is all zero is exactly 0 and still part of the graph (so a batch
without any teacher output trains on labels alone instead of producing NaN).

==============================  ==============================================
loss                            formula (``h`` = BCE-with-logits, ``σ`` sigmoid)
==============================  ==============================================
:func:`masked_bce`              ``Σ m·h(z, t) / max(1, Σ m)``
:func:`standard_kd_loss`        ``h(z_s, y) + λ·T²·h(z_s/T, σ(z_F/T))`` (Hinton
                                KD mixed into the serving loss; docs/model.md)
:func:`auxiliary_head_loss`     ``h(z_S, y) + w·h(z_D, min(α·σ(z_F), 1))``
                                (ExFM Eq. 3-5; β is :func:`scale_gradient`)
:func:`adapter_fit_loss`        ``h(z_SA, y)`` (ExFM Eq. 6, the adapter's own)
:func:`adapter_distill_loss`    ``h(z_D2, SG(σ(z_SA)))`` (ExFM Eq. 7)
==============================  ==============================================
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_bce(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean BCE-with-logits over the entries where ``mask`` is 1.

    Args:
        logits: (B, O) raw scores.
        targets: (B, O) in [0, 1] (hard labels or soft targets).
        mask: broadcastable to (B, O), 1 = counts, 0 = ignored; None = all.

    Returns:
        A scalar; 0 (with a graph) when nothing is unmasked.

    Example:
        >>> z = torch.zeros(2, 1, requires_grad=True)
        >>> round(masked_bce(z, torch.ones(2, 1)).item(), 4)
        0.6931
        >>> masked_bce(z, torch.ones(2, 1), torch.zeros(2, 1)).item()
        0.0
    """
    bce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    if mask is None:
        return bce.mean()
    weight = mask.to(bce.dtype).expand_as(bce)
    return (bce * weight).sum() / weight.sum().clamp(min=1.0)


def standard_kd_loss(
    serving: torch.Tensor,
    labels: torch.Tensor,
    teacher: torch.Tensor,
    teacher_mask: torch.Tensor,
    *,
    weight: float = 1.0,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Standard distillation: the teacher's soft target mixed into the serving loss.

    ``h(z_s, y) + λ·T²·h(z_s/T, σ(z_F/T))``; the ``T²`` keeps the soft term's
    gradient scale independent of ``T`` (Hinton et al. 2015).
    """
    hard = masked_bce(serving, labels)
    soft_target = torch.sigmoid(teacher / temperature).detach()
    soft = masked_bce(serving / temperature, soft_target, teacher_mask)
    return hard + weight * temperature**2 * soft


def auxiliary_head_loss(
    serving: torch.Tensor,
    distill: torch.Tensor,
    labels: torch.Tensor,
    teacher: torch.Tensor,
    teacher_mask: torch.Tensor,
    *,
    weight: float = 1.0,
    label_scale: float = 1.0,
) -> torch.Tensor:
    """ExFM's auxiliary head: labels on the serving head, the teacher on its own head.

    ``h(z_S, y) + w·h(z_D, min(α·σ(z_F), 1))``. The serving head never sees
    the teacher; the teacher reaches the shared backbone only through the
    distillation head (whose gradient :func:`scale_gradient` multiplies by β).
    """
    target = (label_scale * torch.sigmoid(teacher)).clamp(max=1.0).detach()
    return masked_bce(serving, labels) + weight * masked_bce(
        distill, target, teacher_mask
    )


def adapter_fit_loss(
    adapter_logits: torch.Tensor, labels: torch.Tensor, teacher_mask: torch.Tensor
) -> torch.Tensor:
    """The Student Adapter's own loss on fresh labels, ``h(z_SA, y)`` (ExFM Eq. 6)."""
    return masked_bce(adapter_logits, labels, teacher_mask)


def adapter_distill_loss(
    head: torch.Tensor, adapter_logits: torch.Tensor, teacher_mask: torch.Tensor
) -> torch.Tensor:
    """The student's second distillation head against the stop-gradient adapter.

    ``h(z_D2, SG(σ(z_SA)))`` (ExFM Eq. 7): ``detach`` is the stop-gradient, so
    this loss never reaches the adapter's parameters.
    """
    return masked_bce(head, torch.sigmoid(adapter_logits).detach(), teacher_mask)


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, scale: float
    ) -> torch.Tensor:  # type: ignore[override]
        ctx.scale = scale  # type: ignore[attr-defined]
        return x.view_as(x)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad * ctx.scale, None  # type: ignore[attr-defined]


def scale_gradient(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Identity forward, gradient × ``scale`` backward (ExFM's gradient scaling β).

    Example:
        >>> x = torch.ones(2, requires_grad=True)
        >>> scale_gradient(x, 3.0).sum().backward()
        >>> x.grad.tolist()
        [3.0, 3.0]
    """
    if scale == 1.0:
        return x
    out: torch.Tensor = _ScaleGradient.apply(x, scale)
    return out
