"""Train a model on one feature-job output and evaluate it on another.

Usage: ``python -m trainer.fit --help`` (the flags live in
:mod:`trainer.fit`; this module is the training they run, with the model,
optimizer and schedule of :class:`~trainer.training.fit_trainer.FitTrainer`).

``DIR`` is a feature-job ``--output`` dir (examples + timelines, see
:mod:`trainer.data.feature_output`). Metrics (:mod:`features.metrics`): NE
normalized by the entropy of the *eval slice's own* base rate (TorchRec's
convention, ``docs/model.md``), AUC, calibration = predicted / observed
positives; per (domain, objective) and per objective over all domains. Each
example is scored by its own domain's head.

Model selection: with ``--validation DIR`` (a time period after the train
period and before the eval one), the model is scored on it after every epoch
and the epoch with the lowest overall click NE there is the one evaluated
(early stopping by validation; the eval set is never looked at to choose).
``--patience N`` also stops the run once ``N`` epochs in a row have not
bettered that best (the report says ``stopped_early``), so ``--epochs`` can
be a ceiling rather than a guess. Each epoch's train NE (on a fixed sample
of train examples, in eval mode) and validation NE are reported, so under-
and over-fitting show as numbers.

Every model's output starts at the logit of the train base rate of its
(domain, objective). One torch thread by default (``--threads``): faster on
a small shared CPU, and reproducible.

Device: ``--device auto`` (the default) trains on the GPU when torch sees
one, else on the CPU. On a GPU, batches are still built by numpy on the
prefetch thread, pinned there, and copied non-blocking; every model runs its
pure-PyTorch jagged path there unless fbgemm's CUDA build is installed
(:mod:`trainer.ops.kernel` decides per call). ``--precision bf16`` runs the
forward under bf16 autocast (GPU only); the default ``fp32`` keeps the
logits exact, which the NE/calibration comparisons between models want
(TF32 matmuls are allowed on the GPU either way).

``--recalibrate`` (with ``--validation``): after the best epoch is restored,
each (domain, objective) output bias is shifted so that the *whole*
validation period's predicted positives equal its observed ones
(:mod:`trainer.metrics.calibration`); rankings stay as they are, the shifts are
in the report.

``--max-train-seconds``: a wall-clock safety net for shared or leased
machines: no new epoch starts once the limit has passed (the report says
how many epochs ran); the epoch budget, not the clock, is the comparison
rule between models.

``--compile [BACKEND]``: the model runs under ``torch.compile`` (default
backend ``inductor``; ``aot_eager`` traces without generating code), set up
by :func:`trainer.training.step.compile_model` so that every batch's jagged
sizes reuse one graph. Train and eval mode, and a smaller last batch, each
compile once more. Worth it on a GPU; on a CPU only once the first steps
have paid for the compile (``benchmarks/README.md``).

``--save DIR``: the model evaluated (the selected epoch, recalibrated when
asked) is written as a :mod:`trainer.training.checkpoint` file in ``DIR``,
with its model name, preset and :class:`~trainer.models.config.ModelConfig`
(:func:`trainer.training.checkpoint.model_record`), so distillation reads the
teacher's configuration from it.

Deterministic for a seed (on the CPU): the model init
(``torch.manual_seed``), the epoch order (``(seed, epoch)``-seeded
permutation) and the row order on disk (sorted on read) are all fixed; CPU
kernels are deterministic at a fixed thread count.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from features.cli import CommandError, progress
from features.json_report import json_safe
from features.metrics import binary_metrics
from features.vocab import DOMAINS, TRAINING_OBJECTIVES
from trainer.cli import unreadable
from trainer.data.feature_output import ExampleDataset, event_time_ms
from trainer.metrics.calibration import calibration_shifts
from trainer.models.base_rate import BaseRateOffset
from trainer.models.config import ModelConfig
from trainer.models.config import preset as preset_config
from trainer.models.loss_wrapper import GEMTrain
from trainer.models.registry import model_config
from trainer.training.checkpoint import model_record, save_checkpoint
from trainer.training.device import (
    autocast_for,
    effective_precision,
    resolve_device,
)
from trainer.training.fit_trainer import FitTrainer
from trainer.training.run_config import FitConfig
from trainer.training.step import (
    collect_predictions,
    eval_step,
)


def resolved_model_config(
    cfg: FitConfig, base: ModelConfig | None = None
) -> ModelConfig:
    """The preset (or ``base``) with the ablation flags and ``max_seq_len``."""
    config = model_config(cfg.model, base or preset_config(cfg.preset))
    if cfg.max_seq_len is not None:
        embedding = dataclasses.replace(config.embedding, max_seq_len=cfg.max_seq_len)
        config = dataclasses.replace(config, embedding=embedding)
    return config


def base_rate_logits(data: ExampleDataset, smoothing: float = 1.0) -> torch.Tensor:
    """(Dm, O) logit of each (domain, objective)'s smoothed training base rate."""
    labels = torch.stack(
        [
            torch.from_numpy(
                data.examples.column(f"label_{o}").to_numpy().astype(np.float64)
            )
            for o in TRAINING_OBJECTIVES
        ],
        dim=1,
    )
    domain = torch.from_numpy(np.array(data.examples.column("domain").to_numpy())) - 1
    out = torch.zeros(len(DOMAINS), len(TRAINING_OBJECTIVES))
    for d in range(len(DOMAINS)):
        rows = labels[domain == d]
        rate = (rows.sum(0) + smoothing) / (rows.shape[0] + 2 * smoothing)
        out[d] = torch.logit(rate).float()
    return out


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


