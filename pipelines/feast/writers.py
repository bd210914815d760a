"""How encoded view rows reach an online store: the fastest faithful writer.

:func:`online_writer` picks it for the store: the guarded SQLite store's own
bulk writer (:class:`pipelines.feast.sqlite.GuardedSqliteOnlineStore`: one
``executemany`` per batch, in entity key order, a commit per ``commit_rows``),
the atomic Redis writer (:mod:`pipelines.feast.redis_writer`), or else Feast's
converter and the store's own writer. The materialization engine and the
streaming job's pushes write through it alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from pipelines.feast.version import require_supported_feast

# Before Feast's internals are imported: another Feast may lack them or lay its
# data out differently, and this names the pin to install instead.
require_supported_feast()

import pyarrow as pa  # noqa: E402
from feast import FeatureView, RepoConfig  # noqa: E402
from feast.utils import _convert_arrow_to_proto  # noqa: E402
from feast.value_type import ValueType  # noqa: E402

from pipelines.feast import encode as feast_encode  # noqa: E402
from pipelines.feast.encode import EncodedRows  # noqa: E402
from pipelines.feast.redis_writer import RedisWriter, redis_commands  # noqa: E402


class Writer(NamedTuple):
    """How view rows reach an online store: ``encode`` (a worker thread) turns
    a batch into what ``write`` sends; ``finish`` ends the view's writes
    (``failed``: after an error, drop what is not yet committed)."""

    encode: Callable[[FeatureView, pa.RecordBatch, dict[str, ValueType]], Any]
    write: Callable[[FeatureView, Any], object]
    finish: Callable[[bool], object]


def online_writer(
    online_store: Any, config: RepoConfig, commit_rows: int = 20_000
) -> Writer:
    """The fastest faithful way to write view rows into ``online_store``
    (SQLite: a commit per ``commit_rows`` rows or more)."""
    from feast.infra.online_stores.redis import RedisOnlineStore, RedisType

    from pipelines.feast.sqlite import GuardedSqliteOnlineStore

    online = config.online_store

    def encode(
        view: FeatureView,
        batch: pa.RecordBatch,
        keys: dict[str, ValueType],
        texts: bool,
    ) -> EncodedRows:
        return feast_encode.encode_batch(
            batch,
            _feature_types(view),
            keys,
            view.batch_source.timestamp_field,  # type: ignore[union-attr]
            entity_key_serialization_version=config.entity_key_serialization_version,
            with_texts=texts,
        )

    if isinstance(online_store, GuardedSqliteOnlineStore) and not (
        online.vector_enabled or online.enable_openai_compatible_store
    ):
        # Batches are small (see ArrowMaterializationEngine.batch_bytes); one
        # commit each would sync the database file each time.
        uncommitted = 0

        def write_sqlite(view: FeatureView, rows: EncodedRows) -> None:
            nonlocal uncommitted
            uncommitted += len(rows)
            commit = uncommitted >= commit_rows
            online_store.write_encoded(config, view, rows, commit=commit)
            if commit:
                uncommitted = 0

        return Writer(
            encode=lambda view, batch, keys: encode(view, batch, keys, True),
            write=write_sqlite,
            finish=lambda failed: online_store.end_writes(config, commit=not failed),
        )
    if (
        isinstance(online_store, RedisOnlineStore)
        and online.redis_type == RedisType.redis
    ):
        redis_writer = RedisWriter(online_store, config)

        def finish_redis(failed: bool) -> None:
            if failed:
                redis_writer.close(failed=True)
            else:
                redis_writer.finish()

        return Writer(
            encode=lambda view, batch, keys: redis_commands(
                config, view, encode(view, batch, keys, False)
            ),
            write=lambda view, commands: redis_writer.write(commands),
            finish=finish_redis,
        )
    # Anything else: Feast's converter and the store's own writer.
    return Writer(
        encode=lambda view, batch, keys: _convert_arrow_to_proto(batch, view, keys),
        write=lambda view, rows: online_store.online_write_batch(
            config, view, rows, progress=None
        ),
        finish=lambda failed: None,
    )


def _feature_types(view: FeatureView) -> dict[str, ValueType]:
    return {f.name: f.dtype.to_value_type() for f in view.features}


def join_keys_of(view: FeatureView) -> dict[str, ValueType]:
    """A view's join keys and their Feast value types (what ``encode`` takes)."""
    return {c.name: c.dtype.to_value_type() for c in view.entity_columns}
