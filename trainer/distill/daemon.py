"""``python -m trainer.distill.daemon``: the flags, then the student daemon
(:mod:`trainer.distill.student_daemon`)."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence

from features.cli import CommandError, CommandParser, run_command
from features.config_flags import add_config_flags, config_fields
from trainer.cli import add_cluster_arguments, kafka_settings, start_torch
from trainer.distill.run_config import (
    STUDENT_DAEMON_DISTILL_FLAGS,
    DistillConfig,
    StudentDaemonConfig,
)
from trainer.training.exits import EXIT_HELP, refusal_line, refusal_status

NEEDS_CLUSTER = "the topics are the trainer's and the teacher's"
DESCRIPTION = """\
The student daemon: one vertical student trained continuously from the
trainer's example messages joined (by example id) with the teacher outputs
that python -m trainer.distill.teacher_stream publishes; each batch scored
before it is trained on. Checkpoints hold both topics' offsets (exactly
once), checked against the topics on restore and on every assignment. One
daemon per --checkpoint-dir (a lock held for the run). With --artifacts,
checkpoints become serving versions of student-<domain> (python -m serving)
every --export-every-steps or --export-every-minutes, exported beside the
run, which never waits for one (but waits for the last at its end).

""" + textwrap.fill(EXIT_HELP, 79)


def build_parser() -> CommandParser:
    """The flags of ``python -m trainer.distill.daemon``."""
    parser = CommandParser(
        "trainer.distill.daemon", DESCRIPTION, configs=[StudentDaemonConfig]
    )
    student = parser.add_argument_group("Student")
    add_config_flags(student, DistillConfig, only=STUDENT_DAEMON_DISTILL_FLAGS)
    add_cluster_arguments(parser, NEEDS_CLUSTER)
    return parser


def run(args: argparse.Namespace) -> int:
    """Start the student daemon on the parsed flags; print its counts."""
    settings = kafka_settings(args, why=NEEDS_CLUSTER)
    config = StudentDaemonConfig(
        **config_fields(args, StudentDaemonConfig),
        distill=DistillConfig(**config_fields(args, DistillConfig)),
    )
    refusal = config.export_refusal()
    if refusal is not None:
        raise CommandError(refusal)
    start_torch(config.threads)
    from launchers.kafka_broker import kafka_cluster
    from trainer.distill import student_daemon as daemon

    try:
        with kafka_cluster(settings) as cluster:
            result = daemon.run(config, cluster)
    except Exception as error:
        status = refusal_status(error)
        if status is None:
            raise
        line = refusal_line(error)
        print(f"python -m trainer.distill.daemon: error: {line}", file=sys.stderr)
        return status
    print(json.dumps({k: v for k, v in result.items() if k != "progressive"}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.distill.daemon`` (see :data:`DESCRIPTION`)."""
    return run_command(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
