"""``python -m pipelines.feast``: validate, apply and materialize the feature store.

Usage::

    python -m pipelines.feast [--env local|prod] [--features-dir DIR]
        [--state-dir DIR] [--project P] validate | apply
        | materialize [--start T] [--end T|now] [--views V ...] [--engine arrow|feast]

The flags are parsed before Feast, pandas or pyarrow are imported (they take
seconds to load); the work is :mod:`pipelines.feast.ops`'.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from features.cli import CommandError, CommandParser, HelpFormatter, run_command
from pipelines.feast.ops import (
    CONFIG_FILES,
    ENDPOINT_DEFAULTS,
    ENGINES,
    ENV_VAR,
    REDIS_VAR,
    REGISTRY_URL_VAR,
    Env,
    FeatureTableError,
    apply,
    feast_env,
    materialize,
    repo_config,
    repo_module,
    validate_feature_tables,
)

COMMANDS: Final = {
    "validate": "check the feature tables against the contract",
    "apply": "validate, then register the repository",
    "materialize": "offline tables -> online store (incremental by default)",
}


def parse_time(text: str) -> datetime:
    """``now`` or an ISO-8601 time (naive: UTC), as the flags take it."""
    if text.lower() == "now":
        return datetime.now(UTC)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO-8601 time or 'now': {text!r}"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def build_parser() -> CommandParser:
    """The command's flags (nothing heavy imported)."""
    parser = CommandParser("pipelines.feast", __doc__.splitlines()[0])
    parser.add_argument(
        "--env",
        choices=sorted(CONFIG_FILES),
        default=None,
        help=f"the configuration (default: ${ENV_VAR}, else local)",
    )
    parser.add_argument(
        "--features-dir",
        type=Path,
        default=None,
        help="the feature job's output, with feature_tables/ inside (default: "
        "$GEM_FEATURES_DIR, else demo-output/features once written, else empty "
        "tables: see feature_repo/README.md)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="local only: the file registry and SQLite online store (default: "
        "the yaml's, feature_repo/data/)",
    )
    parser.add_argument(
        "--project",
        default=None,
        help="Feast project, which namespaces every table and key (default: the "
        "yaml's, gem_ads)",
    )
    # Subcommands are plain parsers: the top-level CommandParser already
    # checks every flag, theirs included, before argparse sees them.
    commands = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{" + ",".join(COMMANDS) + "}",
        parser_class=argparse.ArgumentParser,
    )
    subs = {
        name: commands.add_parser(
            name,
            help=text,
            description=text,
            formatter_class=HelpFormatter,
            allow_abbrev=False,
        )
        for name, text in COMMANDS.items()
    }
    materialize_flags = subs["materialize"]
    materialize_flags.add_argument(
        "--start",
        type=parse_time,
        default=None,
        help="window start, ISO-8601 (UTC if naive); without it: incremental, "
        "from each view's last materialization",
    )
    materialize_flags.add_argument(
        "--end",
        type=parse_time,
        default="now",
        help="window end, ISO-8601 (UTC if naive) or now",
    )
    materialize_flags.add_argument(
        "--views",
        nargs="+",
        default=None,
        help="the feature views to materialize (default: every online view)",
    )
    materialize_flags.add_argument(
        "--engine",
        choices=sorted(ENGINES),
        default=None,
        help="batch engine: arrow (pipelines.feast.engine) or feast (Feast's "
        "stock local engine) (default: the yaml's, arrow)",
    )
    return parser


def _endpoint_error(error: BaseException) -> CommandError | None:
    """The one line for a Redis or PostgreSQL that does not answer, else None."""
    kind = type(error)
    module = kind.__module__
    if module.startswith("redis") and kind.__name__ in (
        "ConnectionError",
        "TimeoutError",
    ):
        where = os.environ.get(REDIS_VAR, ENDPOINT_DEFAULTS[REDIS_VAR])
        return CommandError(
            f"no Redis answers at {where.split(',')[0]} ({error})",
            f"check ${REDIS_VAR} and that Redis is up",
        )
    if module.startswith("sqlalchemy") and kind.__name__ == "OperationalError":
        url = os.environ.get(REGISTRY_URL_VAR, ENDPOINT_DEFAULTS[REGISTRY_URL_VAR])
        host = url.rpartition("@")[2]  # no user or password in the message
        first = str(getattr(error, "orig", error)).strip().splitlines()[0]
        return CommandError(
            f"the registry database at {host} does not answer ({first})",
            f"check ${REGISTRY_URL_VAR} and that PostgreSQL is up",
        )
    return None


def run(args: argparse.Namespace) -> int:
    """Run one parsed command (see the module docstring)."""
    env = feast_env(args.env)
    features_dir: Path = (
        args.features_dir.resolve()
        if args.features_dir
        else repo_module("sources").features_dir()
    )
    try:
        return _run(args, env, features_dir)
    except FeatureTableError as error:
        raise CommandError(
            str(error).replace(":\n  ", ": ").replace("\n  ", "; "),
            "run the feature job (python -m pipelines.build --output DIR) and "
            "point --features-dir or $GEM_FEATURES_DIR at DIR",
        ) from error
    except Exception as error:
        line = _endpoint_error(error)
        if line is None:
            raise
        raise line from error


def _run(args: argparse.Namespace, env: Env, features_dir: Path) -> int:
    from feast import FeatureStore

    from features.cli import progress

    if args.command in ("validate", "apply") and not features_dir.is_dir():
        raise CommandError(
            f"features dir {features_dir} does not exist",
            "run the feature job (python -m pipelines.build --output DIR) and "
            "point --features-dir or $GEM_FEATURES_DIR at DIR",
        )
    if args.command == "validate":
        validate_feature_tables(features_dir)
        print(f"ok: {_table_count()} feature tables in {features_dir}")
        return 0
    store = FeatureStore(
        config=repo_config(
            env,
            state_dir=args.state_dir,
            project=args.project,
            engine=getattr(args, "engine", None),
        )
    )
    started = time.perf_counter()
    if args.command == "apply":
        objects = apply(store, features_dir)
        print(
            f"applied {len(objects.views)} views and {len(objects.services)} "
            f"services reading {features_dir} to project {store.project}"
        )
    else:
        online = [v.name for v in store.list_feature_views() if v.online]
        if not online:
            raise CommandError(
                f"project {store.project} has no online feature views",
                "run `python -m pipelines.feast apply` first",
            )
        unknown = sorted(set(args.views or ()) - set(online))
        if unknown:
            raise CommandError(
                f"no online feature view named {', '.join(unknown)} in project "
                f"{store.project}",
                f"choose from {', '.join(sorted(online))}",
            )
        names = [n for n in online if args.views is None or n in args.views]
        # One view at a time: the bar counts views done, which is true.
        with progress("materializing views", total=len(names)) as bar:
            for name in names:
                materialize(
                    store, end=args.end, start=args.start, views=[name], quiet=True
                )
                print(f"materialized {name}")
                bar.advance()
    print(f"{args.command} took {time.perf_counter() - started:.1f} s")
    return 0


def _table_count() -> int:
    from features.feature_tables import FEATURE_TABLES

    return len(FEATURE_TABLES)


def main(argv: Sequence[str] | None = None) -> int:
    """The command: parse (nothing heavy loaded), then run; exit status."""
    return run_command(build_parser(), run, argv)
