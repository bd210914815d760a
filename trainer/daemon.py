"""``python -m trainer.daemon``: the flags, then the run
(:mod:`trainer.training.daemon`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from features.cli import CommandError, CommandParser, run_command
from features.config_flags import config_fields
from trainer.cli import add_cluster_arguments, kafka_settings, start_torch
from trainer.training.exits import (
    EXIT_CHECKPOINT_WRITE,
    EXIT_HELP,
    refusal_line,
    refusal_status,
)
from trainer.training.run_config import DaemonConfig

NEEDS_CLUSTER = "the daemon trains from the topic others publish into"
DESCRIPTION = """\
Train GEM continuously from the topic of example messages that pipelines.build
publishes (its examples topic): progressive validation, atomic
checkpoints that hold the Kafka offsets (exactly once across restarts), poison
messages set aside, metrics as JSON lines, Prometheus and TensorBoard.
Runs until SIGTERM (checkpoints, exits 0); --idle-seconds makes it bounded.
One daemon per --checkpoint-dir (a lock held for the run). The checkpointed
offsets are checked against the topic on restore and on every assignment.
With --artifacts, checkpoints become serving versions (python -m serving)
every --export-every-steps or --export-every-minutes, exported beside the
run, which never waits for one (but waits for the last at its end).

""" + textwrap.fill(EXIT_HELP, 79)


def build_parser() -> CommandParser:
    """The flags of ``python -m trainer.daemon``."""
    parser = CommandParser("trainer.daemon", DESCRIPTION, configs=[DaemonConfig])
    add_cluster_arguments(parser, NEEDS_CLUSTER)
    return parser


def run(args: argparse.Namespace) -> int:
    """Start the daemon on the parsed flags; its exit status."""
    settings = kafka_settings(args, why=NEEDS_CLUSTER)
    config = DaemonConfig(**config_fields(args, DaemonConfig))
    if config.checkpoint_dir.exists() and not config.checkpoint_dir.is_dir():
        raise CommandError(
            f"--checkpoint-dir {config.checkpoint_dir} is a file", "name a folder"
        )
    refusal = config.export_refusal()
    if refusal is not None:
        raise CommandError(refusal)
    from trainer.training.ranks import die_with_launcher, leave_process_group

    die_with_launcher()
    start_torch(config.threads)
    from launchers.kafka_broker import kafka_cluster
    from trainer.training import daemon
    from trainer.training.checkpoint import CheckpointWriteError
    from trainer.training.daemon_checkpoint import AppliedLog

    applied_log = os.environ.get(daemon.APPLIED_LOG_ENV)
    try:
        with kafka_cluster(settings) as cluster:
            result = daemon.run(
                config,
                cluster,
                on_checkpoint=AppliedLog(Path(applied_log)) if applied_log else None,
            )
    except CheckpointWriteError as error:
        print(f"python -m trainer.daemon: error: {error}", file=sys.stderr)
        return EXIT_CHECKPOINT_WRITE
    except Exception as error:
        status = refusal_status(error)
        if status is None:
            raise
        line = refusal_line(error)
        print(f"python -m trainer.daemon: error: {line}", file=sys.stderr)
        return status
    finally:
        # Every rank, also when run raised after its collective stop.
        leave_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        keys = ("step", "examples", "records", "dead_letters", "png")
        print(json.dumps({k: result[k] for k in keys}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.daemon`` (see :data:`DESCRIPTION`)."""
    return run_command(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
