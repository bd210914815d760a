"""``python -m trainer.fit``: the flags, then the run (:mod:`trainer.training.fit`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path

from features.cli import CommandError, CommandParser, run_command
from features.config_flags import config_fields, flag, flag_field
from trainer.cli import REPORT_HELP, feature_dir, start_torch
from trainer.training.run_config import DEFAULT_MAX_EPOCHS, DEFAULT_PATIENCE, FitConfig

DESCRIPTION = f"""\
Train a model on one feature-job output and evaluate it on another.

--train, --validation and --eval are folders of examples + timelines, as
pipelines.build writes one and python -m trainer.data.split cuts one into
three time periods; without --validation the latest --holdout share of
--train is the validation period. With no tuning flag the recipe is: up to
{DEFAULT_MAX_EPOCHS} epochs, each scored on validation; an epoch that does
not better it goes back to the best one at half the rate, {DEFAULT_PATIENCE}
such epochs in a row end the run, and the best epoch is the one evaluated,
its output biases shifted so that the validation period is calibrated
(epochs are compared after that shift; --no-recalibrate keeps them).
The report (--metrics-out) holds NE / AUC / calibration per (domain,
objective); --save writes the trained model as a checkpoint that
carries its configuration (what python -m trainer.distill reads)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitOutputs:
    """Where ``python -m trainer.fit`` writes what it made."""

    metrics_out: Path = field(metadata=flag(REPORT_HELP, metavar="FILE"))
    save: Path | None = flag_field(
        None,
        "write the evaluated model there as a checkpoint that carries its "
        "configuration (a folder of its own: a checkpoint there is replaced), "
        "and its serving artifact under --artifacts",
    )
    artifacts: Path | None = flag_field(
        None,
        "serving artifacts root for --save's model (ARTIFACTS/gem, "
        "features.serving_artifacts); default SAVE/serving",
    )


def build_parser() -> CommandParser:
    """The flags of ``python -m trainer.fit``."""
    return CommandParser("trainer.fit", DESCRIPTION, configs=[FitConfig, FitOutputs])


def run(args: argparse.Namespace) -> int:
    """Check the input, train, write the report (and the checkpoint)."""
    cfg = FitConfig(**config_fields(args, FitConfig))
    outputs = FitOutputs(**config_fields(args, FitOutputs))
    if cfg.patience is not None and cfg.validation is None and cfg.holdout == 0:
        raise CommandError(
            "--patience needs a validation period",
            "add --validation DIR, or a --holdout share above 0",
        )
    feature_dir("--train", cfg.train)
    feature_dir("--eval", cfg.eval)
    if cfg.validation is not None:
        feature_dir("--validation", cfg.validation)
    start_torch(cfg.threads)
    from trainer.training import fit

    train, evals, validation = fit.load_datasets(cfg)
    report = fit.fit(
        cfg,
        train_data=train,
        eval_data=evals,
        validation_data=validation,
        save_dir=outputs.save,
        artifacts_dir=outputs.artifacts
        or (outputs.save / "serving" if outputs.save else None),
    )
    outputs.metrics_out.parent.mkdir(parents=True, exist_ok=True)
    outputs.metrics_out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(fit.format_table(report))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.fit`` (see :data:`DESCRIPTION`)."""
    return run_command(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
