"""Our wrapper around Feast: configuration, table checks, apply, materialize, read.

``feature_repo/`` holds the declarations (what ``feast -c feature_repo apply``
reads); this module is what the demo, the tests and operators call:

- :func:`repo_config`: the embedded (``local``) or production-like (``prod``)
  configuration, chosen by ``$GEM_FEAST_ENV`` (one switch), read from
  ``feature_repo/feature_store[.prod].yaml`` as Feast reads it (``${VAR}``
  expanded), with the endpoints' documented defaults and overrides (state
  dir, registry URL, Redis, project).
- :func:`validate_feature_tables`: every feature table's file against the
  contract, before anything is applied or materialized, so a missing column or
  a changed type fails with the view and column named, instead of deep inside
  Feast (whose own schema validation only logs type mismatches).
- :func:`apply` / :func:`materialize`: ``store.apply`` over the repository's
  objects built for a given features dir, and ``store.materialize[_incremental]``
  (what ``feast materialize`` runs) after checking the tables. The yaml's
  batch engine is :class:`pipelines.feast.engine.ArrowMaterializationEngine`
  (pyarrow read, whole-column encoding, bulk writes in Feast's layout).
- :func:`historical_features`: point-in-time retrieval that returns one row
  per request row (see its docstring for the two Feast behaviours it guards).
- :func:`main`: the command below. It parses its flags before importing
  Feast, pandas or pyarrow, which take seconds to load.

The embedded online store, :class:`pipelines.feast.sqlite.GuardedSqliteOnlineStore`,
lives in its own module (``feature_store.yaml`` names it).

Usage::

    python -m pipelines.feast [--env local|prod] [--features-dir DIR]
        [--state-dir DIR] [--project P] validate | apply
        | materialize [--start T] [--end T|now] [--views V ...] [--engine arrow|feast]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from features.cli import CommandError, CommandParser, HelpFormatter, run_command

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from feast import FeatureService, FeatureStore, FeatureView, RepoConfig

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
FEATURE_REPO: Final = REPO_ROOT / "feature_repo"
ENV_VAR: Final = "GEM_FEAST_ENV"
"""``local`` (default) or ``prod``: the one switch between configurations."""
CONFIG_FILES: Final = {"local": "feature_store.yaml", "prod": "feature_store.prod.yaml"}
REGISTRY_URL_VAR: Final = "GEM_FEAST_REGISTRY_URL"
"""The prod SQL registry's SQLAlchemy URL (``${GEM_FEAST_REGISTRY_URL}`` in
``feature_store.prod.yaml``)."""
REDIS_VAR: Final = "GEM_FEAST_REDIS"
"""The prod Redis connection string, ``host:port[,db=N,password=...]``
(``${GEM_FEAST_REDIS}`` in ``feature_store.prod.yaml``)."""
ENDPOINT_DEFAULTS: Final = {
    REDIS_VAR: "127.0.0.1:6379",
    REGISTRY_URL_VAR: "postgresql+psycopg://root@127.0.0.1:5432/root",
}
"""What the prod yaml's variables mean when unset: the loopback services of
``scripts/services.sh``. Feast's own CLI has no defaults: export them."""
EVENT_TIMESTAMP: Final = "event_timestamp"
"""The feature tables' time column (``features.feature_tables.EVENT_TIMESTAMP``;
spelled out so that importing this module loads no pyarrow)."""

ENGINE_TYPE: Final = "pipelines.feast.engine.ArrowMaterializationEngine"
Env = Literal["local", "prod"]
Engine = Literal["arrow", "feast"]
ENGINES: Final[dict[Engine, str]] = {"arrow": ENGINE_TYPE, "feast": "local"}
"""Materialization engines by name: ours (the yaml's) and Feast's stock one."""


# --- configuration -----------------------------------------------------------


def feast_env(env: str | None = None) -> Env:
    """``env``, else ``$GEM_FEAST_ENV``, else ``local``; anything else raises."""
    chosen = env or os.environ.get(ENV_VAR) or "local"
    if chosen not in CONFIG_FILES:
        raise ValueError(f"{ENV_VAR} must be one of {sorted(CONFIG_FILES)}: {chosen!r}")
    return chosen  # type: ignore[return-value]


