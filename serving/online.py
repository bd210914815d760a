"""Feature rows of a request from Feast's online store (SQLite or Redis).

Read through Feast's own ``get_online_features``: the user's profile,
counters and sequence; the candidates' profiles and counters; then the
counters of their advertisers (known only from the ads' profiles). The
configuration is the feature repository's own yaml with the online store
read through Feast's stock store of that kind, so nothing of the pipelines
wing loads here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from feast import FeatureStore, RepoConfig
from feast.online_response import TIMESTAMP_POSTFIX

from features.feast_repository import (
    CONFIG_FILES,
    REDIS_VAR,
    REGISTRY_URL_VAR,
    check_endpoints,
    expand_variables,
    feast_env,
    feature_repo,
)
from features.feature_tables import FEATURE_TABLES

USER_VIEWS: Final = ("user_profile", "user_counters", "user_sequence")
AD_VIEWS: Final = ("ad_profile", "ad_counters")
ADVERTISER_VIEWS: Final = ("advertiser_counters",)


class FeatureViewMissingError(LookupError):
    """A feature view the models read is not in the registry."""


@dataclass(frozen=True, kw_only=True)
class FeastSettings:
    """Where the online store is: ``env`` local (SQLite, file registry under
    ``state_dir``) or prod (Redis, SQL registry)."""

    env: str = "local"
    state_dir: Path | None = None
    project: str | None = None
    redis: str | None = None
    registry_url: str | None = None


def repo_config(settings: FeastSettings) -> RepoConfig:
    """The repository's yaml, read as Feast's CLI reads it (variables
    expanded; a prod endpoint that is not set is an error), served through
    Feast's stock online store and engine."""
    import yaml

    values = dict(os.environ)
    if settings.redis:
        values[REDIS_VAR] = settings.redis
    if settings.registry_url:
        values[REGISTRY_URL_VAR] = settings.registry_url
    check_endpoints(settings.env, values)
    repo = feature_repo()
    text = (repo / CONFIG_FILES[feast_env(settings.env)]).read_text()
    raw: dict[str, Any] = yaml.safe_load(expand_variables(text, values))
    if settings.project:
        raw["project"] = settings.project
    raw["batch_engine"] = {"type": "local"}
    if settings.env == "local":
        raw["online_store"]["type"] = "sqlite"
        if settings.state_dir is not None:
            state = settings.state_dir.resolve()
            raw["registry"]["path"] = str(state / "registry.db")
            raw["online_store"]["path"] = str(state / "online_store.db")
    return RepoConfig(repo_path=repo, **raw)


@dataclass(frozen=True)
class Rows:
    """Per entity, its views' feature values (None: no row) and the newest
    row time read (epoch ms; None when no row was found)."""

    values: list[dict[str, Any]]
    newest_ms: int | None


class OnlineFeatures:
    """Reads a request's feature rows from the online store."""

    def __init__(self, settings: FeastSettings) -> None:
        self.store = FeatureStore(config=repo_config(settings))

    def check_views(self) -> None:
        """Every view the models read is registered.

        Raises:
            FeatureViewMissingError: naming the first one that is not.
        """
        known = {v.name for v in self.store.list_feature_views()}
        for name in FEATURE_TABLES:
            if name not in known:
                raise FeatureViewMissingError(f"feature view {name} is not registered")

    def read(self, views: Sequence[str], key: str, ids: Sequence[int]) -> Rows:
        """The rows of ``views`` for entities ``key`` = each of ``ids``."""
        refs = [f"{v}:{f}" for v in views for f in FEATURE_TABLES[v].feature_names]
        try:
            response = self.store.get_online_features(
                features=refs,
                entity_rows=[{key: int(i)} for i in ids],
                full_feature_names=True,
            ).to_dict(include_event_timestamps=True)
        except Exception as error:  # Feast names the missing view
            if type(error).__name__ == "FeatureViewNotFoundException":
                raise FeatureViewMissingError(str(error).splitlines()[0]) from error
            raise
        return _rows(response, views, len(ids))


def _rows(response: Mapping[str, list[Any]], views: Sequence[str], n: int) -> Rows:
    values: list[dict[str, Any]] = [{} for _ in range(n)]
    newest: int | None = None
    for view in views:
        first = FEATURE_TABLES[view].feature_names[0]
        # Feast returns each row's time in whole seconds.
        stamps = response[f"{view}__{first}{TIMESTAMP_POSTFIX}"]
        for i in range(n):
            row = {
                f: response[f"{view}__{f}"][i]
                for f in FEATURE_TABLES[view].feature_names
            }
            present = any(v is not None for v in row.values())
            values[i][view] = row if present else None
            stamp = stamps[i]
            if present and stamp:
                ms = int(stamp) * 1000
                newest = ms if newest is None else max(newest, ms)
    return Rows(values, newest)
