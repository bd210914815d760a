"""Where the feature repository is and how its Feast configurations are
read: shared by the feature jobs (``pipelines.feast``) and the scoring
service (``serving``), which must find and read the same repository without
importing each other.

- :func:`feature_repo`: a flag, else ``$GEM_FEATURE_REPO``, else the
  ``feature_repo`` the project installs as package data, so a packaged
  worker or server finds it too;
- :func:`feast_env`: ``local`` or ``prod`` (``$GEM_FEAST_ENV``);
- :func:`expand_variables` and :func:`check_endpoints`: a ``feature_store``
  yaml read as Feast's CLI reads it, and a prod endpoint that is not set is
  an error, never a loopback default.

Imports neither Feast nor YAML.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final, Literal

from features.cli import CommandError

Env = Literal["local", "prod"]
FEATURE_REPO_VAR: Final = "GEM_FEATURE_REPO"
"""The feature repository's folder, where the packaged one is not wanted."""
ENV_VAR: Final = "GEM_FEAST_ENV"
"""``local`` (default) or ``prod``: the one switch between configurations."""
CONFIG_FILES: Final = {"local": "feature_store.yaml", "prod": "feature_store.prod.yaml"}
REGISTRY_URL_VAR: Final = "GEM_FEAST_REGISTRY_URL"
"""The prod SQL registry's SQLAlchemy URL (``${GEM_FEAST_REGISTRY_URL}`` in
``feature_store.prod.yaml``)."""
REDIS_VAR: Final = "GEM_FEAST_REDIS"
"""The prod Redis connection string, ``host:port[,db=N,password=...]``
(``${GEM_FEAST_REDIS}`` in ``feature_store.prod.yaml``)."""
PROD_ENDPOINTS: Final = {
    REGISTRY_URL_VAR: "the SQL registry's SQLAlchemy URL",
    REDIS_VAR: "the Redis online store, host:port[,db=N,password=...]",
}
"""What the prod yaml reads from the environment; none has a default."""


class MissingEndpointError(CommandError, ValueError):
    """The prod configuration without one of its endpoints (one line)."""


def feast_env(env: str | None = None) -> Env:
    """``env``, else ``$GEM_FEAST_ENV``, else ``local``; anything else raises."""
    chosen = env or os.environ.get(ENV_VAR) or "local"
    if chosen not in CONFIG_FILES:
        raise ValueError(f"{ENV_VAR} must be one of {sorted(CONFIG_FILES)}: {chosen!r}")
    return chosen  # type: ignore[return-value]


def feature_repo(folder: str | Path | None = None) -> Path:
    """The feature repository: ``folder``, else ``$GEM_FEATURE_REPO``, else
    the ``feature_repo`` the project installs (package data: the checkout's
    folder in a source tree, a copy in site-packages on a packaged worker).

    Raises:
        FileNotFoundError: the folder holds no ``feature_store.yaml``.
    """
    chosen = folder or os.environ.get(FEATURE_REPO_VAR)
    if chosen:
        repo = Path(chosen).resolve()
    else:
        spec = importlib.util.find_spec("feature_repo")
        locations = list(spec.submodule_search_locations or ()) if spec else []
        repo = Path(locations[0]) if locations else Path("feature_repo").resolve()
    if not (repo / CONFIG_FILES["local"]).is_file():
        raise FileNotFoundError(
            2, f"no feature repository (feature_store.yaml) in {repo}", str(repo)
        )
    return repo


def check_endpoints(env: str | None, values: Mapping[str, str] | None = None) -> None:
    """The prod configuration's endpoints are all set (in ``values``, by
    default the environment); a worker never falls back to loopback.

    Raises:
        MissingEndpointError: naming the first variable missing.
    """
    if feast_env(env) != "prod":
        return
    given = os.environ if values is None else values
    for name, what in PROD_ENDPOINTS.items():
        if not given.get(name):
            raise MissingEndpointError(
                f"the prod Feast configuration needs ${name} ({what})",
                "export it where the job and its workers run",
            )


_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def expand_variables(text: str, values: Mapping[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` replaced from ``values``, the others left as
    they are: what ``os.path.expandvars`` does with the environment, which is
    how Feast's CLI reads a ``feature_store.yaml``."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, match.group(0))

    return _VARIABLE.sub(value, text)
