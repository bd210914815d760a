"""``python -m trainer.fit``: the flags, then the run (:mod:`trainer.training.fit`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from features.cli import CommandError, CommandParser, run_command
from trainer.cli import (
    add_config_flags,
    config_fields,
    feature_dir,
    positive_float,
    positive_int,
)
from trainer.training.run_config import MODEL_NAMES, PRESET_NAMES, FitConfig

DESCRIPTION = """\
Train a model on one feature-job output and evaluate it on another.

--train, --validation and --eval are folders of examples + timelines, as
pipelines.build writes one and python -m trainer.data.split cuts one into three
time periods. The report (--metrics-out) holds NE / AUC / calibration
per (domain, objective); --save writes the trained model as a checkpoint that
carries its configuration (what python -m trainer.distill reads)."""

HELPS = {
    "train": "feature-job output to train on",
    "eval": "feature-job output to evaluate the selected epoch on",
    "validation": "feature-job output scored after every epoch; the epoch with "
    "the lowest overall click NE is the one evaluated",
    "model": "model to train",
    "preset": "model size (tiny: the unit tests'; default: a 2-core CPU's; "
    "large: a GPU's)",
    "epochs": "passes over --train",
    "batch_size": "examples per step",
    "max_seq_len": "longest history window (default: the preset's)",
    "lr": "learning rate (Adam)",
    "lr_schedule": "cosine: anneal every learning rate to 0 over the run",
    "embedding_lr": "Adagrad's learning rate for the tables (--optimizer adam+adagrad)",
    "optimizer": "adam: one Adam for everything; adam+adagrad: Adagrad for the "
    "embedding tables",
    "max_steps_per_epoch": "stop each epoch after this many steps",
    "seed": "model init and epoch order",
    "threads": "torch intra-op threads",
    "device": "auto (cuda if torch sees one) | cpu | cuda[:N]",
    "precision": "bf16: autocast the forward on a GPU (ignored on the CPU)",
    "max_train_seconds": "start no new epoch after this many seconds (a safety net)",
    "recalibrate": "after training, shift each task's output bias so the whole "
    "validation period is calibrated (needs --validation)",
}


def build_parser() -> CommandParser:
    """The flags of ``python -m trainer.fit``."""
    parser = CommandParser("trainer.fit", DESCRIPTION)
    add_config_flags(
        parser,
        FitConfig,
        HELPS,
        choices={
            "model": MODEL_NAMES,
            "preset": PRESET_NAMES,
            "lr_schedule": ("constant", "cosine"),
            "optimizer": ("adam", "adam+adagrad"),
            "precision": ("fp32", "bf16"),
        },
        kinds={
            "epochs": positive_int,
            "batch_size": positive_int,
            "max_seq_len": positive_int,
            "max_steps_per_epoch": positive_int,
            "threads": positive_int,
            "lr": positive_float,
            "embedding_lr": positive_float,
        },
    )
    parser.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        default=None,
        metavar="BACKEND",
        help="run the model under torch.compile (inductor when no backend is "
        "given; aot_eager traces without code generation)",
    )
    parser.add_argument(
        "--metrics-out",
        type=Path,
        required=True,
        metavar="FILE",
        help="where the JSON report goes",
    )
    parser.add_argument(
        "--save",
        type=Path,
        metavar="DIR",
        help="write the evaluated model there as a checkpoint that carries its "
        "configuration (a folder of its own: a checkpoint there is replaced)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Check the input, train, write the report (and the checkpoint)."""
    cfg = FitConfig(**config_fields(args, FitConfig))
    if cfg.recalibrate and cfg.validation is None:
        raise CommandError("--recalibrate needs --validation", "add --validation DIR")
    feature_dir("--train", cfg.train)
    feature_dir("--eval", cfg.eval)
    if cfg.validation is not None:
        feature_dir("--validation", cfg.validation)
    from features.memory import reuse_freed_memory
    from trainer.training import fit

    # Each step frees and re-allocates the same buffers: keep them (features.memory).
    reuse_freed_memory()
    train, evals, validation = fit.load_datasets(cfg)
    report = fit.fit(
        cfg,
        train_data=train,
        eval_data=evals,
        validation_data=validation,
        save_dir=args.save,
    )
    args.metrics_out.parent.mkdir(parents=True, exist_ok=True)
    args.metrics_out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(fit.format_table(report))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.fit`` (see :data:`DESCRIPTION`)."""
    return run_command(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
