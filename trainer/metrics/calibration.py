"""Recalibration on a validation period: one logit shift per (domain, objective).

A model trained on days 1..k and served on day k+2 sees base rates move
between the two (the generator drifts; real traffic does too), so its
predicted rates can be off by tens of percent while its ranking is fine.
The usual fix, and the one here, is to re-fit each task's output bias on the
most recent labelled period before serving: a shift ``δ`` per (domain,
objective) such that the validation period's predicted positives equal its
observed ones, ``Σ σ(z + δ) = Σ y``. It changes no ranking within a task
(AUC stays as it is); it moves NE only through calibration.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from features.vocab import DOMAINS, TRAINING_OBJECTIVES

# A shift this large means the validation period is not like the eval one
# (or has almost no positives); clamp rather than trust it.
MAX_SHIFT = 3.0


def _logits(probs: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Log-odds of ``probs``, clipped away from 0 and 1."""
    p = np.clip(np.asarray(probs, np.float64), 1e-7, 1 - 1e-7)
    return np.log(p) - np.log1p(-p)


def _shift(logits: npt.NDArray[np.float64], positives: float) -> float:
    """δ with Σ σ(logits + δ) = positives (Newton; the sum is monotone in δ)."""
    delta = 0.0
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-(logits + delta)))
        gap = p.sum() - positives
        slope = float((p * (1.0 - p)).sum())
        if abs(gap) < 1e-9 * max(positives, 1.0) or slope <= 0.0:
            break
        delta = float(np.clip(delta - gap / slope, -MAX_SHIFT, MAX_SHIFT))
    return delta


def calibration_shifts(
    probs: npt.NDArray[np.floating],
    labels: npt.NDArray[np.floating],
    domain: npt.NDArray[np.integer],
    min_positives: int = 5,
) -> npt.NDArray[np.float64]:
    """(Dm, O) logit shifts that make every task's calibration 1 on this data.

    Args:
        probs: (N, O) predicted probabilities (each example's own domain).
        labels: (N, O) 0/1 labels.
        domain: (N,) domain index.
        min_positives: tasks with fewer positives (or fewer negatives) keep
            a shift of 0: their observed rate is too noisy to move the bias.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> z = rng.normal(-3, 1, (20000, 2))
        >>> y = (rng.random((20000, 2)) < 1 / (1 + np.exp(-(z + 0.5)))).astype(float)
        >>> shifts = calibration_shifts(1 / (1 + np.exp(-z)), y, np.zeros(20000, int))
        >>> bool(abs(shifts[0, 0] - 0.5) < 0.1), shifts[1, 0].item()
        (True, 0.0)
    """
    logits = _logits(probs)
    y = np.asarray(labels, np.float64)
    out = np.zeros((len(DOMAINS), len(TRAINING_OBJECTIVES)))
    for d in range(len(DOMAINS)):
        rows = domain == d
        for o in range(len(TRAINING_OBJECTIVES)):
            positives = float(y[rows, o].sum())
            if min(positives, rows.sum() - positives) < min_positives:
                continue
            out[d, o] = _shift(logits[rows, o], positives)
    return out


def recalibrated(
    probs: npt.NDArray[np.floating],
    labels: npt.NDArray[np.floating],
    domain: npt.NDArray[np.integer],
) -> npt.NDArray[np.float64]:
    """``probs`` shifted by the :func:`calibration_shifts` fitted on these
    same rows: what a model recalibrated on this period predicts for it.

    Example:
        >>> p = np.array([[0.1, 0.01], [0.1, 0.01], [0.3, 0.01], [0.3, 0.01]] * 5)
        >>> y = np.array([[0, 0], [1, 0], [1, 0], [1, 0]] * 5)
        >>> out = recalibrated(p, y, np.zeros(20, int))
        >>> round(float(out[:, 0].mean()), 3), round(float(out[0, 1]), 6)
        (0.75, 0.01)
    """
    logits = _logits(probs) + calibration_shifts(probs, labels, domain)[domain]
    return 1.0 / (1.0 + np.exp(-logits))
