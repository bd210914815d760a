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
import dataclasses
import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from features.cli import CommandError, CommandParser, HelpFormatter, run_command
from features.config_flags import add_config_flags, config_fields, flag_field
from features.feast_repository import (
    CONFIG_FILES,
    ENV_VAR,
    REDIS_VAR,
    REGISTRY_URL_VAR,
    Env,
    feast_env,
)
from pipelines.feast.ops import (
    ENGINES,
    Engine,
    FeatureTableError,
    apply,
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoreConfig:
    """Which feature store every subcommand works on."""

    env: str | None = flag_field(
        None,
        f"the configuration (default: ${ENV_VAR}, else local)",
        choices=sorted(CONFIG_FILES),
    )
    features_dir: Path | None = flag_field(
        None,
        "the feature job's output, with feature_tables/ inside (default: "
        "$GEM_FEATURES_DIR, else demo-output/features once written, else "
        "empty tables: see feature_repo/README.md)",
    )
    state_dir: Path | None = flag_field(
        None,
        "local only: the file registry and SQLite online store (default: "
        "the yaml's, feature_repo/data/)",
    )
    project: str | None = flag_field(
        None,
        "Feast project, which namespaces every table and key (default: the "
        "yaml's, gem_ads)",
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class MaterializeConfig:
    """The window and views of ``materialize``."""

    start: datetime | None = flag_field(
        None,
        "window start, ISO-8601 (UTC if naive); without it: incremental, "
        "from each view's last materialization",
        type=parse_time,
    )
    # None: now (pipelines.feast.ops.materialize); the flag reads the clock
    # once, so every view gets the same end.
    end: datetime | None = flag_field(
        None,
        "window end, ISO-8601 (UTC if naive) or now",
        written_default="now",
        type=parse_time,
    )
    views: list[str] | None = flag_field(
        None, "the feature views to materialize (default: every online view)", nargs="+"
    )
    engine: Engine | None = flag_field(
        None,
        "batch engine: arrow (pipelines.feast.engine) or feast (Feast's "
        "stock local engine) (default: the yaml's, arrow)",
        choices=sorted(ENGINES),
    )


def build_parser() -> CommandParser:
    """The command's flags (nothing heavy imported)."""
    parser = CommandParser(
        "pipelines.feast", __doc__.splitlines()[0], configs=[StoreConfig]
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
    add_config_flags(subs["materialize"], MaterializeConfig)
    return parser


def _endpoint_error(error: BaseException) -> CommandError | None:
    """The one line for a Redis or PostgreSQL that does not answer, else None."""
    kind = type(error)
    module = kind.__module__
    if module.startswith("redis") and kind.__name__ in (
        "ConnectionError",
        "TimeoutError",
    ):
        where = os.environ.get(REDIS_VAR, "")
        return CommandError(
            f"no Redis answers at {where.split(',')[0]} ({error})",
            f"check ${REDIS_VAR} and that Redis is up",
        )
    if module.startswith("sqlalchemy") and kind.__name__ == "OperationalError":
        url = os.environ.get(REGISTRY_URL_VAR, "")
        host = url.rpartition("@")[2]  # no user or password in the message
        first = str(getattr(error, "orig", error)).strip().splitlines()[0]
        return CommandError(
            f"the registry database at {host} does not answer ({first})",
            f"check ${REGISTRY_URL_VAR} and that PostgreSQL is up",
        )
    return None


def run(args: argparse.Namespace) -> int:
    """Run one parsed command (see the module docstring)."""
    store = StoreConfig(**config_fields(args, StoreConfig))
    # validate and apply take no window: theirs is the defaults.
    window = MaterializeConfig(**config_fields(args, MaterializeConfig))
    env = feast_env(store.env)
    features_dir: Path = (
        store.features_dir.resolve()
        if store.features_dir
        else repo_module("sources").features_dir()
    )
    try:
        return _run(args.command, env, store, window, features_dir)
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


def _run(
    command: str,
    env: Env,
    config: StoreConfig,
    window: MaterializeConfig,
    features_dir: Path,
) -> int:
    from feast import FeatureStore

    from features.cli import progress

    if command in ("validate", "apply") and not features_dir.is_dir():
        raise CommandError(
            f"features dir {features_dir} does not exist",
            "run the feature job (python -m pipelines.build --output DIR) and "
            "point --features-dir or $GEM_FEATURES_DIR at DIR",
        )
    if command == "validate":
        validate_feature_tables(features_dir)
        print(f"ok: {_table_count()} feature tables in {features_dir}")
        return 0
    store = FeatureStore(
        config=repo_config(
            env,
            state_dir=config.state_dir,
            project=config.project,
            engine=window.engine,
        )
    )
    started = time.perf_counter()
    if command == "apply":
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
        views = window.views
        unknown = sorted(set(views or ()) - set(online))
        if unknown:
            raise CommandError(
                f"no online feature view named {', '.join(unknown)} in project "
                f"{store.project}",
                f"choose from {', '.join(sorted(online))}",
            )
        names = [n for n in online if views is None or n in views]
        # One view at a time: the bar counts views done, which is true.
        with progress("materializing views", total=len(names)) as bar:
            for name in names:
                materialize(
                    store, end=window.end, start=window.start, views=[name], quiet=True
                )
                print(f"materialized {name}")
                bar.advance()
    print(f"{command} took {time.perf_counter() - started:.1f} s")
    return 0


def _table_count() -> int:
    from features.feature_tables import FEATURE_TABLES

    return len(FEATURE_TABLES)


def main(argv: Sequence[str] | None = None) -> int:
    """The command: parse (nothing heavy loaded), then run; exit status."""
    return run_command(build_parser(), run, argv)
