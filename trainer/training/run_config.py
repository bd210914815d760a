"""What the trainer's commands are told, importable without torch.

The settings of one offline run (:class:`FitConfig`, ``python -m
trainer.fit``) and of one daemon run (:class:`DaemonConfig`, ``python -m
trainer.daemon``), and the names their flags offer. The dataclasses are the
single source of the defaults: the commands build their flags from the
fields (:mod:`trainer.cli`), so this module imports nothing
heavy and ``--help`` answers before torch loads.

The name tuples mirror the registries that build the things they name
(:data:`trainer.models.registry.MODEL_NAMES`, :data:`trainer.models.config.PRESETS`,
:mod:`trainer.distributed.sharding`, :data:`trainer.distill.student.STUDENT_PRESETS`);
``tests/test_trainer_cli.py`` checks that they agree.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Final

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
STUDENT_NAMES: Final = ("dlrm_small", "dlrm_tiny")
# trainer.distributed.sharding.DEFAULT_MIN_ROWS: pooled tables smaller than this stay
# replicated under --sharding model-parallel.
MIN_SHARDED_ROWS: Final = 1_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitConfig:
    """One offline run: data, model, schedule (``python -m trainer.fit``)."""

    train: Path
    eval: Path
    model: str = "gem"
    preset: str = "tiny"
    epochs: int = 1
    batch_size: int = 256
    max_seq_len: int | None = None  # None: the preset's
    lr: float = 1e-3
    lr_schedule: str = "constant"  # constant | cosine (to 0 over the run)
    embedding_lr: float = 0.05  # Adagrad's, with --optimizer adam+adagrad
    optimizer: str = "adam"
    max_grad_norm: float = 10.0
    max_steps_per_epoch: int | None = None
    validation: Path | None = None  # per-epoch selection set (before eval)
    validation_sample: int | None = None  # score a fixed sample of it (None: all)
    train_ne_sample: int = 10_000  # train examples scored after each epoch
    seed: int = 0
    threads: int = 1
    device: str = "auto"  # auto: cuda if available, else cpu
    precision: str = "fp32"  # fp32 | bf16 (autocast, GPU only)
    max_train_seconds: float | None = None  # no new epoch after this
    recalibrate: bool = False  # shift output biases to calibrate on validation
    compile: str | None = None  # a torch.compile backend (inductor, ...); None: eager


@dataclasses.dataclass(frozen=True, kw_only=True)
class DaemonConfig:
    """One daemon run (``python -m trainer.daemon``)."""

    topic: str
    checkpoint_dir: Path
    group: str = "gem-trainer"
    model: str = "gem"
    preset: str = "default"
    lr: float = 1e-3
    seed: int = 0
    checkpoint_every: int = 50
    keep: int = 3
    idle_seconds: float | None = None
    max_steps: int | None = None
    queue_size: int = 8
    dead_letter: str | None = None
    log_every: int = 10
    window_examples: int = 2000
    metrics_jsonl: Path | None = None
    prometheus_port: int = 0
    metrics_address: str = "127.0.0.1"
    start_fresh: bool = False
    tensorboard_dir: Path | None = None
    plot: Path | None = None
    prior_click_rate: float = 0.02
    prior_conversion_rate: float = 0.002
    device: str = "auto"
    sharding: str = "replicated"
    embedding_optimizer: str = "auto"
    embedding_lr: float | None = None
    min_sharded_rows: int = MIN_SHARDED_ROWS
