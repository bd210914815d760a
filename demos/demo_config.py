"""What ``make demo`` (:mod:`demos.end_to_end`) is told: the size of its
world, its topic, the trainer daemon's settings and the learning thresholds.

Each field is a flag of ``python -m demos.end_to_end``, its default and help
written once here (:func:`features.config_flags.flag`); the Kafka client flags
beside them are :func:`features.kafka.add_kafka_arguments`'.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Final

from features.config_flags import flag_field

# The trainer's presets (trainer.training.run_config.PRESET_NAMES): the demo
# passes its choice on to the daemon's --preset.
PRESET_NAMES: Final = ("tiny", "default", "large")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """One ``make demo`` run."""

    # Sized to run in minutes on a 2-core CPU. Six days of fewer users rather
    # than three of more: a longer history per user is what the click model
    # learns from.
    users: int = flag_field(4500, "users")
    ads: int = flag_field(400, "ads")
    days: int = flag_field(6, "days of events")
    seed: int = flag_field(7, "the generator's seed")
    output: Path = flag_field(
        Path("demo-output"),
        "folder for everything the demo writes (made anew each run)",
    )
    partitions: int = flag_field(6, "partitions of the raw-event topic")
    rate: float | None = flag_field(
        None, "events/s to publish at (default: as fast as possible)"
    )
    # In one pass over this many examples the tiny preset's small hashed tables
    # learn more than the default preset's larger ones, in less time.
    preset: str = flag_field(
        "tiny", "the trainer daemon's model preset", choices=PRESET_NAMES
    )
    lr: float = flag_field(3e-3, "the daemon's Adam learning rate")
    batch_size: int = flag_field(
        256, "examples per Kafka message, so per training step"
    )
    max_seq_len: int = flag_field(
        32, "most recent history events published with each example"
    )
    window_examples: int = flag_field(
        2000, "examples per domain in a progressive-validation window"
    )
    max_click_ne: float = flag_field(
        0.95, "the model learnt: last-window click NE at most this"
    )
    min_click_auc: float = flag_field(
        0.65, "the model learnt: whole-run click AUC at least this"
    )
    require_learning: bool = flag_field(
        False,
        "count the learning verdict among the checks: exit 1 when the "
        "model missed either threshold above",
    )