def config_file(env: str | None = None) -> Path:
    """The ``feature_store*.yaml`` of a configuration (what ``feast -f`` takes)."""
    return FEATURE_REPO / CONFIG_FILES[feast_env(env)]


_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def expand_variables(text: str, values: Mapping[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` replaced from ``values``, the others left as
    they are: what ``os.path.expandvars`` does with the environment, which is
    how Feast's CLI reads a ``feature_store.yaml``."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, match.group(0))

    return _VARIABLE.sub(value, text)


def repo_config(
    env: str | None = None,
    *,
    state_dir: Path | None = None,
    project: str | None = None,
    registry_url: str | None = None,
    redis: str | None = None,
    engine: Engine | None = None,
) -> RepoConfig:
    """The Feast configuration of ``env``, from its yaml, with overrides.

    The yaml is read the way Feast's CLI reads it (variables expanded, then
    ``RepoConfig``), so the file stays the one source of each setting; the
    prod endpoints' variables default to :data:`ENDPOINT_DEFAULTS`.

    Args:
        env: ``local`` or ``prod`` (default: ``$GEM_FEAST_ENV``, else local).
        state_dir: local only: where the file registry and the SQLite online
            store live (default: the yaml's, ``feature_repo/data/``).
        project: Feast project (tests use a unique one each; it also
            namespaces every Redis key and SQLite table).
        registry_url: prod only: SQLAlchemy URL of the SQL registry (default:
            ``$GEM_FEAST_REGISTRY_URL``, else :data:`ENDPOINT_DEFAULTS`).
        redis: prod only: Redis connection string (default: ``$GEM_FEAST_REDIS``,
            else :data:`ENDPOINT_DEFAULTS`).
        engine: the batch (materialization) engine: ``arrow`` (the yaml's,
            :mod:`pipelines.feast.engine`) or ``feast`` (Feast's stock local
            engine, to compare against).
    """
    import yaml
    from feast import RepoConfig

    chosen = feast_env(env)
    values = {**ENDPOINT_DEFAULTS, **os.environ}
    if registry_url:
        values[REGISTRY_URL_VAR] = registry_url
    if redis:
        values[REDIS_VAR] = redis
    raw: dict[str, Any] = yaml.safe_load(
        expand_variables(config_file(chosen).read_text(), values)
    )
    if project:
        raw["project"] = project
    if engine is not None:
        raw["batch_engine"] = {"type": ENGINES[engine]}
    if chosen == "local" and state_dir is not None:
        state = state_dir.resolve()
        state.mkdir(parents=True, exist_ok=True)
        raw["registry"]["path"] = str(state / "registry.db")
        raw["online_store"]["path"] = str(state / "online_store.db")
    return RepoConfig(repo_path=FEATURE_REPO, **raw)


# --- the repository's objects ------------------------------------------------


@dataclass(frozen=True)
class RepoObjects:
    """The feature repository's objects, built for one features dir."""

    entities: dict[str, Any]
    sources: dict[str, Any]
    views: dict[str, FeatureView]
    services: dict[str, FeatureService]

    def all(self) -> list[Any]:
        """Every object, in the order ``store.apply`` wants them."""
        return [
            *self.entities.values(),
            *self.sources.values(),
            *self.views.values(),
            *self.services.values(),
        ]


def repo_module(name: str) -> Any:
    """Import a feature_repo file as `feast apply` does (by bare name)."""
    # feature_repo/ files import each other by bare name (`from entities
    # import ...`), because that is how `feast apply` loads them: with the
    # repo dir on sys.path, not as a package. Load them the same way.
    if str(FEATURE_REPO) not in sys.path:
        sys.path.insert(0, str(FEATURE_REPO))
    return importlib.import_module(name)


def repo_objects(features_dir: Path) -> RepoObjects:
    """Entities, sources, views and services reading ``features_dir``."""
    entities = repo_module("entities")
    sources = repo_module("sources")
    views = repo_module("views")
    services = repo_module("services")
    made_sources = sources.make_sources(features_dir)
    made_views = views.make_views(made_sources)
    return RepoObjects(
        entities=dict(entities.ENTITIES),
        sources=made_sources,
        views=made_views,
        services=services.make_services(made_views),
    )


# --- validation --------------------------------------------------------------


class FeatureTableError(ValueError):
    """A feature table file does not match its feature view's contract."""


def _same_type(actual: pa.DataType, expected: pa.DataType) -> bool:
    import pyarrow as pa

    # Parquet renames list items ("item" -> "element") and drops nullability;
    # neither changes what Feast reads, so compare value types only.
    if pa.types.is_list(expected) or pa.types.is_large_list(expected):
        return (pa.types.is_list(actual) or pa.types.is_large_list(actual)) and (
            _same_type(actual.value_type, expected.value_type)
        )
    return bool(actual.equals(expected))


def table_problems(name: str, schema: pa.Schema) -> list[str]:
    """What is wrong with ``schema`` as feature table ``name`` (empty: nothing)."""
    from features.feature_tables import FEATURE_TABLES

    problems = []
    for field in FEATURE_TABLES[name].schema:
        if field.name not in schema.names:
            problems.append(f"column {field.name!r} is missing")
        elif not _same_type(schema.field(field.name).type, field.type):
            problems.append(
                f"column {field.name!r} has type {schema.field(field.name).type}, "
                f"the contract says {field.type}"
            )
    return problems


def validate_feature_tables(
    features_dir: Path, names: Iterable[str] | None = None
) -> None:
    """Check each feature table's file against its view before Feast reads it.

    Reads Parquet footers only (cheap). Extra columns are allowed (Feast
    ignores them).

    Args:
        features_dir: the feature job's output dir (``feature_tables/`` inside).
        names: the tables to check (default: all of them).

    Raises:
        FeatureTableError: naming every failing feature view, its file and
            each bad column.
    """
    import pyarrow.parquet as pq

    from features.feature_tables import FEATURE_TABLES

    errors = []
    for name in names if names is not None else FEATURE_TABLES:
        path = features_dir / "feature_tables" / f"{name}.parquet"
        if not path.is_file():
            errors.append(f"feature view {name!r}: {path} does not exist")
            continue
        for problem in table_problems(name, pq.read_schema(path)):
            errors.append(f"feature view {name!r} ({path}): {problem}")
    if errors:
        raise FeatureTableError("bad feature tables:\n  " + "\n  ".join(errors))


def registered_features_dirs(store: FeatureStore) -> dict[str, Path]:
    """The features dir each registered view reads (from its FileSource path)."""
    from features.feature_tables import FEATURE_TABLES

    dirs = {}
    for view in store.list_feature_views():
        if view.name in FEATURE_TABLES and view.batch_source is not None:
            path = Path(view.batch_source.path)  # type: ignore[attr-defined]
            dirs[view.name] = path.parent.parent
    return dirs


# --- apply and materialize ---------------------------------------------------


def apply(store: FeatureStore, features_dir: Path) -> RepoObjects:
    """Validate the tables, then register the repository reading ``features_dir``."""
    validate_feature_tables(features_dir)
    objects = repo_objects(features_dir)
    store.apply(objects.all())
    return objects


def configured_engine(store: FeatureStore) -> Engine | None:
    """Which of :data:`ENGINES` the store's ``batch_engine`` is (None: another)."""
    config = store.config.batch_engine_config or "local"
    chosen = config if isinstance(config, str) else config.get("type")
    return next((name for name, kind in ENGINES.items() if kind == chosen), None)


def materialize(
    store: FeatureStore,
    *,
    end: datetime | None = None,
    start: datetime | None = None,
    views: Sequence[str] | None = None,
    engine: Engine | None = None,
    quiet: bool = False,
) -> None:
    """Check the offline tables, then ``store.materialize[_incremental]``.

    Exactly what ``feast materialize`` / ``materialize-incremental`` run, on
    the store's configured batch engine (the repository's yaml: ``arrow``,
    :class:`pipelines.feast.engine.ArrowMaterializationEngine`), after
    :func:`validate_feature_tables` on every table it will read.

    Without ``start``: incremental (from each view's last materialization,
    or from the beginning: the views never expire). With ``start``: the rows
    in ``[start, end]`` (both ends included, as Feast's file store does); per
    entity, the latest. Either way, a value older than the one online for an
    entity never replaces it (Redis: Feast's own check, which our engine runs
    in Redis; SQLite: :class:`GuardedSqliteOnlineStore`).

    Args:
        store: a store the repository was applied to.
        end: end of the window (default: now).
        start: start of the window (default: incremental).
        views: view names (default: all).
        engine: if given, the engine the store must be configured with
            (``arrow`` or ``feast``, Feast's stock local engine): a
            :func:`repo_config` ``engine=`` choice, checked, not switched.
        quiet: swallow Feast's progress output (printed and tqdm bars, not logs).
    """
    from feast.utils import make_tzaware

    if engine is not None and configured_engine(store) != engine:
        raise ValueError(
            f"the store materializes with {store.config.batch_engine_config!r}, "
            f"not {engine!r}: build it with repo_config(engine={engine!r})"
        )
    chosen = [
        v
        for v in store.list_feature_views()
        if v.online and (views is None or v.name in views)
    ]
    by_dir: dict[Path, list[str]] = {}
    for name, directory in registered_features_dirs(store).items():
        if any(v.name == name for v in chosen):
            by_dir.setdefault(directory, []).append(name)
    for directory, names in by_dir.items():
        validate_feature_tables(directory, names)
    end = make_tzaware(end) if end is not None else datetime.now(UTC)
    names = [v.name for v in chosen]
    with contextlib.ExitStack() as silenced:
        if quiet:
            # Feast prints its progress, and its engines draw tqdm bars on
            # stderr; log records still reach their handlers.
            silenced.enter_context(contextlib.redirect_stdout(io.StringIO()))
            silenced.enter_context(contextlib.redirect_stderr(io.StringIO()))
        if start is None:
            store.materialize_incremental(end_date=end, feature_views=names)
        else:
            store.materialize(
                start_date=make_tzaware(start), end_date=end, feature_views=names
            )


NO_TTL: Final = timedelta(weeks=52)
"""What Feast starts an incremental run from for a view without a ttl."""


# --- historical retrieval ----------------------------------------------------


def _requested(
    store: FeatureStore, features: FeatureService | Sequence[str]
) -> dict[str, list[str]]:
    """Feature names by view, from a service or ``view:feature`` references."""
    from feast import FeatureService

    grouped: dict[str, list[str]] = {}
    if isinstance(features, FeatureService):
        for projection in features.feature_view_projections:
            names = [f.name for f in projection.features]
            grouped.setdefault(projection.name, []).extend(names)
        return grouped
    for ref in features:
        view, _, name = ref.partition(":")
        grouped.setdefault(view, []).append(name)
    return grouped


def _utc_ns(column: pd.Series) -> pd.Series:
    import pandas as pd

    return pd.to_datetime(column, utc=True).astype("datetime64[ns, UTC]")


def historical_features(
    store: FeatureStore,
    entity_df: pd.DataFrame,
    features: FeatureService | Sequence[str],
    *,
    full_feature_names: bool = False,
    timestamp_column: str = EVENT_TIMESTAMP,
) -> pd.DataFrame:
    """Point-in-time feature values for every row of ``entity_df``, in its order.

    For each view, the latest row with ``event_timestamp <= t`` of the row's
    entity, or nulls where the entity had none by ``t``. Calls Feast's
    ``get_historical_features`` once per view, on the distinct
    ``(join key, t)`` pairs, and joins the answers back, because Feast 0.67's
    file (Dask) offline store, called on the raw entity frame, loses rows:

    - an entity whose rows are *all* later than ``t`` drops the whole request
      row (its ttl filter keeps null matches but not "no match yet"), e.g. an
      impression in a user's first active hour has no ``user_sequence``
      snapshot yet, and Feast returns no row for it at all;
    - request rows that share a join key and timestamp are collapsed into one
      (feast-dev/feast#6787), e.g. two impressions of one user at the same ms.

    Args:
        store: the applied store.
        entity_df: join key columns and ``timestamp_column``; other columns
            are kept.
        features: a feature service or ``view:feature`` references.
        full_feature_names: name columns ``view__feature``. Needed when a
            feature is named like a request column (``ad_profile``'s
            ``advertiser_id`` beside the advertiser key): plain names raise
            then, where Feast would silently rename one of them.
        timestamp_column: the request time column.

    Returns:
        ``entity_df`` plus one column per feature (nullable where missing).
    """
    out = entity_df.reset_index(drop=True).copy()
    times = _utc_ns(out[timestamp_column])
    request_ts = "__request_ts"
    out[request_ts] = times
    for view_name, names in _requested(store, features).items():
        view = store.get_feature_view(view_name)
        keys = [column.name for column in view.entity_columns]
        columns = [f"{view_name}__{n}" if full_feature_names else n for n in names]
        clashes = sorted(set(columns) & set(out.columns))
        if clashes:
            raise ValueError(
                f"features {clashes} of view {view_name!r} are named like columns "
                "already in the result; pass full_feature_names=True"
            )
        pairs = out[[*keys, request_ts]].drop_duplicates()
        pairs = pairs.rename(columns={request_ts: EVENT_TIMESTAMP})
        got = store.get_historical_features(
            entity_df=pairs,
            features=[f"{view_name}:{n}" for n in names],
            full_feature_names=full_feature_names,
        ).to_df()
        got[request_ts] = _utc_ns(got[EVENT_TIMESTAMP])
        got = got[[*keys, request_ts, *columns]]
        out = out.merge(got, on=[*keys, request_ts], how="left", validate="m:1")
    return out.drop(columns=[request_ts])


FROM_THE_EVENT: Final = ("advertiser_id", "campaign_id", "ad_format", "ad_objective")
"""``ad_profile`` features an example takes from its impression event instead."""

CONSISTENCY_VIEWS: Final = (
    "user_profile",
    "ad_profile",
    "user_counters",
    "ad_counters",
    "advertiser_counters",
)
"""The views whose values a training example holds too (not the sequence)."""


def example_columns() -> list[str]:
    """The example columns :func:`example_mismatches` reads (and ``event_time``)."""
    from features.feature_tables import FEATURE_TABLES

    names = [n for v in CONSISTENCY_VIEWS for n in FEATURE_TABLES[v].feature_names]
    return list(dict.fromkeys(["user_id", "ad_id", "advertiser_id", *names]))


def example_mismatches(store: FeatureStore, examples: pd.DataFrame) -> dict[str, int]:
    """Training/serving skew: examples whose feature differs from Feast's answer.

    Retrieves every :data:`CONSISTENCY_VIEWS` feature at each example's
    impression time and compares it with the example's column. Counters must
    be equal bit for bit (every counter table has a row at each impression
    time). Profile ids: Feast's null (no version yet) is the examples' missing
    id 0; :data:`FROM_THE_EVENT` ids are compared only where the ad has a
    version by then (before, the example has the event's, Feast nothing).

    Args:
        store: an applied store reading the same feature job's tables.
        examples: training examples (``training_example_schema`` columns).

    Returns:
        ``view.feature`` -> number of differing examples; empty when consistent.
    """
    from features.feature_tables import FEATURE_TABLES

    requests = examples[["user_id", "ad_id", "advertiser_id"]].assign(
        **{EVENT_TIMESTAMP: examples["event_time"]}
    )
    refs = [
        f"{view}:{name}"
        for view in CONSISTENCY_VIEWS
        for name in FEATURE_TABLES[view].feature_names
    ]
    served = historical_features(store, requests, refs, full_feature_names=True)
    no_ad_version = served["ad_profile__campaign_id"].isna().to_numpy()
    mismatches = {}
    for ref in refs:
        view, name = ref.split(":")
        got = served[f"{view}__{name}"]
        want = examples[name].to_numpy()
        if view.endswith("_counters"):
            same = got.to_numpy(dtype="float32", na_value=float("nan")) == want
        elif name in FROM_THE_EVENT:
            same = no_ad_version | (got.fillna(-1).to_numpy() == want)
        else:
            same = got.fillna(0).to_numpy(dtype="int64") == want
        if not same.all():
            mismatches[f"{view}.{name}"] = int((~same).sum())
    return mismatches


# --- CLI ---------------------------------------------------------------------

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
