"""``python -m pipelines.reference``: the flags, then the single-process
feature job (:mod:`pipelines.core.reference`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path

from features.cli import CommandError, CommandParser, run_command
from features.config_flags import config_fields, flag, flag_field

DESCRIPTION = """\
The feature job in one process: the oracle the Beam job (python -m
pipelines.build) is held to. Reads a data set folder (events/, users, ads,
contents), writes examples, timelines, feature tables, dead letters and
summary.json in the layout of features.feature_tables.OUTPUT_LAYOUT."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReferenceConfig:
    """One run of the single-process feature job."""

    input: Path = field(
        metadata=flag(
            "data set folder (pipelines.generate or pipelines.movielens output)"
        )
    )
    output: Path = field(metadata=flag("output folder"))
    now_ms: int | None = flag_field(
        None,
        "validation clock in epoch ms (default: the input manifest's "
        "validation_now_ms, else the wall clock)",
    )
    overwrite: bool = flag_field(False, "replace an earlier output")


def build_parser() -> CommandParser:
    """The command's flags (:class:`ReferenceConfig`'s)."""
    return CommandParser("pipelines.reference", DESCRIPTION, configs=[ReferenceConfig])


def _reference(args: argparse.Namespace) -> int:
    from features.memory import reuse_freed_memory
    from pipelines.core.reference import (
        OUTPUT_PARTS,
        build_reference,
        read_event_input,
        validation_clock,
        write_output,
    )

    config = ReferenceConfig(**config_fields(args, ReferenceConfig))
    out = config.output
    existing = [p for p in OUTPUT_PARTS if (out / p).exists()]
    if existing and not config.overwrite:
        raise CommandError(f"{out} already holds {existing}", "pass --overwrite")
    for part in existing:
        path = out / part
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    started = time.perf_counter()
    # The Beam job's allocator settings (it applies them too): a fair peer.
    reuse_freed_memory()
    now_ms = validation_clock(config.input, config.now_ms)
    events, origins, users, ads, contents = read_event_input(config.input, now_ms)
    output = build_reference(
        events, users, ads, contents, now_ms=now_ms, origins=origins
    )
    write_output(output, out, now_ms=now_ms)
    seconds = time.perf_counter() - started
    print(json.dumps({"counts": output.counts, "seconds": round(seconds, 2)}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; its exit status (2 with one line for bad input)."""
    return run_command(build_parser(), _reference, argv)


if __name__ == "__main__":
    sys.exit(main())
