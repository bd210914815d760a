"""``python -m trainer.distill.daemon``: the flags, then the student daemon
(:mod:`trainer.distill.student_daemon`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from features.cli import CommandError, CommandParser, run_command
from features.kafka.settings import add_kafka_arguments
from features.vocab import DOMAINS
from trainer.cli import (
    CHECKPOINT_HELP,
    kafka_settings,
    positive_float,
    positive_int,
    require_cluster,
)
from trainer.training.run_config import STUDENT_NAMES

NEEDS_CLUSTER = "the topics are the trainer's and the teacher's"
DESCRIPTION = """\
The student daemon: one vertical student trained continuously from the
trainer's example messages joined (by example id) with the teacher outputs
that python -m trainer.distill.teacher_stream publishes; each batch scored
before it is trained on. Checkpoints hold both topics' offsets (exactly
once). Exit 2: bad input, or checkpoints of which none verifies (see
--start-fresh)."""


def build_parser() -> CommandParser:
    """The flags of ``python -m trainer.distill.daemon``."""
    parser = CommandParser("trainer.distill.daemon", DESCRIPTION)
    parser.add_argument(
        "--examples-topic", required=True, help="topic of example messages"
    )
    parser.add_argument(
        "--teacher-topic", required=True, help="topic of teacher-output messages"
    )
    parser.add_argument(
        "--group",
        required=True,
        help="Kafka consumer group (the teacher topic's is GROUP.teacher)",
    )
    parser.add_argument(
        "--domain", choices=DOMAINS, required=True, help="the student's domain"
    )
    parser.add_argument(
        "--teacher", type=Path, required=True, metavar="PATH", help=CHECKPOINT_HELP
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        required=True,
        metavar="DIR",
        help="the student's checkpoints: resumed from, written to",
    )
    parser.add_argument(
        "--methods",
        default="full",
        help="transfer methods: none, full, or a comma list of standard, aux, "
        "adapter, repr, share",
    )
    parser.add_argument(
        "--student", choices=STUDENT_NAMES, default="dlrm_small", help="student size"
    )
    parser.add_argument(
        "--lr", type=positive_float, default=2e-3, help="student learning rate"
    )
    parser.add_argument("--seed", type=int, default=0, help="student init")
    parser.add_argument(
        "--idle-seconds",
        type=positive_float,
        default=None,
        metavar="S",
        help="bounded run: stop once both topics were idle this long",
    )
    parser.add_argument(
        "--teacher-wait-s",
        type=float,
        default=30.0,
        metavar="S",
        help="how long a message waits for its teacher rows before it trains "
        "on labels only",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=positive_int,
        default=50,
        metavar="MESSAGES",
        help="messages between checkpoints",
    )
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="torch intra-op threads"
    )
    parser.add_argument(
        "--start-fresh",
        action="store_true",
        help="when no checkpoint in --checkpoint-dir verifies, train a new "
        "student from the topics' earliest offsets instead of refusing to start",
    )
    parser.add_argument(
        "--prometheus-port",
        type=int,
        default=0,
        help="serve Prometheus metrics (docs/metrics.md) on this port; 0: off",
    )
    parser.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        help="address the Prometheus endpoint listens on (0.0.0.0: every interface)",
    )
    add_kafka_arguments(parser)
    require_cluster(parser, NEEDS_CLUSTER)
    return parser


def run(args: argparse.Namespace) -> int:
    """Start the student daemon on the parsed flags; print its counts."""
    settings = kafka_settings(args, why=NEEDS_CLUSTER)
    import torch

    from features.memory import reuse_freed_memory
    from launchers.kafka_broker import kafka_cluster
    from trainer.distill import student_daemon as daemon
    from trainer.distill.student_trainer import DistillConfig, parse_methods
    from trainer.training.checkpoint import NoUsableCheckpointError

    try:
        methods = parse_methods(args.methods)
    except ValueError as error:
        raise CommandError(f"--methods {args.methods}: {error}") from error
    torch.set_num_threads(args.threads)
    # Each step frees and re-allocates the same buffers: keep them (features.memory).
    reuse_freed_memory()
    config = daemon.StudentDaemonConfig(
        examples_topic=args.examples_topic,
        teacher_topic=args.teacher_topic,
        group=args.group,
        domain=args.domain,
        teacher=args.teacher,
        checkpoint_dir=args.checkpoint_dir,
        distill=DistillConfig(
            methods=methods, student=args.student, lr=args.lr, seed=args.seed
        ),
        idle_seconds=args.idle_seconds,
        teacher_wait_s=args.teacher_wait_s,
        checkpoint_every=args.checkpoint_every,
        start_fresh=args.start_fresh,
        prometheus_port=args.prometheus_port,
        metrics_address=args.metrics_address,
    )
    try:
        with kafka_cluster(settings) as cluster:
            result = daemon.run(config, cluster)
    except NoUsableCheckpointError as error:
        raise CommandError(f"refusing to start: {error}") from error
    print(json.dumps({k: v for k, v in result.items() if k != "progressive"}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.distill.daemon`` (see :data:`DESCRIPTION`)."""
    return run_command(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
