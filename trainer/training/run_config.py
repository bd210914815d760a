"""What the trainer's commands are told, importable without torch.

The settings of one offline run (:class:`FitConfig`, ``python -m
trainer.fit``) and of one daemon run (:class:`DaemonConfig`, ``python -m
trainer.daemon``), and the names their flags offer. Each field that is a flag
carries its default and, as :func:`features.config_flags.flag` metadata, its help:
the commands generate their flags from the dataclasses, so this module imports nothing
heavy and ``--help`` answers before torch loads.

The name tuples mirror the registries that build the things they name
(:data:`trainer.models.registry.MODEL_NAMES`, :data:`trainer.models.config.PRESETS`,
:mod:`trainer.distributed.sharding`); ``tests/test_trainer_cli.py`` checks
that they agree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from pathlib import Path
from typing import Final

from features.config_flags import flag, flag_field, positive_float, positive_int, share
from trainer.cli import THREADS_HELP
from trainer.data.offset_check import GAP_HELP, GAP_POLICIES
from trainer.export.periodic import ServingExportConfig

PRECISIONS: Final = ("fp32", "bf16")
"""What ``--precision`` takes (the autocast itself: :mod:`trainer.training.device`)."""

LR_SCHEDULES: Final = ("plateau", "constant", "cosine")
"""What ``--lr-schedule`` takes (the rates: :mod:`trainer.training.fit_trainer`)."""

OPTIMIZERS: Final = ("adam", "adam+adagrad")
"""What ``--optimizer`` takes (:func:`trainer.training.fit_trainer.make_optimizer`)."""

MODEL_NAMES: Final = (
    "gem",
    "gem_no_seq",
    "gem_no_interleave",
    "gem_no_pyramid",
    "dlrm",
    "dcnv2",
)
PRESET_NAMES: Final = ("tiny", "default", "large")
SHARDINGS: Final = ("replicated", "model-parallel")
EMBEDDING_OPTIMIZERS: Final = ("auto", "adam", "adagrad", "sgd")
# Pooled tables smaller than this stay replicated under --sharding model-parallel
# (trainer.distributed.model_parallel.DEFAULT_MIN_ROWS).
MIN_SHARDED_ROWS: Final = 1_000
# Both commands train a real model unless told otherwise; the tests and the
# demos that want the unit tests' model pass --preset tiny.
DEFAULT_PRESET: Final = "default"
# The default recipe of trainer.fit: with a validation period, up to
# DEFAULT_MAX_EPOCHS epochs, ended by DEFAULT_PATIENCE epochs in a row that
# do not better it (each halving the rates from the best epoch's weights).
DEFAULT_MAX_EPOCHS: Final = 8
DEFAULT_PATIENCE: Final = 2
DEFAULT_HOLDOUT: Final = 0.1
PRESET_HELP: Final = (
    "model size (tiny: the unit tests'; default: a 2-core CPU's; large: a GPU's)"
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelRunConfig:
    """What every run that trains a model is told: the model, its size, threads."""

    model: str = flag_field("gem", "model to train", choices=MODEL_NAMES)
    preset: str = flag_field(DEFAULT_PRESET, PRESET_HELP, choices=PRESET_NAMES)
    threads: int = flag_field(1, THREADS_HELP, type=positive_int)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitConfig(ModelRunConfig):
    """One offline run: data, model, schedule (``python -m trainer.fit``)."""

    train: Path = field(metadata=flag("feature-job output to train on"))
    eval: Path = field(
        metadata=flag("feature-job output to evaluate the selected epoch on")
    )
    validation: Path | None = flag_field(
        None,
        "feature-job output scored after every epoch; the epoch with the "
        "lowest overall click NE is the one evaluated (default: the "
        "--holdout share of --train)",
    )
    holdout: float = flag_field(
        DEFAULT_HOLDOUT,
        "without --validation: the latest share of --train's examples (by "
        "event time) is the validation period, and trains nothing; 0 "
        "trains on all of --train and evaluates its last epoch",
        type=share,
        metavar="SHARE",
    )
    epochs: int | None = flag_field(
        None,
        f"passes over --train, at most (default: {DEFAULT_MAX_EPOCHS} with "
        "a validation period, which ends the run sooner; 1 without one)",
        type=positive_int,
    )
    batch_size: int = flag_field(256, "examples per step", type=positive_int)
    max_seq_len: int | None = flag_field(
        None, "longest history window (default: the preset's)", type=positive_int
    )
    lr: float = flag_field(1e-3, "learning rate (Adam)", type=positive_float)
    lr_schedule: str = flag_field(
        "plateau",
        "plateau: after an epoch that does not better validation click "
        "NE, go back to the best epoch's weights and halve every rate "
        "(constant without a validation period); cosine: anneal every "
        "rate to 0 over --epochs",
        choices=LR_SCHEDULES,
    )
    embedding_lr: float = flag_field(
        0.05,
        "Adagrad's learning rate for the tables (--optimizer adam+adagrad)",
        type=positive_float,
    )
    optimizer: str = flag_field(
        "adam",
        "adam: one Adam for everything; adam+adagrad: Adagrad for the embedding tables",
        choices=OPTIMIZERS,
    )
    max_grad_norm: float = 10.0
    max_steps_per_epoch: int | None = flag_field(
        None, "stop each epoch after this many steps", type=positive_int
    )
    validation_sample: int | None = None  # score a fixed sample of it (None: all)
    train_ne_sample: int = 10_000  # train examples scored after each epoch
    seed: int = flag_field(0, "model init and epoch order")
    device: str = flag_field("auto", "auto (cuda if torch sees one) | cpu | cuda[:N]")
    precision: str = flag_field(
        "fp32",
        "bf16: autocast the forward on a GPU (ignored on the CPU)",
        choices=PRECISIONS,
    )
    patience: int | None = flag_field(
        None,
        "stop once validation click NE has not improved for N epochs in "
        f"a row (default: {DEFAULT_PATIENCE}; needs a validation period; "
        "the best epoch is still the one evaluated)",
        type=positive_int,
        metavar="N",
    )
    max_train_seconds: float | None = flag_field(
        None, "start no new epoch after this many seconds (a safety net)"
    )
    recalibrate: bool = flag_field(
        True,
        "keep the output biases as trained (by default, with a validation "
        "period, each task's bias is shifted after training so that the "
        "whole period is calibrated, and epochs are chosen on the NE after "
        "that shift)",
    )
    compile: str | None = flag_field(
        None,
        "run the model under torch.compile (inductor when no backend is "
        "given; aot_eager traces without code generation)",
        nargs="?",
        const="inductor",
        metavar="BACKEND",
    )

    def max_epochs(self, validated: bool) -> int:
        """``epochs``, or its default for a run with (or without) a
        validation period."""
        if self.epochs is not None:
            return self.epochs
        return DEFAULT_MAX_EPOCHS if validated else 1

    def stop_after(self, validated: bool) -> int | None:
        """``patience``, or its default with a validation period (None:
        the run does not stop early)."""
        if self.patience is not None:
            return self.patience
        return DEFAULT_PATIENCE if validated else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class DaemonConfig(ModelRunConfig, ServingExportConfig):
    """One daemon run (``python -m trainer.daemon``); its checkpoints are
    exported as serving versions as :class:`ServingExportConfig` says."""

    topic: str = field(metadata=flag("topic of example messages to train from"))
    group: str = flag_field(
        "gem-trainer", "Kafka consumer group (every rank of a run joins it)"
    )
    checkpoint_dir: Path = field(metadata=flag("checkpoints: resumed from, written to"))
    lr: float = flag_field(1e-3, "learning rate", type=positive_float)
    seed: int = flag_field(0, "model init")
    checkpoint_every: int = flag_field(
        50, "steps between checkpoints", type=positive_int
    )
    keep: int = flag_field(3, "newest checkpoints kept", type=positive_int)
    idle_seconds: float | None = flag_field(
        None, "bounded run: stop once no record came for this long", type=positive_float
    )
    max_steps: int | None = flag_field(
        None, "stop after this many steps", type=positive_int
    )
    queue_size: int = 8  # decoded messages buffered ahead of the step
    dead_letter: str | None = flag_field(
        None,
        "where poison messages go: a topic, or a .jsonl file "
        "(default: <topic>.dead-letter)",
    )
    log_every: int = flag_field(10, "steps between metrics records", type=positive_int)
    window_examples: int = flag_field(
        2000, "examples in the recent-window metrics", type=positive_int
    )
    metrics_jsonl: Path | None = flag_field(
        None,
        "append a JSON metrics record there every --log-every steps",
        metavar="FILE",
    )
    prometheus_port: int = flag_field(
        0, "serve Prometheus metrics on this port (0: off)"
    )
    metrics_address: str = flag_field(
        "127.0.0.1",
        "address the Prometheus endpoint listens on (0.0.0.0: every interface)",
    )
    start_fresh: bool = flag_field(
        False,
        "when no checkpoint in --checkpoint-dir verifies, train a new model "
        "from the topic's earliest offsets instead of refusing to start",
    )
    on_offset_gap: str = flag_field("stop", GAP_HELP, choices=GAP_POLICIES)
    tensorboard_dir: Path | None = flag_field(
        None, "write TensorBoard event files there", name="--tensorboard"
    )
    plot: Path | None = flag_field(
        None, "PNG of the progressive-NE curves, written at the end", metavar="FILE"
    )
    device: str = flag_field("auto", "auto: this rank's GPU if any, else cpu")
    prior_click_rate: float = flag_field(0.02, "click rate every output starts at")
    prior_conversion_rate: float = flag_field(
        0.002, "conversion rate every output starts at"
    )
    sharding: str = flag_field(
        "replicated",
        "replicated: every rank holds all tables; model-parallel: TorchRec "
        "shards the tables",
        choices=SHARDINGS,
    )
    embedding_optimizer: str = flag_field(
        "auto",
        "auto: adam (with the dense part) when replicated, adagrad when "
        "model-parallel (fbgemm's fused CPU kernel has no Adam)",
        choices=EMBEDDING_OPTIMIZERS,
    )
    embedding_lr: float | None = flag_field(
        None, "the tables' learning rate (default: --lr)", type=positive_float
    )
    min_sharded_rows: int = flag_field(
        MIN_SHARDED_ROWS,
        "model-parallel: pooled tables with fewer rows stay replicated",
    )
