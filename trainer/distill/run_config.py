"""What the distillation commands are told, importable without torch.

:class:`DistillConfig` is one student run (``python -m trainer.distill``
trains one per domain with it), :class:`StudentDaemonConfig` one student
daemon (``python -m trainer.distill.daemon``). Each field that is a flag
carries its default and, as :func:`features.config_flags.flag` metadata, its help:
the commands generate their flags from these dataclasses before torch loads.

:data:`STUDENT_NAMES` mirrors :data:`trainer.distill.student.STUDENT_PRESETS`
(``tests/test_trainer_cli.py`` checks that they agree).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import field
from pathlib import Path
from typing import Final

from features.config_flags import flag, flag_field, positive_float, positive_int
from features.vocab import DOMAINS
from trainer.cli import CHECKPOINT_HELP, THREADS_HELP
from trainer.data.offset_check import GAP_HELP, GAP_POLICIES
from trainer.export.periodic import ServingExportConfig

METHODS: Final = ("standard", "aux", "adapter", "repr", "share")
FULL: Final = ("aux", "adapter", "repr", "share")
STUDENT_NAMES: Final = ("dlrm_small", "dlrm_tiny")


def parse_methods(text: str) -> tuple[str, ...]:
    """``"none"``, ``"full"`` or a comma list of :data:`METHODS`.

    Example:
        >>> parse_methods("full")
        ('aux', 'adapter', 'repr', 'share')
        >>> parse_methods("repr,standard")
        ('standard', 'repr')
    """
    if text in ("", "none"):
        return ()
    names = FULL if text == "full" else tuple(s.strip() for s in text.split(","))
    unknown = sorted(set(names) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {METHODS}")
    return tuple(m for m in METHODS if m in names)


def methods_flag(text: str) -> tuple[str, ...]:
    """argparse type of ``--methods``: :func:`parse_methods`."""
    try:
        return parse_methods(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistillConfig:
    """One student run. Knob values are fixed a priori, not tuned on eval."""

    methods: tuple[str, ...] = flag_field(
        FULL,
        "transfer methods: none, full, or a comma list of standard, aux, "
        "adapter, repr, share",
        written_default="full",
        type=methods_flag,
        metavar="METHODS",
    )
    student: str = flag_field("dlrm_small", "student size", choices=STUDENT_NAMES)
    epochs: int = flag_field(1, "passes over --examples", type=positive_int)
    batch_size: int = flag_field(256, "examples per step", type=positive_int)
    lr: float = flag_field(2e-3, "student learning rate", type=positive_float)
    max_grad_norm: float = 10.0
    shuffle: bool = True
    seed: int = flag_field(0, "student init (and the batch form's epoch order)")
    kd_weight: float = flag_field(1.0, "standard KD loss weight (lambda)")  # λ
    kd_temperature: float = flag_field(1.0, "standard KD temperature")  # T
    aux_weight: float = flag_field(1.0, "auxiliary distillation head's loss weight (w)")
    label_scale: float = flag_field(1.0, "auxiliary head's label scaling (alpha)")
    grad_scale: float = flag_field(1.0, "auxiliary head's gradient scaling (beta)")
    adapter_lr: float = flag_field(1e-2, "Student Adapter's learning rate")
    adapter_weight: float = 1.0
    # The adapter's calibration filter (adapter.OffsetTracker); 0 noise = off.
    adapter_tracker: bool = flag_field(
        True, "the Student Adapter without its calibration filter (MLP only)"
    )
    adapter_level_noise: float = 0.03  # logit / sqrt(day)
    adapter_slope_noise: float = 0.01  # logit / day / sqrt(day)
    share_frozen: bool = flag_field(
        False,
        "share: freeze the tables copied from the teacher instead of fine-tuning them",
    )


# The student daemon's share of DistillConfig's flags.
STUDENT_DAEMON_DISTILL_FLAGS: Final = ("methods", "student", "lr", "seed")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudentDaemonConfig(ServingExportConfig):
    """One student daemon (``python -m trainer.distill.daemon``); its
    checkpoints are exported as serving versions as
    :class:`ServingExportConfig` says."""

    examples_topic: str = field(metadata=flag("topic of example messages"))
    teacher_topic: str = field(metadata=flag("topic of teacher-output messages"))
    group: str = field(
        metadata=flag("Kafka consumer group (the teacher topic's is GROUP.teacher)")
    )
    domain: str = field(metadata=flag("the student's domain", choices=DOMAINS))
    teacher: Path = field(metadata=flag(CHECKPOINT_HELP, metavar="PATH"))
    checkpoint_dir: Path = field(
        metadata=flag("the student's checkpoints: resumed from, written to")
    )
    distill: DistillConfig = field(default_factory=DistillConfig)
    idle_seconds: float | None = flag_field(
        None,
        "bounded run: stop once both topics were idle this long",
        type=positive_float,
    )
    teacher_wait_s: float = flag_field(
        30.0,
        "how long a message waits for its teacher rows before it trains on labels only",
        metavar="S",
    )
    checkpoint_every: int = flag_field(
        50, "messages between checkpoints", type=positive_int, metavar="MESSAGES"
    )
    keep: int = 3
    max_cached_rows: int = 2_000_000
    threads: int = flag_field(1, THREADS_HELP, type=positive_int)
    start_fresh: bool = flag_field(
        False,
        "when no checkpoint in --checkpoint-dir verifies, train a new "
        "student from the topics' earliest offsets instead of refusing to start",
    )
    on_offset_gap: str = flag_field("stop", GAP_HELP, choices=GAP_POLICIES)
    prometheus_port: int = flag_field(
        0, "serve Prometheus metrics (docs/metrics.md) on this port; 0: off"
    )
    metrics_address: str = flag_field(
        "127.0.0.1",
        "address the Prometheus endpoint listens on (0.0.0.0: every interface)",
    )
