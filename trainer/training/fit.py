"""Train a model on one feature-job output and evaluate it on another.

Usage: ``python -m trainer.fit --help`` (the flags live in
:mod:`trainer.fit`; this module is the training they run, with the model,
optimizer and schedule of :class:`~trainer.training.fit_trainer.FitTrainer`,
the epochs of :mod:`trainer.training.epochs` and the metrics of
:mod:`trainer.training.evaluation`).

``DIR`` is a feature-job ``--output`` dir (examples + timelines, see
:mod:`trainer.data.feature_output`). Metrics: NE, AUC and calibration per
(domain, objective) and per objective over all domains.

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

Recalibration, with a validation period and without ``--no-recalibrate``:
after the best epoch is restored, each (domain, objective) output bias is
shifted so that the *whole* validation period's predicted positives equal its
observed ones (:mod:`trainer.metrics.calibration`); rankings stay as they are,
the shifts are in the report. Epochs are then chosen on the validation NE after
the shifts fitted on that period (:mod:`trainer.training.epochs`).

``--max-train-seconds``: a wall-clock safety net for shared or leased
machines: no new epoch starts once the limit has passed (the report says
how many epochs ran); the epoch budget, not the clock, is the comparison
rule between models.

``--compile [BACKEND]``: the model runs under ``torch.compile`` (default
backend ``inductor``; ``aot_eager`` traces without generating code), set up
by :func:`trainer.training.step.compile_model` so that every batch's jagged
sizes reuse one graph. Train and eval mode, and a smaller last batch, each
compile once more. Worth it on a GPU. On a CPU GEM's step is faster compiled
at batch 256 and slower at 1,024, and each compile takes minutes, so it pays
only in long runs of small batches (``benchmarks/README.md``, model speed).

``--save DIR``: the model evaluated (the selected epoch, recalibrated unless
told not to) is written as a :mod:`trainer.training.checkpoint` file in ``DIR``,
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
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from features.cli import CommandError
from features.json_report import json_safe
from features.vocab import DOMAINS, TRAINING_OBJECTIVES
from trainer.cli import unreadable
from trainer.data.feature_output import ExampleDataset, event_time_ms
from trainer.models.config import ModelConfig
from trainer.models.config import preset as preset_config
from trainer.models.registry import model_config
from trainer.training.checkpoint import model_record, save_checkpoint
from trainer.training.device import (
    autocast_for,
    effective_precision,
    resolve_device,
)
from trainer.training.epochs import Recipe, has_clicks, train_epochs
from trainer.training.evaluation import evaluate_dataset, recalibrate
from trainer.training.fit_trainer import FitTrainer
from trainer.training.run_config import FitConfig


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


def fit(
    cfg: FitConfig,
    *,
    base_config: ModelConfig | None = None,
    train_data: ExampleDataset | None = None,
    eval_data: ExampleDataset | None = None,
    validation_data: ExampleDataset | None = None,
    predictions_out: dict[str, np.ndarray] | None = None,
    save_dir: Path | None = None,
    artifacts_dir: Path | None = None,
) -> dict[str, Any]:
    """Train, evaluate, return the metrics report (what ``--metrics-out`` holds).

    ``base_config`` replaces the preset (benchmarks' custom sizes); datasets
    may be passed in to share one in-memory copy between runs;
    ``predictions_out`` receives the eval predictions (see
    :func:`~trainer.training.evaluation.evaluate_dataset`); ``save_dir``
    receives the evaluated model as a checkpoint (:func:`save_fitted`), whose
    path the report names, and ``artifacts_dir`` its serving artifact
    (:func:`trainer.export.writers.write_fitted`).
    """
    device, autocast = _start_torch(cfg)
    config = resolved_model_config(cfg, base_config)
    seq_len = config.embedding.max_seq_len
    train = train_data
    if train is None:
        train = ExampleDataset(cfg.train, max_seq_len=seq_len)
    evals = eval_data
    if evals is None:
        evals = ExampleDataset(cfg.eval, max_seq_len=seq_len)
    train, validation, validation_source = _validation_period(
        cfg, train, validation_data, seq_len
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
    recipe = Recipe(
        epochs=epochs,
        patience=cfg.stop_after(validated=validation is not None),
        plateau=cfg.lr_schedule == "plateau" and validation is not None,
        recalibrate=cfg.recalibrate and validation is not None,
    )
    history = train_epochs(cfg, recipe, trainer, train, validation, steps_per_epoch)
    if history.best is not None:
        trainer.restore(history.best[2])
    shifts = None
    if recipe.recalibrate:
        assert validation is not None
        shifts = recalibrate(trainer.model, validation, autocast)
    with autocast:
        metrics = evaluate_dataset(
            trainer.model, evals, predictions_out=predictions_out
        )
    saved, exported = write_outputs(
        save_dir, artifacts_dir, trainer, cfg, config, train, shifts
    )
    report = {
        "checkpoint": saved,
        "artifact": exported,
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
            "validation": validation_source,
            "recalibrate": recipe.recalibrate,
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


def _start_torch(cfg: FitConfig) -> tuple[torch.device, torch.autocast]:
    """Threads, seed and device for the run, and its autocast context."""
    # One intra-op thread by default: these models are many small ops, and on
    # a small shared CPU OpenMP's barriers between two threads cost more than
    # they save.
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return device, autocast_for(device, cfg.precision)


def _validation_period(
    cfg: FitConfig,
    train: ExampleDataset,
    given: ExampleDataset | None,
    seq_len: int,
) -> tuple[ExampleDataset, ExampleDataset | None, str | None]:
    """The training set, the validation period and where that came from (the
    report's ``recipe.validation``): the caller, ``--validation``, the latest
    examples of ``--train`` (``--holdout``), or none."""
    validation, source = given, None if given is None else "given"
    if validation is None and cfg.validation is not None:
        validation = ExampleDataset(cfg.validation, max_seq_len=seq_len)
        source = str(cfg.validation)
    if validation is None and cfg.holdout > 0:
        train, validation, held_out_from = hold_out_latest(train, cfg.holdout)
        source = f"holdout of --train from {held_out_from} ms"
    if cfg.patience is not None and validation is None:
        raise ValueError("--patience needs a validation period")
    if validation is not None and not has_clicks(validation):
        print(
            "the validation period holds no click: no epoch is chosen on it "
            "(the last one is evaluated, and the run does not stop early)",
            file=sys.stderr,
        )
    return train, validation, source


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _fixed(schedule: str) -> str:
    # Without a validation period the plateau schedule has nothing to watch.
    return "constant" if schedule == "plateau" else schedule


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


def write_outputs(
    save_dir: Path | None,
    artifacts_dir: Path | None,
    trainer: FitTrainer,
    cfg: FitConfig,
    config: ModelConfig,
    train: ExampleDataset,
    shifts: dict[str, float] | None,
) -> tuple[str | None, str | None]:
    """The checkpoint and the serving artifact, each where asked; their paths."""
    saved = exported = None
    trained_until_ms = int(event_time_ms(train.examples).max(initial=0))
    if save_dir is not None:
        saved = save_fitted(
            save_dir, trainer, cfg, config, trained_until_ms=trained_until_ms
        )
    if artifacts_dir is not None:
        exported = export_fitted(
            artifacts_dir,
            trainer,
            cfg,
            config,
            trained_until_ms=trained_until_ms,
            calibration={"method": "recalibrated", "shifts": shifts}
            if shifts is not None
            else {"method": "as trained"},
            checkpoint=saved,
        )
    return saved, exported


def export_fitted(
    artifacts: Path,
    trainer: FitTrainer,
    cfg: FitConfig,
    config: ModelConfig,
    *,
    trained_until_ms: int,
    calibration: dict[str, Any],
    checkpoint: str | None,
) -> str:
    """Write the evaluated model's serving artifact; returns its folder."""
    from trainer.export.writers import write_fitted

    trainer.eager.eval()
    path = write_fitted(
        artifacts,
        trainer.eager,
        model_config=json_safe(model_record(cfg.model, cfg.preset, config)),
        max_seq_len=config.embedding.max_seq_len,
        trained_to={
            "step": trainer.steps,
            "trained_until_ms": trained_until_ms,
            "offsets": {},
        },
        calibration=json_safe(calibration),
        source={"command": "trainer.fit", "checkpoint": checkpoint},
    )
    return str(path)


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
