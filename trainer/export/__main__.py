"""``python -m trainer.export``: a model checkpoint as a serving artifact."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from features.cli import CommandParser, run_command
from features.config_flags import positive_int
from trainer.cli import CHECKPOINT_HELP, start_torch

DESCRIPTION = """Export a checkpoint as the next version of its model under
ARTIFACTS, a torch.export program with its manifest
(features.serving_artifacts), and point the model's `current` at it: a model
checkpoint (trainer.fit's, trainer.daemon's) becomes ARTIFACTS/gem, a
student checkpoint (trainer.distill.daemon) ARTIFACTS/student-<domain>, with
its teacher's program beside it when it reads the teacher's embedding. Prints
the version's folder."""


def build_parser() -> CommandParser:
    """The flags of ``python -m trainer.export``."""
    parser = CommandParser("trainer.export", DESCRIPTION)
    parser.add_argument("--checkpoint", type=Path, required=True, help=CHECKPOINT_HELP)
    parser.add_argument(
        "--artifacts", type=Path, required=True, help="serving artifacts root"
    )
    parser.add_argument("--keep", type=positive_int, default=3, help="versions kept")
    parser.add_argument(
        "--max-seq-len",
        type=positive_int,
        default=None,
        help="history events served per request (default: the window the "
        "model, or a student's teacher, was configured with)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Export the checkpoint."""
    start_torch(1)
    from trainer.export.checkpoints import write_checkpoint

    print(
        write_checkpoint(
            args.checkpoint,
            args.artifacts,
            keep=args.keep,
            max_seq_len=args.max_seq_len,
        )
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.export`` (see :data:`DESCRIPTION`)."""
    return run_command(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
