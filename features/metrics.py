"""Quality metrics for binary predictions: NE, AUC and calibration.

Plain numpy, so the generator's Bayes-optimal report, offline evaluation and
the trainer's progressive validation compute the same numbers.

- **NE** (normalized entropy, He et al. 2014): mean log loss divided by the
  entropy of the base rate. 1.0 is "predict the average"; lower is better.
- **AUC**: probability a random positive is scored above a random negative
  (ties count half).
- **Calibration**: sum of predictions / number of positives; 1.0 is perfect.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

_EPS = 1e-12


@dataclass(frozen=True)
class BinaryMetrics:
    """NE, AUC and calibration of one set of predictions."""

    count: int
    positives: int
    ne: float
    auc: float
    calibration: float


def log_loss(labels: npt.ArrayLike, probs: npt.ArrayLike) -> float:
    """Mean binary cross-entropy (nats).

    Example:
        >>> round(log_loss([1, 0], [0.5, 0.5]), 4)
        0.6931
    """
    y = np.asarray(labels, dtype=np.float64)
    p = np.clip(np.asarray(probs, dtype=np.float64), _EPS, 1 - _EPS)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def normalized_entropy(labels: npt.ArrayLike, probs: npt.ArrayLike) -> float:
    """Log loss divided by the entropy of the empirical base rate.

    NaN when the labels are all one class (the base-rate entropy is 0).

    Example:
        >>> normalized_entropy([1, 0, 0, 0], [0.25] * 4)
        1.0
    """
    y = np.asarray(labels, dtype=np.float64)
    rate = float(y.mean()) if y.size else 0.0
    if rate <= 0.0 or rate >= 1.0:
        return float("nan")
    base = float(-(rate * np.log(rate) + (1 - rate) * np.log(1 - rate)))
    return log_loss(y, probs) / base


def auc(labels: npt.ArrayLike, scores: npt.ArrayLike) -> float:
    """Area under the ROC curve from ranks (ties get their average rank).

    NaN when the labels are all one class.

    Example:
        >>> auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
        0.75
    """
    y = np.asarray(labels, dtype=bool)
    s = np.asarray(scores, dtype=np.float64)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    sorted_scores = s[order]
    ranks = np.empty(s.size, dtype=np.float64)
    # Average rank within runs of equal scores.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], s.size]
    run_rank = (starts + ends + 1) / 2.0  # 1-based mean of [start+1, end]
    ranks[order] = np.repeat(run_rank, ends - starts)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def calibration(labels: npt.ArrayLike, probs: npt.ArrayLike) -> float:
    """Predicted positives over observed positives (NaN with no positives).

    Example:
        >>> calibration([1, 0, 0, 0], [0.5, 0.25, 0.25, 0.0])
        1.0
    """
    y = np.asarray(labels, dtype=np.float64)
    positives = y.sum()
    if positives == 0:
        return float("nan")
    return float(np.asarray(probs, dtype=np.float64).sum() / positives)


def binary_metrics(labels: npt.ArrayLike, probs: npt.ArrayLike) -> BinaryMetrics:
    """All three metrics at once."""
    y = np.asarray(labels)
    return BinaryMetrics(
        count=int(y.size),
        positives=int(np.asarray(y, dtype=bool).sum()),
        ne=normalized_entropy(y, probs),
        auc=auc(y, probs),
        calibration=calibration(y, probs),
    )
