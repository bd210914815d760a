"""The epochs of an offline run: each a seeded pass over the training set,
then scored on a fixed sample of it and on the validation period, whose best
epoch is kept; patience ends the run, and under the plateau schedule an epoch
that does not better the best goes back to it at half the rates.

When the run recalibrates, an epoch is scored by its validation NE after the
recalibration shifts fitted on that period: the model served is the shifted
one, and a model's level (its mean predicted rate) moves by tens of percent
from one epoch to the next, which would otherwise decide the choice
(``docs/decisions/0027-recalibrated-by-default.md``)."""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import numpy as np
import pyarrow.compute as pc
import torch

from features.cli import progress
from features.metrics import normalized_entropy
from features.vocab import TRAINING_OBJECTIVES
from trainer.data.feature_output import ExampleDataset
from trainer.metrics.calibration import recalibrated
from trainer.training.evaluation import click_ne, evaluate_dataset
from trainer.training.fit_trainer import FitTrainer
from trainer.training.run_config import FitConfig


@dataclasses.dataclass
class EpochHistory:
    """What the epochs did: the report's ``train`` section, and the best
    epoch's weights when a validation set chose one."""

    epoch_loss: list[float] = dataclasses.field(default_factory=list)
    train_ne: list[float | None] = dataclasses.field(default_factory=list)
    validation_ne: list[float | None] = dataclasses.field(default_factory=list)
    validation_calibration: list[float | None] = dataclasses.field(default_factory=list)
    lr: list[float] = dataclasses.field(default_factory=list)
    best: tuple[float, int, dict[str, Any]] | None = None
    epochs_run: int = 0
    stopped_early: bool = False
    seen: int = 0
    seconds: float = 0.0
    validation_examples: int = 0

    def report(self) -> dict[str, Any]:
        """The report's ``train`` section (its example count aside)."""
        return {
            "examples_seen": self.seen,
            "seconds": self.seconds,
            "epochs_run": self.epochs_run,
            "stopped_early": self.stopped_early,
            "examples_per_s": self.seen / self.seconds if self.seconds else None,
            "epoch_loss": self.epoch_loss,
            "epoch_train_click_ne": self.train_ne,
            "epoch_validation_click_ne": self.validation_ne,
            "epoch_validation_click_calibration": self.validation_calibration,
            "epoch_lr": self.lr,
            "selected_epoch": self.epochs_run - 1
            if self.best is None
            else self.best[1],
            "recalibration_shifts": None,
            "validation_examples": self.validation_examples,
        }


