"""Every transfer loss against its formula, including all-masked batches."""

from __future__ import annotations

import pytest
import torch

from trainer.distill.losses import (
    adapter_distill_loss,
    adapter_fit_loss,
    auxiliary_head_loss,
    masked_bce,
    scale_gradient,
    standard_kd_loss,
)

B, NO = 7, 2


def h(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Elementwise -[t log σ(z) + (1 - t) log(1 - σ(z))], written out."""
    p = torch.sigmoid(z.double())
    return -(t * torch.log(p) + (1 - t) * torch.log(1 - p))


@pytest.fixture
def inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "z": torch.randn(B, NO, generator=g, dtype=torch.float64) * 2,
        "z2": torch.randn(B, NO, generator=g, dtype=torch.float64) * 2,
        "teacher": torch.randn(B, NO, generator=g, dtype=torch.float64) * 3,
        "y": (torch.rand(B, NO, generator=g) < 0.4).double(),
        "mask": torch.tensor([1, 0, 1, 1, 0, 1, 0], dtype=torch.float64).view(B, 1),
    }


def test_masked_bce_is_the_masked_mean(inputs: dict[str, torch.Tensor]) -> None:
    z, y, m = inputs["z"], inputs["y"], inputs["mask"]
    expected = (h(z, y) * m).sum() / (m.sum() * NO)
    assert torch.allclose(masked_bce(z, y, m), expected)
    assert torch.allclose(masked_bce(z, y), h(z, y).mean())


def test_all_masked_terms_are_zero_with_a_graph(
    inputs: dict[str, torch.Tensor],
) -> None:
    z = inputs["z"].clone().requires_grad_(True)
    none = torch.zeros(B, 1, dtype=torch.float64)
    for loss in (
        masked_bce(z, inputs["y"], none),
        adapter_fit_loss(z, inputs["y"], none),
        adapter_distill_loss(z, inputs["teacher"], none),
    ):
        assert loss.item() == 0.0
        (grad,) = torch.autograd.grad(loss, z)
        assert torch.count_nonzero(grad) == 0
        assert torch.isfinite(grad).all()


def test_standard_kd_formula(inputs: dict[str, torch.Tensor]) -> None:
    z, y, t, m = inputs["z"], inputs["y"], inputs["teacher"], inputs["mask"]
    lam, temp = 0.7, 2.0
    soft = (h(z / temp, torch.sigmoid(t / temp)) * m).sum() / (m.sum() * NO)
    expected = h(z, y).mean() + lam * temp**2 * soft
    got = standard_kd_loss(z, y, t, m, weight=lam, temperature=temp)
    assert torch.allclose(got, expected)
    # No teacher output at all: exactly the label loss.
    alone = standard_kd_loss(z, y, t, torch.zeros_like(m), weight=lam)
    assert torch.allclose(alone, h(z, y).mean())


def test_auxiliary_head_formula(inputs: dict[str, torch.Tensor]) -> None:
    zs, zd, y = inputs["z"], inputs["z2"], inputs["y"]
    t, m = inputs["teacher"], inputs["mask"]
    alpha, w = 5.0, 3.0
    target = torch.clamp(alpha * torch.sigmoid(t), max=1.0)
    assert (target == 1.0).any()  # the min() is exercised...
    assert (target < 1.0).any()  # ...on both sides
    expected = h(zs, y).mean() + w * (h(zd, target) * m).sum() / (m.sum() * NO)
    got = auxiliary_head_loss(zs, zd, y, t, m, weight=w, label_scale=alpha)
    assert torch.allclose(got, expected)


def test_auxiliary_serving_head_learns_from_labels_only(
    inputs: dict[str, torch.Tensor],
) -> None:
    zs = inputs["z"].clone().requires_grad_(True)
    zd = inputs["z2"].clone().requires_grad_(True)
    loss = auxiliary_head_loss(zs, zd, inputs["y"], inputs["teacher"], inputs["mask"])
    g_serving, g_distill = torch.autograd.grad(loss, (zs, zd))
    # d h(z, y) / dz = σ(z) - y, averaged: no teacher term in the serving grad.
    assert torch.allclose(g_serving, (torch.sigmoid(zs) - inputs["y"]) / (B * NO))
    # Masked rows give the distillation head no gradient; all-masked: none at all.
    assert torch.count_nonzero(g_distill[inputs["mask"][:, 0] == 0]) == 0
    loss = auxiliary_head_loss(
        zs, zd, inputs["y"], inputs["teacher"], torch.zeros(B, 1, dtype=torch.float64)
    )
    (g_distill,) = torch.autograd.grad(loss, zd)
    assert torch.count_nonzero(g_distill) == 0


def test_adapter_losses_formula_and_stop_gradient(
    inputs: dict[str, torch.Tensor],
) -> None:
    z_sa = inputs["teacher"].clone().requires_grad_(True)
    head = inputs["z"].clone().requires_grad_(True)
    y, m = inputs["y"], inputs["mask"]
    fit = adapter_fit_loss(z_sa, y, m)
    assert torch.allclose(fit, (h(z_sa, y) * m).sum() / (m.sum() * NO))
    distill = adapter_distill_loss(head, z_sa, m)
    expected = (h(head, torch.sigmoid(z_sa)) * m).sum() / (m.sum() * NO)
    assert torch.allclose(distill, expected)
    g_head, g_adapter = torch.autograd.grad(distill, (head, z_sa), allow_unused=True)
    assert g_adapter is None  # SG(σ(z_SA)): the student's loss never reaches it
    assert torch.count_nonzero(g_head) > 0


def test_scale_gradient_scales_only_backward() -> None:
    x = torch.randn(3, requires_grad=True)
    y = scale_gradient(x, 20.0)
    assert torch.equal(y, x)
    (y * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert torch.allclose(x.grad, torch.tensor([20.0, 40.0, 60.0]))
