"""Scoring a trained model on a dataset: metrics per (domain, objective) and
per objective, and the output-bias shifts that calibrate it on one.

Metrics (:mod:`features.metrics`): NE normalized by the entropy of the
*scored set's own* base rate (TorchRec's convention, ``docs/model.md``), AUC,
calibration = predicted / observed positives. Each example is scored by its
own domain's head.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from features.metrics import binary_metrics
from features.vocab import DOMAINS, TRAINING_OBJECTIVES
from trainer.data.feature_output import ExampleDataset
from trainer.metrics.calibration import calibration_shifts
from trainer.models.base_rate import BaseRateOffset
from trainer.models.loss_wrapper import GEMTrain
from trainer.training.step import collect_predictions, eval_step


def evaluate_dataset(
    model: GEMTrain,
    data: ExampleDataset,
    batch_size: int = 2048,
    rows: np.ndarray | None = None,
    predictions_out: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Metrics per ``"domain/objective"`` and per objective over all domains.

    Args:
        model: the trained model.
        data: the examples.
        batch_size: eval batch size.
        rows: score only these example rows (all when None).
        predictions_out: if given, filled with ``labels`` (N, O), ``probs``
            (N, O) (own-domain head) and ``domain`` (N,) in row order, for
            paired comparisons between models (bootstrap).
    """
    if rows is None:
        batches = data.batches(batch_size)
    else:
        batches = (
            data.batch(rows[i : i + batch_size])
            for i in range(0, len(rows), batch_size)
        )
    device = next(model.parameters()).device
    on_gpu = device.type == "cuda"
    outputs = [
        eval_step(model, b.to(device, non_blocking=True) if on_gpu else b)
        for b in batches
    ]
    if predictions_out is not None and outputs:
        predictions_out["labels"] = torch.cat([o.labels for o in outputs]).cpu().numpy()
        predictions_out["probs"] = torch.cat([o.probs for o in outputs]).cpu().numpy()
        predictions_out["domain"] = torch.cat([o.domain for o in outputs]).cpu().numpy()
    predictions = collect_predictions(outputs)
    by_task = {
        f"{d}/{o}": dataclasses.asdict(binary_metrics(y, p))
        for (d, o), (y, p) in predictions.items()
    }
    overall = {}
    for o in TRAINING_OBJECTIVES:
        pairs = [v for (_, oo), v in predictions.items() if oo == o]
        if pairs:
            y = np.concatenate([y for y, _ in pairs])
            p = np.concatenate([p for _, p in pairs])
            overall[o] = dataclasses.asdict(binary_metrics(y, p))
    return {"by_task": by_task, "overall": overall}


def recalibrate(
    model: GEMTrain, validation: ExampleDataset, autocast: torch.autocast
) -> dict[str, float]:
    """Shift the model's output biases to calibrate it on all of ``validation``.

    Returns the shifts by ``"domain/objective"`` (logits).
    """
    # Under torch.compile the wrapper is the compiled module's original.
    offsets = getattr(model.model, "_orig_mod", model.model)
    if not isinstance(offsets, BaseRateOffset):
        raise TypeError("recalibration needs the BaseRateOffset wrapper")
    seen: dict[str, np.ndarray] = {}
    with autocast:
        evaluate_dataset(model, validation, predictions_out=seen)
    shifts = calibration_shifts(seen["probs"], seen["labels"], seen["domain"])
    with torch.no_grad():
        offsets.offset += torch.as_tensor(
            shifts, dtype=offsets.offset.dtype, device=offsets.offset.device
        )
    return {
        f"{d}/{o}": float(shifts[i, j])
        for i, d in enumerate(DOMAINS)
        for j, o in enumerate(TRAINING_OBJECTIVES)
    }


def click_ne(metrics: dict[str, Any]) -> float | None:
    """Overall click NE of an :func:`evaluate_dataset` result (None: no clicks)."""
    ne = metrics["overall"].get("click", {}).get("ne")
    return None if ne is None or not math.isfinite(ne) else float(ne)
