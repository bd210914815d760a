"""``python -m serving.versions``: list the versions of each served model,
or roll a model back by pointing its ``current`` at an older version.

A running server picks the new ``current`` up at its next poll, as it does
an export; a server started with ``--pin`` for that model keeps its pin.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from features.cli import CommandError, CommandParser, run_command

DESCRIPTION = """List each model's versions under --artifacts (the current one
marked *), or with --rollback MODEL point MODEL's `current` at the version
before it (or at --to VERSION). A version that fails its checks is refused."""


def build_parser() -> CommandParser:
    """The flags of ``python -m serving.versions``."""
    parser = CommandParser("serving.versions", DESCRIPTION)
    parser.add_argument("--artifacts", type=Path, required=True, help="artifacts root")
    parser.add_argument(
        "--rollback", metavar="MODEL", default=None, help="model folder to roll back"
    )
    parser.add_argument(
        "--to", metavar="VERSION", default=None, help="the version to roll back to"
    )
    return parser


def rollback_target(model_dir: Path, to: str | None) -> str:
    """The version a rollback points at: ``to``, or the one before ``current``.

    Raises:
        CommandError: no such version, or none older than the current one.
    """
    from features.serving_artifacts import current_version, list_versions

    versions = list_versions(model_dir)
    if to is not None:
        if to not in versions:
            raise CommandError(
                f"--to {to}: not a version of {model_dir.name}",
                f"choose from {', '.join(versions) or 'none'}",
            )
        return to
    current = current_version(model_dir)
    older = [v for v in versions if current is None or v < current]
    if not older:
        raise CommandError(f"{model_dir.name}: no version older than {current}")
    return older[-1]


def run(args: argparse.Namespace) -> int:
    """List, or roll back."""
    # The format's module reads the feature tables' schemas (pyarrow): not for --help.
    from features.serving_artifacts import (
        VERSIONS,
        ArtifactError,
        current_version,
        list_versions,
        load_manifest,
        set_current,
    )

    if not args.artifacts.is_dir():
        raise CommandError(f"--artifacts {args.artifacts}: no such folder")
    if args.rollback is not None:
        model_dir = args.artifacts / args.rollback
        if not (model_dir / VERSIONS).is_dir():
            raise CommandError(f"--rollback {args.rollback}: no such model folder")
        target = rollback_target(model_dir, args.to)
        try:
            load_manifest(model_dir / VERSIONS / target)
        except ArtifactError as error:
            raise CommandError(f"refused: {error}") from error
        set_current(model_dir, target)
        print(f"{args.rollback} current {target}")
        return 0
    for model_dir in sorted(args.artifacts.iterdir()):
        if not (model_dir / VERSIONS).is_dir():
            continue
        current = current_version(model_dir)
        for version in list_versions(model_dir):
            mark = "*" if version == current else " "
            print(f"{mark} {model_dir.name} {version}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m serving.versions`` (see :data:`DESCRIPTION`)."""
    return run_command(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