def _sample(rows: int, size: int | None, seed: list[int]) -> np.ndarray | None:
    """A fixed, sorted sample of ``size`` of ``rows`` row indices (None: all)."""
    if size is None:
        return None
    return np.sort(np.random.default_rng(seed).permutation(rows)[:size])


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What the run does between epochs, its defaults resolved: how many at
    most, when to stop, whether a worse epoch halves the rates, and whether
    epochs are scored (and the chosen one served) recalibrated."""

    epochs: int
    patience: int | None
    plateau: bool
    recalibrate: bool = False


def has_clicks(data: ExampleDataset) -> bool:
    """Whether ``data`` holds a click, without which no epoch is chosen on it."""
    return bool(pc.sum(data.examples.column("label_click")).as_py())


def train_epochs(
    cfg: FitConfig,
    recipe: Recipe,
    trainer: FitTrainer,
    train: ExampleDataset,
    validation: ExampleDataset | None,
    steps_per_epoch: int,
) -> EpochHistory:
    """Every epoch (until ``max_train_seconds`` or patience), each scored on
    a fixed sample of train rows and on validation; the best on validation
    is kept, and under the plateau schedule an epoch that does not better
    it goes back to it at half the rates."""
    # A fixed sample of train rows, scored after each epoch (train NE).
    train_rows = _sample(len(train), cfg.train_ne_sample, [cfg.seed, 7])
    history = EpochHistory()
    validation_rows = None
    if validation is not None:
        validation_rows = _sample(len(validation), cfg.validation_sample, [cfg.seed, 8])
        history.validation_examples = (
            len(validation) if validation_rows is None else len(validation_rows)
        )
    run_started = time.perf_counter()
    for epoch in range(recipe.epochs):
        if (
            cfg.max_train_seconds is not None
            and epoch > 0
            and time.perf_counter() - run_started > cfg.max_train_seconds
        ):
            break
        history.lr.append(trainer.rate_scale * cfg.lr)
        _epoch(cfg, recipe, trainer, train, epoch, steps_per_epoch, history)
        with trainer.autocast:
            scores = evaluate_dataset(trainer.model, train, rows=train_rows)
        history.train_ne.append(click_ne(scores))
        line = f"epoch {epoch}: mean train loss {history.epoch_loss[-1]:.5f}"
        line += f", train click NE {_fmt(history.train_ne[-1])}"
        improved = False
        if validation is not None:
            score, calib = validation_click_ne(
                trainer, validation, validation_rows, recipe.recalibrate
            )
            history.validation_ne.append(score)
            history.validation_calibration.append(calib)
            line += f", validation click NE {_fmt(score)}"
            if recipe.recalibrate:
                line += f" after recalibration (calibration {_fmt(calib)} before)"
            if score is not None and (history.best is None or score < history.best[0]):
                history.best = (score, epoch, trainer.snapshot())
                improved = True
        print(line, file=sys.stderr)
        last = epoch + 1 == recipe.epochs
        if not last and out_of_patience(history, recipe.patience):
            history.stopped_early = True
            best = history.report()["selected_epoch"]
            print(
                f"stopping: {recipe.patience} epoch(s) since epoch {best} without "
                "a better validation click NE",
                file=sys.stderr,
            )
            break
        if not last and recipe.plateau and not improved and history.best is not None:
            trainer.restore(history.best[2])
            trainer.rate_scale /= 2
            print(
                f"back to epoch {history.best[1]}'s weights at half the rate "
                f"({trainer.rate_scale * cfg.lr:g})",
                file=sys.stderr,
            )
    return history


def validation_click_ne(
    trainer: FitTrainer,
    validation: ExampleDataset,
    rows: np.ndarray | None,
    recalibrate: bool,
) -> tuple[float | None, float | None]:
    """Click NE on ``validation`` (its ``rows``), after the period's own
    recalibration shifts when ``recalibrate``, and the click calibration
    before them (None where the rows hold no click)."""
    seen: dict[str, np.ndarray] = {}
    with trainer.autocast:
        scores = evaluate_dataset(
            trainer.model, validation, rows=rows, predictions_out=seen
        )
    ne = click_ne(scores)
    if ne is None:
        return None, None
    before = scores["overall"]["click"]["calibration"]
    if not recalibrate:
        return ne, before
    click = TRAINING_OBJECTIVES.index("click")
    labels = seen["labels"][:, click]
    shifted = recalibrated(seen["probs"], seen["labels"], seen["domain"])
    return float(normalized_entropy(labels, shifted[:, click])), before


def out_of_patience(history: EpochHistory, patience: int | None) -> bool:
    """Whether the last ``patience`` epochs all ran after the best one (on
    validation click NE), so training stops; never without ``patience``."""
    if patience is None or history.best is None:
        return False
    return history.epochs_run - 1 - history.best[1] >= patience


def _epoch(
    cfg: FitConfig,
    recipe: Recipe,
    trainer: FitTrainer,
    train: ExampleDataset,
    epoch: int,
    steps_per_epoch: int,
    history: EpochHistory,
) -> None:
    """One pass over ``train`` in the epoch's seeded order."""
    device = trainer.device
    on_gpu = device.type == "cuda"
    # Sum losses as a tensor: one host sync per epoch, not per step.
    total, steps = torch.zeros((), device=device), 0
    started = time.perf_counter()
    bar = progress(f"epoch {epoch + 1}/{recipe.epochs}", total=steps_per_epoch)
    with bar as epoch_bar:
        for batch in train.batches(
            cfg.batch_size,
            shuffle=True,
            seed=cfg.seed,
            epoch=epoch,
            max_batches=cfg.max_steps_per_epoch,
            pin_memory=on_gpu,
        ):
            if on_gpu:
                batch = batch.to(device, non_blocking=True)
            total += trainer.step(batch)
            steps += 1
            history.seen += batch.size
            epoch_bar.advance()
    if on_gpu:
        torch.cuda.synchronize(device)  # the epoch's time includes its kernels
    history.seconds += time.perf_counter() - started
    history.epochs_run += 1
    history.epoch_loss.append(float(total) / max(steps, 1))


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"
