"""Our wrapper around Feast: configuration, table checks, apply, materialize.

``feature_repo/`` holds the declarations (what ``feast -c feature_repo apply``
reads); this module is what the demo, the tests, operators and the command
(:mod:`pipelines.feast.command`) call:

- :func:`repo_config`: the embedded (``local``) or production-like (``prod``)
  configuration, chosen by ``$GEM_FEAST_ENV`` (one switch), read from
  ``feature_store[.prod].yaml`` as Feast reads it (``${VAR}`` expanded), with
  overrides (state dir, registry URL, Redis, project); a prod endpoint that
  is not set is an error, never a loopback default. The repository is
  :func:`feature_repo`'s: ``$GEM_FEATURE_REPO`` or a flag, else the one the
  project installs as package data, so a packaged worker finds it too.
- :func:`validate_feature_tables`: every feature table's file against the
  contract, before anything is applied or materialized, so a missing column or
  a changed type fails with the view and column named, instead of deep inside
  Feast (whose own schema validation only logs type mismatches).
- :func:`apply` / :func:`materialize`: ``store.apply`` over the repository's
  objects built for a given features dir, and ``store.materialize[_incremental]``
  (what ``feast materialize`` runs) after checking the tables. The yaml's
  batch engine is :class:`pipelines.feast.engine.ArrowMaterializationEngine`
  (pyarrow read, whole-column encoding, bulk writes in Feast's layout).

Reading the store back is :mod:`pipelines.feast.retrieval`. The embedded
online store, :class:`pipelines.feast.sqlite.GuardedSqliteOnlineStore`,
lives in its own module (``feature_store.yaml`` names it). Importing this
module loads neither Feast, pandas nor pyarrow.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from features.feast_repository import (
    CONFIG_FILES,
    REDIS_VAR,
    REGISTRY_URL_VAR,
    check_endpoints,
    expand_variables,
    feast_env,
    feature_repo,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from feast import FeatureService, FeatureStore, FeatureView, RepoConfig

ENGINE_TYPE: Final = "pipelines.feast.engine.ArrowMaterializationEngine"
Engine = Literal["arrow", "feast"]
ENGINES: Final[dict[Engine, str]] = {"arrow": ENGINE_TYPE, "feast": "local"}
"""Materialization engines by name: ours (the yaml's) and Feast's stock one."""


# --- configuration -----------------------------------------------------------


def config_file(env: str | None = None, repo: str | Path | None = None) -> Path:
    """The ``feature_store*.yaml`` of a configuration (what ``feast -f`` takes)."""
    return feature_repo(repo) / CONFIG_FILES[feast_env(env)]


def repo_config(
    env: str | None = None,
    *,
    state_dir: Path | None = None,
    project: str | None = None,
    registry_url: str | None = None,
    redis: str | None = None,
    engine: Engine | None = None,
    repo: str | Path | None = None,
) -> RepoConfig:
    """The Feast configuration of ``env``, from its yaml, with overrides.

    The yaml is read the way Feast's CLI reads it (variables expanded, then
    ``RepoConfig``), so the file stays the one source of each setting; a
    prod endpoint neither given nor in the environment is an error
    (:func:`check_endpoints`).

    Args:
        env: ``local`` or ``prod`` (default: ``$GEM_FEAST_ENV``, else local).
        state_dir: local only: where the file registry and the SQLite online
            store live (default: the yaml's, ``feature_repo/data/``).
        project: Feast project (tests use a unique one each; it also
            namespaces every Redis key and SQLite table).
        registry_url: prod only: SQLAlchemy URL of the SQL registry (default:
            ``$GEM_FEAST_REGISTRY_URL``).
        redis: prod only: Redis connection string (default: ``$GEM_FEAST_REDIS``).
        engine: the batch (materialization) engine: ``arrow`` (the yaml's,
            :mod:`pipelines.feast.engine`) or ``feast`` (Feast's stock local
            engine, to compare against).
        repo: the feature repository (default: :func:`feature_repo`'s).

    Raises:
        MissingEndpointError: prod without an endpoint.
    """
    import yaml
    from feast import RepoConfig

    chosen = feast_env(env)
    values = dict(os.environ)
    if registry_url:
        values[REGISTRY_URL_VAR] = registry_url
    if redis:
        values[REDIS_VAR] = redis
    check_endpoints(chosen, values)
    folder = feature_repo(repo)
    raw: dict[str, Any] = yaml.safe_load(
        expand_variables(config_file(chosen, folder).read_text(), values)
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
    return RepoConfig(repo_path=folder, **raw)


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


def repo_module(name: str, repo: str | Path | None = None) -> Any:
    """Import a feature_repo file as `feast apply` does (by bare name)."""
    # feature_repo/ files import each other by bare name (`from entities
    # import ...`), because that is how `feast apply` loads them: with the
    # repo dir on sys.path, not as a package. Load them the same way.
    folder = str(feature_repo(repo))
    if folder not in sys.path:
        sys.path.insert(0, folder)
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
    """Check each feature table's parts against its view before Feast reads it.

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

    from features.feature_tables import FEATURE_TABLES, table_folder, table_parts

    errors = []
    for name in names if names is not None else FEATURE_TABLES:
        folder = table_folder(features_dir, name)
        parts = table_parts(folder)
        if not parts:
            errors.append(f"feature view {name!r}: no Parquet parts in {folder}")
        for path in parts:
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
