"""The Feast our engine and stores were written for, checked before they load.

:mod:`pipelines.feast.engine` and :mod:`pipelines.feast.sqlite` subclass
Feast's local engine and SQLite store, they and the writers
(:mod:`pipelines.feast.writers`, :mod:`pipelines.feast.redis_writer`) write
Feast's storage layouts themselves, and all reach into Feast's internals (the
names in :data:`FEAST_INTERNALS`). Another Feast may still import and yet lay
its data out differently, so they call :func:`require_supported_feast` first:
outside
:data:`SUPPORTED_FEAST`, or with one of those names gone, it fails with one
line naming the pin to install. :func:`unsupported_feast` is the pure decision
(tests give it other versions).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from collections.abc import Iterable, Sequence
from typing import Final

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from features.cli import CommandError

TESTED_FEAST: Final = "0.67.0"
"""The Feast the tests ran on: ``requirements/lock.txt``'s pin."""
SUPPORTED_RANGE: Final = ">=0.67.0,<0.68"
SUPPORTED_FEAST: Final = SpecifierSet(SUPPORTED_RANGE)
"""The releases whose internals match :data:`FEAST_INTERNALS` (Feast changes
internals between minor releases, not within one)."""
FEAST_INTERNALS: Final = (
    "feast.infra.compute_engines.local.compute:LocalComputeEngine._materialize_one",
    "feast.infra.compute_engines.local.job:LocalMaterializationJob",
    "feast.infra.common.materialization_job:MaterializationTask",
    "feast.infra.common.materialization_job:MaterializationJobStatus",
    "feast.infra.online_stores.helpers:_mmh3",
    "feast.infra.online_stores.helpers:compute_table_id",
    "feast.infra.online_stores.helpers:extract_text_and_num",
    "feast.infra.online_stores.redis:RedisOnlineStore._get_client",
    "feast.infra.online_stores.redis:RedisType",
    "feast.infra.online_stores.redis:_versioned_fv_name",
    "feast.infra.online_stores.sqlite:SqliteOnlineStore._get_conn",
    "feast.infra.key_encoding_utils:serialize_entity_key",
    "feast.type_map:python_values_to_proto_values",
    "feast.utils:_convert_arrow_to_proto",
)
"""``module:attribute`` of every Feast internal the engine and stores use."""


class UnsupportedFeastError(CommandError):
    """The installed Feast is not one :mod:`pipelines.feast.engine` was written for."""


def missing_internals(names: Iterable[str] = FEAST_INTERNALS) -> list[str]:
    """Those of ``names`` (``module:attribute.path``) the installed Feast lacks."""
    missing = []
    for name in names:
        module_name, _, path = name.partition(":")
        try:
            found: object = importlib.import_module(module_name)
            for part in path.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            missing.append(name)
    return missing


def unsupported_feast(version: str, missing: Sequence[str] = ()) -> str | None:
    """Why Feast ``version`` (lacking the internals ``missing``) cannot run our
    engine and stores, as one line saying what to install; None if it can."""
    pin = f"pip install feast=={TESTED_FEAST} (the pin in requirements/lock.txt)"
    try:
        supported = Version(version) in SUPPORTED_FEAST
    except InvalidVersion:
        supported = False
    if not supported:
        return (
            f"pipelines.feast.engine was written for feast {SUPPORTED_RANGE} "
            f"(tested with {TESTED_FEAST}), found {version}; {pin}"
        )
    if missing:
        return (
            f"feast {version} lacks {', '.join(missing)}, which "
            f"pipelines.feast.engine uses; {pin}"
        )
    return None


@functools.cache
def require_supported_feast() -> None:
    """Raise :class:`UnsupportedFeastError` unless the installed Feast is supported
    (checked once per process)."""
    version = importlib.metadata.version("feast")
    problem = unsupported_feast(version)
    if problem is None:
        problem = unsupported_feast(version, missing_internals())
    if problem is not None:
        raise UnsupportedFeastError(problem)
