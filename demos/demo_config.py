"""What ``make demo`` (:mod:`demos.end_to_end`) is told: the size of its
world, its topic, the trainer daemon's settings and the learning thresholds.

Each field is a flag of ``python -m demos.end_to_end``, its default and help
written once here (:func:`features.config_flags.flag`); the Kafka client flags
beside them are :func:`features.kafka.add_kafka_arguments`'.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from pathlib import Path
from typing import Final

from features.config_flags import flag

# The trainer's presets (trainer.training.run_config.PRESET_NAMES): the demo
# passes its choice on to the daemon's --preset.
PRESET_NAMES: Final = ("tiny", "default", "large")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """One ``make demo`` run."""

    # Sized to run in minutes on a 2-core CPU. Six days of fewer users rather
    # than three of more: a longer history per user is what the click model
    # learns from.
    users: int = field(default=4500, metadata=flag("users"))
    ads: int = field(default=400, metadata=flag("ads"))
    days: int = field(default=6, metadata=flag("days of events"))
    seed: int = field(default=7, metadata=flag("the generator's seed"))
    output: Path = field(
        default=Path("demo-output"),
        metadata=flag("folder for everything the demo writes (made anew each run)"),
    )
    partitions: int = field(
        default=6, metadata=flag("partitions of the raw-event topic")
    )
    rate: float | None = field(
        default=None,
        metadata=flag("events/s to publish at (default: as fast as possible)"),
    )
    # In one pass over this many examples the tiny preset's small hashed tables
    # learn more than the default preset's larger ones, in less time.
    preset: str = field(
        default="tiny",
        metadata=flag("the trainer daemon's model preset", choices=PRESET_NAMES),
    )
    lr: float = field(default=3e-3, metadata=flag("the daemon's Adam learning rate"))
    batch_size: int = field(
        default=256, metadata=flag("examples per Kafka message, so per training step")
    )
    max_seq_len: int = field(
        default=32,
        metadata=flag("most recent history events published with each example"),
    )
    window_examples: int = field(
        default=2000,
        metadata=flag("examples per domain in a progressive-validation window"),
    )
    max_click_ne: float = field(
        default=0.95,
        metadata=flag("the model learnt: last-window click NE at most this"),
    )
    min_click_auc: float = field(
        default=0.65,
        metadata=flag("the model learnt: whole-run click AUC at least this"),
    )
    require_learning: bool = field(
        default=False,
        metadata=flag(
            "count the learning verdict among the checks: exit 1 when the "
            "model missed either threshold above"
        ),
    )
