"""Generate a synthetic ads data set (and optionally publish it to Kafka).

Example::

    python -m pipelines.generate --users 50000 --ads 5000 --days 4 --seed 1 \\
        --output out/synthetic
    python -m pipelines.generate --users 1000 --ads 200 --days 1 \\
        --kafka-bootstrap localhost:9092 --topic events --rate 5000

The work is done by :mod:`pipelines.sources.synthetic`; this module only parses
arguments (before importing the generator, so ``--help`` answers at once),
writes the output directory and hands the events to the Kafka publisher
(:func:`pipelines.sources.event_stream.publish_events`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from features.cli import CommandError, CommandParser, run_command
from features.kafka.settings import add_kafka_arguments

if TYPE_CHECKING:
    from pipelines.sources.synthetic import GeneratorConfig

# pipelines.sources.synthetic.writer.FORMATS, which loads pyarrow (tests hold the two
# equal).
EVENT_FORMATS: Final = ("parquet", "jsonl")


def _date(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"expected YYYY-MM-DD, got {text!r}"
        ) from error


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> CommandParser:
    """The CLI's argument parser (generator options plus the Kafka flags)."""
    parser = CommandParser("pipelines.generate", __doc__.split("\n\n")[0])
    parser.add_argument(
        "--users", type=_positive_int, required=True, help="users in the world"
    )
    parser.add_argument(
        "--ads", type=_positive_int, required=True, help="ads in the world"
    )
    parser.add_argument(
        "--days", type=_positive_int, required=True, help="days of events"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="random seed: same seed, same data set"
    )
    parser.add_argument("--output", help="output directory (events, tables, truth)")
    parser.add_argument(
        "--format",
        choices=EVENT_FORMATS,
        default="parquet",
        help="event files: Parquet or JSON lines, one folder per day",
    )
    parser.add_argument(
        "--start", type=_date, default=dt.date(2026, 10, 1), help="first day (UTC)"
    )
    parser.add_argument(
        "--events-per-user-day",
        type=float,
        default=10.0,
        help="mean events per user and day",
    )
    parser.add_argument(
        "--contents", type=_positive_int, help="organic content items (default 5 x ads)"
    )
    parser.add_argument(
        "--duplicate-rate",
        type=float,
        default=0.002,
        help="probability that an event is logged twice (same event_id)",
    )
    parser.add_argument(
        "--drift-per-day",
        type=float,
        default=0.0,
        help="base-rate drift: logit units added to every domain's click and "
        "conversion intercepts per day (the freshness scenario; default 0, off)",
    )

    publish = parser.add_argument_group(
        "Kafka publishing", "With --topic, the events are also sent to Kafka."
    )
    publish.add_argument("--topic", help="publish the events to this topic")
    publish.add_argument(
        "--partitions", type=_positive_int, default=8, help="if the topic is created"
    )
    publish.add_argument(
        "--rate", type=float, help="events per second (default: as fast as possible)"
    )
    add_kafka_arguments(parser)
    return parser


def config_from_args(args: argparse.Namespace) -> GeneratorConfig:
    """The generator configuration the arguments describe."""
    from pipelines.sources.synthetic import GeneratorConfig, ModelParams

    return GeneratorConfig(
        users=args.users,
        ads=args.ads,
        days=args.days,
        seed=args.seed,
        start=args.start,
        events_per_user_day=args.events_per_user_day,
        contents=args.contents,
        duplicate_rate=args.duplicate_rate,
        params=ModelParams(base_logit_drift_per_day=(args.drift_per_day,) * 3)
        if args.drift_per_day
        else ModelParams(),
    )


def _publish(events: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Send the events to Kafka (imports the Kafka code only when asked to)."""
    from features.kafka import KafkaSettings, ensure_topics
    from pipelines.sources.event_stream import publish_events

    settings = KafkaSettings.from_args(args)
    if settings.embedded:
        raise CommandError(
            "--topic needs --kafka-bootstrap",
            "an embedded broker would stop when the generator exits",
        )
    ensure_topics(settings, {args.topic: args.partitions})
    report = publish_events(events, settings, args.topic, rate=args.rate)
    return {
        "topic": args.topic,
        "messages": report.messages,
        "bytes": report.bytes,
        "seconds": round(report.seconds, 3),
        "rate": round(report.rate, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI.

    Returns:
        The process exit status.
    """
    parser = build_parser()
    return run_command(parser, lambda args: _generate(parser, args), argv)


def _generate(parser: CommandParser, args: argparse.Namespace) -> int:
    if args.output is None and args.topic is None:
        parser.error("nothing to do: give --output and/or --topic")
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be positive")
    try:
        config = config_from_args(args)
    except ValueError as error:
        parser.error(str(error))
    from pipelines.sources.synthetic import generate, write_dataset

    started = time.perf_counter()
    data = generate(config)
    generated = time.perf_counter()
    summary: dict[str, Any] = {
        "events": data.events.num_rows,
        "impressions": data.truth.num_rows,
        "duplicates": data.duplicates,
        "max_events_per_user": data.max_events_per_user,
        "generate_seconds": round(generated - started, 3),
    }
    if args.output is not None:
        write_dataset(data, args.output, args.format)
        summary["output"] = str(args.output)
        summary["write_seconds"] = round(time.perf_counter() - generated, 3)
    if args.topic is not None:
        summary["kafka"] = _publish(data.events, args)
    json.dump(summary, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
