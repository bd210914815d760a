"""Sizes, topics and time limits of one streaming demo (or benchmark) run."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Final

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


@dataclass(frozen=True)
class StreamDemoConfig:
    """Sizes and timing of one demo (or benchmark) run."""

    users: int = 300
    ads: int = 60
    days: int = 3
    seed: int = 1
    rate: float = 2000.0
    shards: int = 4
    entity_shards: int = 2
    granularity_ms: int = 3_600_000
    allowed_lateness_ms: int = 60_000
    idle_seconds: float = 3.0
    broker_down_seconds: float = 0.0
    """The broker is SIGKILLed half-way through the publishing and started
    again this long after; 0 leaves it up."""
    trainer: bool = True
    output: Path = ROOT / "demo-output" / "stream"


def add_stream_arguments(
    parser: argparse.ArgumentParser, *, broker_down_seconds: float, output: Path
) -> None:
    """The flags of a run's sizes: ``--users``, ``--days``, ``--rate``,
    ``--broker-down-seconds`` and ``--output``, with these defaults."""
    parser.add_argument("--users", type=int, default=StreamDemoConfig.users)
    parser.add_argument("--days", type=int, default=StreamDemoConfig.days)
    parser.add_argument("--rate", type=float, default=StreamDemoConfig.rate)
    parser.add_argument(
        "--broker-down-seconds",
        type=float,
        default=broker_down_seconds,
        help="SIGKILL the broker half-way through the publishing and start it "
        "again this long after (0: no outage)",
    )
    parser.add_argument("--output", type=Path, default=output)


def stream_config(args: argparse.Namespace, *, trainer: bool) -> StreamDemoConfig:
    """The run that :func:`add_stream_arguments`' flags ask for."""
    return StreamDemoConfig(
        users=args.users,
        days=args.days,
        rate=args.rate,
        broker_down_seconds=args.broker_down_seconds,
        trainer=trainer,
        output=args.output,
    )
