"""``python -m trainer.distill.teacher_outputs``: the flags, then the job
(:mod:`trainer.distill.teacher_pass`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path

from features.cli import CommandParser, run_command
from features.config_flags import (
    config_fields,
    flag,
    flag_field,
    positive_int,
)
from trainer.cli import CHECKPOINT_HELP, THREADS_HELP, feature_dir, start_torch

DESCRIPTION = """\
Teacher outputs, computed once per example: the GEM teacher's forward over
every example of a feature-job output, written as Parquet (one row per
example: its logits for every (domain, objective), its summary embedding, the
checkpoint's step and time). The summary printed as JSON says rows out =
examples in."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeacherOutputsConfig:
    """One teacher pass over a feature-job output."""

    examples: Path = field(metadata=flag("feature-job output (examples + timelines)"))
    teacher: Path = field(metadata=flag(CHECKPOINT_HELP, metavar="PATH"))
    output: Path = field(
        metadata=flag(
            "folder of the teacher-output Parquet: new, empty, or one this "
            "command wrote (then replaced)"
        )
    )
    # teacher_pass.DEFAULT_BATCH_SIZE, which loads torch: a test checks.
    batch_size: int = flag_field(256, "examples per forward", type=positive_int)
    max_seq_len: int | None = flag_field(
        None, "longest history window (default: the teacher's)", type=positive_int
    )
    threads: int = flag_field(1, THREADS_HELP, type=positive_int)


def build_parser() -> CommandParser:
    """The flags of ``python -m trainer.distill.teacher_outputs``."""
    return CommandParser(
        "trainer.distill.teacher_outputs", DESCRIPTION, configs=[TeacherOutputsConfig]
    )


def run(args: argparse.Namespace) -> int:
    """Check the input, run the teacher over it, print the summary."""
    config = TeacherOutputsConfig(**config_fields(args, TeacherOutputsConfig))
    feature_dir("--examples", config.examples)
    from trainer.distill import teacher_pass

    start_torch(config.threads)
    summary = teacher_pass.run(
        config.examples,
        config.teacher,
        config.output,
        batch_size=config.batch_size,
        max_seq_len=config.max_seq_len,
    )
    print(json.dumps(summary, indent=1))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.distill.teacher_outputs`` (see :data:`DESCRIPTION`)."""
    return run_command(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
