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
import dataclasses
import json
import sys
import time
import typing
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

from features.cli import CommandError, CommandParser, run_command
from features.config_flags import (
    add_config_flags,
    config_fields,
    flag_field,
    positive_int,
)
from features.kafka.settings import add_kafka_arguments
from pipelines.sources.generator_arguments import GeneratorArguments

if TYPE_CHECKING:
    from pipelines.sources.synthetic import GeneratorConfig

# pipelines.sources.synthetic.writer's EventFormat and FORMATS, which load pyarrow
# (tests hold them equal).
EventFormat = Literal["parquet", "jsonl"]
EVENT_FORMATS: Final = typing.get_args(EventFormat)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GenerateConfig:
    """What the command adds to the generator's arguments: where the data set
    goes, and the drift of the freshness scenario."""

    output: str | None = flag_field(None, "output directory (events, tables, truth)")
    format: EventFormat = flag_field(
        "parquet",
        "event files: Parquet or JSON lines, one folder per day",
        choices=EVENT_FORMATS,
    )
    # One rate for every domain: ModelParams.base_logit_drift_per_day.
    drift_per_day: float = flag_field(
        0.0,
        "base-rate drift: logit units added to every domain's click and "
        "conversion intercepts per day (the freshness scenario; default 0, off)",
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class PublishConfig:
    """With ``--topic``, the events also go to Kafka."""

    topic: str | None = flag_field(None, "publish the events to this topic")
    partitions: int = flag_field(8, "if the topic is created", type=positive_int)
    rate: float | None = flag_field(
        None, "events per second (default: as fast as possible)"
    )


def build_parser() -> CommandParser:
    """The CLI's argument parser (generator options plus the Kafka flags)."""
    parser = CommandParser(
        "pipelines.generate",
        __doc__.split("\n\n")[0],
        configs=[GeneratorArguments, GenerateConfig],
    )
    publish = parser.add_argument_group(
        "Kafka publishing", "With --topic, the events are also sent to Kafka."
    )
    add_config_flags(publish, PublishConfig)
    add_kafka_arguments(parser)
    return parser


def config_from_args(args: argparse.Namespace) -> GeneratorConfig:
    """The generator configuration the arguments describe."""
    from pipelines.sources.synthetic import GeneratorConfig, ModelParams

    drift = args.drift_per_day
    return GeneratorConfig(
        **config_fields(args, GeneratorArguments),
        params=ModelParams(base_logit_drift_per_day=(drift,) * 3)
        if drift
        else ModelParams(),
    )


def _publish(
    events: Any,
    args: argparse.Namespace,
    topic: str,
    *,
    partitions: int,
    rate: float | None,
) -> dict[str, Any]:
    """Send the events to Kafka (imports the Kafka code only when asked to)."""
    from features.kafka import KafkaSettings, ensure_topics
    from pipelines.sources.event_stream import publish_events

    settings = KafkaSettings.from_args(args)
    if settings.embedded:
        raise CommandError(
            "--topic needs --kafka-bootstrap",
            "an embedded broker would stop when the generator exits",
        )
    ensure_topics(settings, {topic: partitions})
    report = publish_events(events, settings, topic, rate=rate)
    return {
        "topic": topic,
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
    run = GenerateConfig(**config_fields(args, GenerateConfig))
    publish = PublishConfig(**config_fields(args, PublishConfig))
    if run.output is None and publish.topic is None:
        parser.error("nothing to do: give --output and/or --topic")
    if publish.rate is not None and publish.rate <= 0:
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
    if run.output is not None:
        write_dataset(data, run.output, run.format)
        summary["output"] = run.output
        summary["write_seconds"] = round(time.perf_counter() - generated, 3)
    if publish.topic is not None:
        summary["kafka"] = _publish(
            data.events,
            args,
            publish.topic,
            partitions=publish.partitions,
            rate=publish.rate,
        )
    json.dump(summary, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
