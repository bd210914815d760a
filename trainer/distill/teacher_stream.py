"""``python -m trainer.distill.teacher_stream``: the flags, then the job
(:mod:`trainer.distill.teacher_topic`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path

from features.cli import CommandError, CommandParser, run_command
from features.config_flags import (
    config_fields,
    flag,
    flag_field,
    positive_float,
    positive_int,
)
from trainer.cli import (
    CHECKPOINT_HELP,
    THREADS_HELP,
    add_cluster_arguments,
    kafka_settings,
    start_torch,
)

NEEDS_CLUSTER = "the examples topic is the trainer's"
DESCRIPTION = """\
Teacher outputs over Kafka: every example message of the trainer's topic is
run through the teacher once and its rows are published as one message to
--output-topic. The examples topic's offsets live in this job's checkpoints,
written after the producer flushed (teacher rows at least once; readers keep
the first copy). Exit 2: bad input, or checkpoints of which none verifies
(see --start-fresh)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeacherStreamConfig:
    """One teacher-stream run: the keywords of
    :func:`trainer.distill.teacher_topic.run_stream`, and the torch threads."""

    examples_topic: str = field(metadata=flag("topic of example messages to read"))
    output_topic: str = field(metadata=flag("topic the teacher outputs go to"))
    group: str = flag_field("gem-teacher-outputs", "Kafka consumer group")
    teacher_path: Path = field(
        metadata=flag(CHECKPOINT_HELP, name="--teacher", metavar="PATH")
    )
    checkpoint_dir: Path = field(
        metadata=flag("this job's checkpoints (the examples topic's offsets)")
    )
    idle_seconds: float | None = flag_field(
        None,
        "bounded run: stop once no message came for this long",
        type=positive_float,
    )
    checkpoint_every: int = flag_field(
        50, "messages between checkpoints", type=positive_int, metavar="MESSAGES"
    )
    partitions: int = flag_field(
        4, "partitions of --output-topic when it is created", type=positive_int
    )
    threads: int = flag_field(1, THREADS_HELP, type=positive_int)
    start_fresh: bool = flag_field(
        False,
        "when no checkpoint in --checkpoint-dir verifies, start from the "
        "examples topic's earliest offsets instead of refusing to start",
    )


def build_parser() -> CommandParser:
    """The flags of ``python -m trainer.distill.teacher_stream``."""
    parser = CommandParser(
        "trainer.distill.teacher_stream", DESCRIPTION, configs=[TeacherStreamConfig]
    )
    add_cluster_arguments(parser, NEEDS_CLUSTER)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the job on the parsed flags; print its counts."""
    settings = kafka_settings(args, why=NEEDS_CLUSTER)
    job = dataclasses.asdict(
        TeacherStreamConfig(**config_fields(args, TeacherStreamConfig))
    )
    from trainer.distill.teacher_topic import run_stream
    from trainer.training.checkpoint import NoUsableCheckpointError

    start_torch(job.pop("threads"))
    started = time.perf_counter()
    try:
        result = run_stream(settings, **job)
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
