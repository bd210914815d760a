"""``python -m trainer.distill.teacher_outputs``: the flags, then the job
(:mod:`trainer.distill.teacher_pass`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from features.cli import CommandParser, run_command
from features.config_flags import positive_int
from trainer.cli import CHECKPOINT_HELP, feature_dir, start_torch

DESCRIPTION = """\
Teacher outputs, computed once per example: the GEM teacher's forward over
every example of a feature-job output, written as Parquet (one row per
example: its logits for every (domain, objective), its summary embedding, the
checkpoint's step and time). The summary printed as JSON says rows out =
examples in."""


def build_parser() -> CommandParser:
    """The flags of ``python -m trainer.distill.teacher_outputs``."""
    parser = CommandParser("trainer.distill.teacher_outputs", DESCRIPTION)
    parser.add_argument(
        "--examples",
        type=Path,
        required=True,
        metavar="DIR",
        help="feature-job output (examples + timelines)",
    )
    parser.add_argument(
        "--teacher", type=Path, required=True, metavar="PATH", help=CHECKPOINT_HELP
    )
    parser.add_argument(
        "--output",
        type=Path,
        required=True,
        metavar="DIR",
        help="folder of the teacher-output Parquet (replaced when it exists)",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        # teacher_outputs.DEFAULT_BATCH_SIZE, which loads torch: a test checks.
        default=256,
        help="examples per forward",
    )
    parser.add_argument(
        "--max-seq-len",
        type=positive_int,
        default=None,
        help="longest history window (default: the teacher's)",
    )
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="torch intra-op threads"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Check the input, run the teacher over it, print the summary."""
    feature_dir("--examples", args.examples)
    from trainer.distill import teacher_pass as teacher_outputs

    start_torch(args.threads)
    summary = teacher_outputs.run(
        args.examples,
        args.teacher,
        args.output,
        batch_size=args.batch_size,
        max_seq_len=args.max_seq_len,
    )
    print(json.dumps(summary, indent=1))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.distill.teacher_outputs`` (see :data:`DESCRIPTION`)."""
    return run_command(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
