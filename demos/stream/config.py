"""Sizes, topics and time limits of one streaming demo (or benchmark) run,
and the flags that set them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Final

from features.config_flags import flag_field

ROOT = Path(__file__).resolve().parents[2]
EVENTS_TOPIC: Final = "gem.events"
EXAMPLES_TOPIC: Final = "gem.examples"
DEAD_LETTER_TOPIC: Final = "gem.events.dead-letter"
GARBAGE: Final = (b"\xff\xfe", b"{not json", b'{"event_id": "no-fields"}')
"""Malformed messages published first: their dead letters show the job reads."""
READY_TIMEOUT_S: Final = 300.0
"""Prism's start-up on a loaded 2-core machine takes tens of seconds."""
JOB_TIMEOUT_S: Final = 1800.0
TRAINER_CATCH_UP_S: Final = 120.0
STOP_GRACE_S: Final = 20.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamDemoConfig:
    """Sizes and timing of one demo (or benchmark) run.

    The fields with :func:`~features.config_flags.flag` metadata are the flags
    of ``python -m demos.streaming``; the benchmark offers
    :data:`RUN_FLAGS` of them.
    """

    users: int = flag_field(300, "users")
    ads: int = 60
    days: int = flag_field(3, "days of events")
    seed: int = 1
    rate: float = flag_field(2000.0, "events/s the generator publishes at")
    shards: int = 4
    entity_shards: int = 2
    granularity_ms: int = 3_600_000
    allowed_lateness_ms: int = 60_000
    idle_seconds: float = 3.0
    broker_down_seconds: float = flag_field(
        3.0,
        "SIGKILL the broker half-way through the publishing and start it "
        "again this long after (0: no outage)",
    )
    trainer: bool = flag_field(
        True, "leave the trainer daemon out: the streaming job alone"
    )
    output: Path = flag_field(
        ROOT / "demo-output" / "stream", "folder for everything the run writes"
    )


RUN_FLAGS: Final = ("users", "days", "rate", "broker_down_seconds", "output")
"""The flags of a run's sizes, which the benchmark shares with the demo."""
