"""``python -m pipelines.movielens``: the flags, then the conversion
(:mod:`pipelines.sources.movielens`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path

from features.cli import CommandError, CommandParser, run_command
from features.config_flags import config_fields, flag, flag_field

DESCRIPTION = """\
Convert MovieLens (ml-100k or ml-1m, detected from its files) into the
project's events and users / ads / contents tables, the layout
pipelines.generate writes. Reads the source in place."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class MovieLensConfig:
    """One conversion of a MovieLens folder."""

    source: Path = field(
        metadata=flag(
            "MovieLens folder: u.data, u.user, u.item (ml-100k) or "
            "ratings.dat, users.dat, movies.dat (ml-1m)"
        )
    )
    output: Path = field(metadata=flag("output folder"))
    overwrite: bool = flag_field(
        False, "replace an existing events/ folder in --output"
    )


def build_parser() -> CommandParser:
    """The command's flags (:class:`MovieLensConfig`'s)."""
    return CommandParser("pipelines.movielens", DESCRIPTION, configs=[MovieLensConfig])


def _convert(args: argparse.Namespace) -> int:
    from pipelines.sources.movielens import run
    from pipelines.sources.movielens_files import LayoutError

    config = MovieLensConfig(**config_fields(args, MovieLensConfig))
    started = time.perf_counter()
    try:
        manifest = run(config.source, config.output, overwrite=config.overwrite)
    except (LayoutError, FileExistsError) as error:
        raise CommandError(str(error)) from error
    elapsed = time.perf_counter() - started
    counts = manifest["counts"]
    print(
        f"{manifest['layout']}: {counts['ratings']:,} ratings -> "
        f"{counts['events']:,} events over {counts['days']} days, "
        f"{counts['users']:,} users, {counts['ads']:,} ads "
        f"in {elapsed:.1f} s -> {config.output}"
    )
    for domain, by_action in manifest["counts_by_domain_action"].items():
        line = "  ".join(f"{a}={c:,}" for a, c in by_action.items())
        print(f"  {domain:<10} {line}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; its exit status (2 with one line for bad input)."""
    return run_command(build_parser(), _convert, argv)


if __name__ == "__main__":
    sys.exit(main())
