"""Progressive validation: score each batch *before* training on it.

Every example is predicted by a model that has not seen it yet, so the
running metrics are honest out-of-sample figures without a held-out set
(the streaming yardstick of docs/model.md). Kept per (domain, objective):

- **lifetime**: every example since the run (and its checkpoints) began;
- **window**: the last *closed* tumbling window of ``window_examples``
  examples (per key), plus the one being filled.

NE, AUC and calibration are computed from mergeable sums, so state is a
fixed-size tensor that goes into the checkpoint and sums across ranks:
count, positives, Σ log loss, Σ p, and two score histograms (positives,
negatives). **AUC is incremental via a fixed-bin histogram**: ``BINS`` bins
uniform in logit over [-16, 16] (CTRs pile up near 0, where bins uniform in
probability would merge most scores); pairs in the same bin count half, so
the error is at most the share of positive-negative pairs sharing a bin.
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np
import torch

from features.vocab import DOMAINS, TRAINING_OBJECTIVES
from trainer.training.step import EvalOutput

BINS: Final = 1024
LOGIT_RANGE: Final = 16.0
KEYS: Final = tuple((d, o) for d in DOMAINS for o in TRAINING_OBJECTIVES)
_COUNT, _POS, _LOSS, _SUMP, _HIST = 0, 1, 2, 3, 4
_EPS: Final = 1e-12
SCOPES: Final = ("lifetime", "window", "last_window")


class ProgressiveMetrics:
    """Running NE / AUC / calibration per (domain, objective); see the module."""

    def __init__(self, window_examples: int = 2000) -> None:
        self.window_examples = window_examples
        # (scope, key, 4 sums + positive histogram + negative histogram)
        self.acc = np.zeros((len(SCOPES), len(KEYS), _HIST + 2 * BINS))

    def update(self, out: EvalOutput) -> None:
        """Add one batch's predictions (made before training on it)."""
        probs = out.probs.detach().double().cpu().numpy()  # a host sync: once per step
        labels = out.labels.detach().double().cpu().numpy()
        domain = out.domain.detach().cpu().numpy()
        p = np.clip(probs, _EPS, 1 - _EPS)
        logit = np.log(p) - np.log1p(-p)
        bins = np.clip(
            ((logit + LOGIT_RANGE) / (2 * LOGIT_RANGE) * BINS).astype(np.int64),
            0,
            BINS - 1,
        )
        loss = -(labels * np.log(p) + (1 - labels) * np.log1p(-p))
        num_objectives = len(TRAINING_OBJECTIVES)
        for o in range(num_objectives):
            key = domain * num_objectives + o
            y = labels[:, o]
            rows = np.zeros((len(KEYS), _HIST + 2 * BINS))
            np.add.at(rows[:, _COUNT], key, 1.0)
            np.add.at(rows[:, _POS], key, y)
            np.add.at(rows[:, _LOSS], key, loss[:, o])
            np.add.at(rows[:, _SUMP], key, probs[:, o])
            column = _HIST + bins[:, o] + np.where(y > 0.5, 0, BINS)
            np.add.at(rows, (key, column), 1.0)
            self.acc[0] += rows
            self.acc[1] += rows
        # Close each key's window once it holds enough examples.
        full = self.acc[1, :, _COUNT] >= self.window_examples
        self.acc[2, full] = self.acc[1, full]
        self.acc[1, full] = 0.0

    def table(self, scope: str = "lifetime") -> dict[str, dict[str, float]]:
        """``{"domain/objective": {count, positives, ne, auc, calibration}}``.

        ``scope`` is ``lifetime``, ``window`` (being filled) or
        ``last_window``; keys without examples are left out.
        """
        result = {}
        for k, (d, o) in enumerate(KEYS):
            row = self.acc[SCOPES.index(scope), k]
            if row[_COUNT] > 0:
                result[f"{d}/{o}"] = _metrics(row)
        return result

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state (a tensor: ``weights_only`` loads it)."""
        return {
            "acc": torch.from_numpy(self.acc.copy()),
            "window": self.window_examples,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        self.acc = state["acc"].double().numpy().copy()
        self.window_examples = int(state["window"])

    @classmethod
    def merged(cls, states: list[dict[str, Any]]) -> ProgressiveMetrics:
        """Sum of several ranks' states (every field is a sum)."""
        metrics = cls(int(states[0]["window"]))
        metrics.acc = sum(s["acc"].double().numpy() for s in states)
        return metrics


def _metrics(row: np.ndarray) -> dict[str, float]:
    count, positives = float(row[_COUNT]), float(row[_POS])
    rate = positives / count
    if 0.0 < rate < 1.0:
        base = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
        ne = row[_LOSS] / count / base
    else:
        ne = float("nan")
    pos, neg = row[_HIST : _HIST + BINS], row[_HIST + BINS :]
    if pos.sum() > 0 and neg.sum() > 0:
        # P(score_pos > score_neg) + ½ P(same bin), bins in increasing score.
        below = np.cumsum(neg) - neg
        auc = float((pos * (below + 0.5 * neg)).sum() / (pos.sum() * neg.sum()))
    else:
        auc = float("nan")
    calibration = row[_SUMP] / positives if positives > 0 else float("nan")
    return {
        "count": count,
        "positives": positives,
        "ne": float(ne),
        "auc": auc,
        "calibration": float(calibration),
    }