def fit(
    cfg: FitConfig,
    *,
    base_config: ModelConfig | None = None,
    train_data: ExampleDataset | None = None,
    eval_data: ExampleDataset | None = None,
    validation_data: ExampleDataset | None = None,
    predictions_out: dict[str, np.ndarray] | None = None,
    save_dir: Path | None = None,
) -> dict[str, Any]:
    """Train, evaluate, return the metrics report (what ``--metrics-out`` holds).

    ``base_config`` replaces the preset (benchmarks' custom sizes); datasets
    may be passed in to share one in-memory copy between runs;
    ``predictions_out`` receives the eval predictions (see
    :func:`evaluate_dataset`); ``save_dir`` receives the evaluated model as a
    checkpoint (:func:`save_fitted`), whose path the report names.
    """
    # One intra-op thread by default: these models are many small ops, and on
    # a small shared CPU OpenMP's barriers between two threads cost more than
    # they save.
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    autocast = autocast_for(device, cfg.precision)
    config = resolved_model_config(cfg, base_config)
    seq_len = config.embedding.max_seq_len
    train = train_data
    if train is None:
        train = ExampleDataset(cfg.train, max_seq_len=seq_len)
    evals = eval_data
    if evals is None:
        evals = ExampleDataset(cfg.eval, max_seq_len=seq_len)
    validation = validation_data
    if validation is None and cfg.validation is not None:
        validation = ExampleDataset(cfg.validation, max_seq_len=seq_len)
    held_out_from = None
    if validation is None and cfg.holdout > 0:
        train, validation, held_out_from = hold_out_latest(train, cfg.holdout)
    chooses = {"--recalibrate": cfg.recalibrate, "--patience": cfg.patience}
    for name, asked in chooses.items():
        if asked and validation is None:
            raise ValueError(f"{name} needs a validation period")
    if validation is not None and not _has_clicks(validation):
        print(
            "the validation period holds no click: no epoch is chosen on it "
            "(the last one is evaluated, and the run does not stop early)",
            file=sys.stderr,
        )
    epochs = cfg.max_epochs(validated=validation is not None)
    steps_per_epoch = -(-len(train) // cfg.batch_size)
    if cfg.max_steps_per_epoch is not None:
        steps_per_epoch = min(steps_per_epoch, cfg.max_steps_per_epoch)
    trainer = FitTrainer(
        cfg,
        config,
        base_rate_logits(train),
        device,
        autocast,
        total_steps=max(1, epochs * steps_per_epoch),
    )
    recipe = _Recipe(
        epochs=epochs,
        patience=cfg.stop_after(validated=validation is not None),
        plateau=cfg.lr_schedule == "plateau" and validation is not None,
    )
    history = _train_epochs(cfg, recipe, trainer, train, validation, steps_per_epoch)
    if history.best is not None:
        trainer.restore(history.best[2])
    shifts = None
    if cfg.recalibrate and validation is not None:
        shifts = recalibrate(trainer.model, validation, autocast)
    with autocast:
        metrics = evaluate_dataset(
            trainer.model, evals, predictions_out=predictions_out
        )
    saved = None
    if save_dir is not None:
        saved = save_fitted(
            save_dir,
            trainer,
            cfg,
            config,
            trained_until_ms=int(event_time_ms(train.examples).max(initial=0)),
        )
    report = {
        "checkpoint": saved,
        "config": {
            "fit": dataclasses.asdict(cfg),
            "model": dataclasses.asdict(config),
            "parameters": sum(p.numel() for p in trainer.model.parameters()),
            "output_bias_init": "logit of the train base rate per task",
            "torch_threads": torch.get_num_threads(),
            "device": _device_name(device),
            "precision": effective_precision(device, cfg.precision),
        },
        "recipe": {
            "epochs": recipe.epochs,
            "patience": recipe.patience,
            "lr_schedule": "plateau" if recipe.plateau else _fixed(cfg.lr_schedule),
            # Where the validation period came from: a folder, the latest
            # examples of --train (from that event time on), or the caller.
            "validation": (
                None
                if validation is None
                else str(cfg.validation)
                if cfg.validation is not None
                else "given"
                if held_out_from is None
                else f"holdout of --train from {held_out_from} ms"
            ),
        },
        "train": {
            "examples": len(train),
            **history.report(),
            "recalibration_shifts": shifts,
        },
        "eval_examples": len(evals),
        **metrics,
    }
    return json_safe(report)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


@dataclasses.dataclass
class _History:
    """What the epochs did: the report's ``train`` section, and the best
    epoch's weights when a validation set chose one."""

    epoch_loss: list[float] = dataclasses.field(default_factory=list)
    train_ne: list[float | None] = dataclasses.field(default_factory=list)
    validation_ne: list[float | None] = dataclasses.field(default_factory=list)
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
class _Recipe:
    """What the run does between epochs, its defaults resolved: how many at
    most, when to stop, and whether a worse epoch halves the rates."""

    epochs: int
    patience: int | None
    plateau: bool


def _has_clicks(data: ExampleDataset) -> bool:
    return bool(pc.sum(data.examples.column("label_click")).as_py())


def _fixed(schedule: str) -> str:
    # Without a validation period the plateau schedule has nothing to watch.
    return "constant" if schedule == "plateau" else schedule


def _train_epochs(
    cfg: FitConfig,
    recipe: _Recipe,
    trainer: FitTrainer,
    train: ExampleDataset,
    validation: ExampleDataset | None,
    steps_per_epoch: int,
) -> _History:
    """Every epoch (until ``max_train_seconds`` or patience), each scored on
    a fixed sample of train rows and on validation; the best on validation
    is kept, and under the plateau schedule an epoch that does not better
    it goes back to it at half the rates."""
    # A fixed sample of train rows, scored after each epoch (train NE).
    train_rows = _sample(len(train), cfg.train_ne_sample, [cfg.seed, 7])
    history = _History()
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
        history.train_ne.append(_click_ne(scores))
        line = f"epoch {epoch}: mean train loss {history.epoch_loss[-1]:.5f}"
        line += f", train click NE {_fmt(history.train_ne[-1])}"
        improved = False
        if validation is not None:
            with trainer.autocast:
                scores = evaluate_dataset(
                    trainer.model, validation, rows=validation_rows
                )
            score = _click_ne(scores)
            history.validation_ne.append(score)
            line += f", validation click NE {_fmt(score)}"
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


def out_of_patience(history: _History, patience: int | None) -> bool:
    """Whether the last ``patience`` epochs all ran after the best one (on
    validation click NE), so training stops; never without ``patience``."""
    if patience is None or history.best is None:
        return False
    return history.epochs_run - 1 - history.best[1] >= patience


def _epoch(
    cfg: FitConfig,
    recipe: _Recipe,
    trainer: FitTrainer,
    train: ExampleDataset,
    epoch: int,
    steps_per_epoch: int,
    history: _History,
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


def load_datasets(
    cfg: FitConfig, base_config: ModelConfig | None = None
) -> tuple[ExampleDataset, ExampleDataset, ExampleDataset | None]:
    """The train, eval and validation (None without one) sets of ``cfg``,
    read once (the ``*_data`` arguments of :func:`fit`); a file that does not
    parse is a :class:`~features.cli.CommandError` naming its flag."""
    seq_len = resolved_model_config(cfg, base_config).embedding.max_seq_len

    def read(flag: str, path: Path) -> ExampleDataset:
        try:
            return ExampleDataset(path, max_seq_len=seq_len)
        except FileNotFoundError:
            raise
        except (pa.ArrowException, OSError) as error:
            raise unreadable(flag, path, error) from error

    validation = cfg.validation
    return (
        read("--train", cfg.train),
        read("--eval", cfg.eval),
        None if validation is None else read("--validation", validation),
    )


def hold_out_latest(
    data: ExampleDataset, share: float
) -> tuple[ExampleDataset, ExampleDataset, int]:
    """``data`` before the event time from which ``share`` of its examples
    lie, those examples, and that time (epoch ms): the validation period a
    run without one sets apart from its training data, latest last as a
    split's would be."""
    fix = "pass --validation DIR, or --holdout 0 to choose nothing"
    times = np.sort(event_time_ms(data.examples))
    if times.size == 0:
        raise CommandError("--holdout: --train holds no examples", fix)
    cut = int(times[min(int((1 - share) * times.size), times.size - 1)])
    train, validation = data.split_at(cut)
    if len(train) == 0:
        raise CommandError(
            f"--holdout {share:g}: every example of --train is at or after the "
            "holdout's first impression time",
            fix,
        )
    return train, validation, cut


def save_fitted(
    directory: Path,
    trainer: FitTrainer,
    cfg: FitConfig,
    config: ModelConfig,
    *,
    trained_until_ms: int,
) -> str:
    """Write the trained model (the ``BaseRateOffset``-wrapped one, not
    compiled) in the daemon's checkpoint format; returns the path.

    The state dict is ``GEMTrain``'s (``model.``-prefixed), what
    :func:`trainer.distill.teacher.load_teacher` and the daemon load.
    """
    path = save_checkpoint(
        directory,
        {
            **trainer.state_dict(),
            "offsets": {},
            "trained_until_ms": trained_until_ms,
            "fit": json_safe(dataclasses.asdict(cfg)),
            **model_record(cfg.model, cfg.preset, config),
        },
        keep=1,
    )
    print(f"saved the model to {path}", file=sys.stderr)
    return str(path)


def recalibrate(
    model: GEMTrain, validation: ExampleDataset, autocast: torch.autocast
) -> dict[str, float]:
    """Shift the model's output biases to calibrate it on all of ``validation``.

    Returns the shifts by ``"domain/objective"`` (logits).
    """
    offsets = model.model
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


def _click_ne(metrics: dict[str, Any]) -> float | None:
    """Overall click NE of an :func:`evaluate_dataset` result (None: no clicks)."""
    ne = metrics["overall"].get("click", {}).get("ne")
    return None if ne is None or not math.isfinite(ne) else float(ne)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def format_table(report: dict[str, Any]) -> str:
    """The report's metrics as a fixed-width table."""
    head = f"{'slice':<22}{'count':>9}{'pos':>7}{'NE':>8}{'AUC':>8}{'calib':>8}"
    rows = [head, "-" * len(head)]
    items = list(report["by_task"].items()) + [
        (f"all/{o}", m) for o, m in report["overall"].items()
    ]
    for name, m in items:
        ne, auc, cal = (
            m[k] if m[k] is not None else math.nan for k in ("ne", "auc", "calibration")
        )
        rows.append(
            f"{name:<22}{m['count']:>9}{m['positives']:>7}{ne:>8.4f}{auc:>8.4f}{cal:>8.3f}"
        )
    t = report["train"]
    rows.append(
        f"train: {t['examples_seen']} examples in {t['seconds']:.1f} s "
        f"({t['examples_per_s'] or 0:.0f} ex/s), epoch loss {t['epoch_loss']}"
    )
    if t.get("epoch_validation_click_ne"):
        rows.append(
            f"validation click NE by epoch {t['epoch_validation_click_ne']}, "
            f"selected epoch {t['selected_epoch']}"
        )
    return "\n".join(rows)
