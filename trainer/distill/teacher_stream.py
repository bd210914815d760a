"""``python -m trainer.distill.teacher_stream``: the flags, then the job
(:mod:`trainer.distill.teacher_topic`)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from features.cli import CommandError, CommandParser, run_command
from features.config_flags import positive_float, positive_int
from features.kafka.settings import add_kafka_arguments
from trainer.cli import CHECKPOINT_HELP, kafka_settings, require_cluster, start_torch

NEEDS_CLUSTER = "the examples topic is the trainer's"
DESCRIPTION = """\
Teacher outputs over Kafka: every example message of the trainer's topic is
run through the teacher once and its rows are published as one message to
--output-topic. The examples topic's offsets live in this job's checkpoints,
written after the producer flushed (teacher rows at least once; readers keep
the first copy). Exit 2: bad input, or checkpoints of which none verifies
(see --start-fresh)."""


def build_parser() -> CommandParser:
    """The flags of ``python -m trainer.distill.teacher_stream``."""
    parser = CommandParser("trainer.distill.teacher_stream", DESCRIPTION)
    parser.add_argument(
        "--examples-topic", required=True, help="topic of example messages to read"
    )
    parser.add_argument(
        "--output-topic", required=True, help="topic the teacher outputs go to"
    )
    parser.add_argument(
        "--group", default="gem-teacher-outputs", help="Kafka consumer group"
    )
    parser.add_argument(
        "--teacher", type=Path, required=True, metavar="PATH", help=CHECKPOINT_HELP
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        required=True,
        metavar="DIR",
        help="this job's checkpoints (the examples topic's offsets)",
    )
    parser.add_argument(
        "--idle-seconds",
        type=positive_float,
        default=None,
        metavar="S",
        help="bounded run: stop once no message came for this long",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=positive_int,
        default=50,
        metavar="MESSAGES",
        help="messages between checkpoints",
    )
    parser.add_argument(
        "--partitions",
        type=positive_int,
        default=4,
        help="partitions of --output-topic when it is created",
    )
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="torch intra-op threads"
    )
    parser.add_argument(
        "--start-fresh",
        action="store_true",
        help="when no checkpoint in --checkpoint-dir verifies, start from the "
        "examples topic's earliest offsets instead of refusing to start",
    )
    add_kafka_arguments(parser)
    require_cluster(parser, NEEDS_CLUSTER)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the job on the parsed flags; print its counts."""
    settings = kafka_settings(args, why=NEEDS_CLUSTER)
    from trainer.distill.teacher_topic import run_stream
    from trainer.training.checkpoint import NoUsableCheckpointError

    start_torch(args.threads)
    started = time.perf_counter()
    try:
        result = run_stream(
            settings,
            examples_topic=args.examples_topic,
            output_topic=args.output_topic,
            group=args.group,
            teacher_path=args.teacher,
            checkpoint_dir=args.checkpoint_dir,
            idle_seconds=args.idle_seconds,
            checkpoint_every=args.checkpoint_every,
            partitions=args.partitions,
            start_fresh=args.start_fresh,
        )
    except NoUsableCheckpointError as error:
        raise CommandError(f"refusing to start: {error}") from error
    result["seconds"] = time.perf_counter() - started
    print(json.dumps(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.distill.teacher_stream`` (see :data:`DESCRIPTION`)."""
    return run_command(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
