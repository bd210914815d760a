"""``python -m trainer.export``: a model checkpoint as a serving artifact."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from features.cli import CommandParser, run_command
from trainer.cli import CHECKPOINT_HELP, start_torch

DESCRIPTION = """Export a model checkpoint (trainer.fit --save, trainer.daemon) as
the next version of ARTIFACTS/gem, a torch.export program with its manifest
(features.serving_artifacts), and point ARTIFACTS/gem/current at it."""


def build_parser() -> CommandParser:
    """The flags of ``python -m trainer.export``."""
    parser = CommandParser("trainer.export", DESCRIPTION)
    parser.add_argument("--checkpoint", type=Path, required=True, help=CHECKPOINT_HELP)
    parser.add_argument(
        "--artifacts", type=Path, required=True, help="serving artifacts root"
    )
    parser.add_argument("--keep", type=int, default=3, help="versions kept")
    return parser


def run(args: argparse.Namespace) -> int:
    """Export the checkpoint."""
    start_torch(1)
    from trainer.export.checkpoints import write_checkpoint

    print(write_checkpoint(args.checkpoint, args.artifacts, keep=args.keep))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.export`` (see :data:`DESCRIPTION`)."""
    return run_command(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
