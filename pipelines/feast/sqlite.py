"""The embedded online store: Feast's SQLite store, where an older write never wins.

``feature_repo/feature_store.yaml`` selects it::

    online_store:
      type: pipelines.feast.sqlite.GuardedSqliteOnlineStore

Feast's SQLite store upserts every row it is given, so re-materializing an
earlier window (or pushing a late event) replaces newer values; Feast's Redis
store skips a write not newer than the stored one. This store does what Redis
does, for ``feast materialize``, ``store.push`` and
:mod:`pipelines.feast.engine` alike.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from itertools import chain, cycle, repeat
from typing import Any, Final, Literal

from pipelines.feast.version import require_supported_feast

# Before Feast's internals are imported: another Feast may lack them or lay its
# data out differently, and this names the pin to install instead.
require_supported_feast()

import pyarrow as pa
from feast import FeatureView, RepoConfig
from feast.infra.key_encoding_utils import serialize_entity_key
from feast.infra.online_stores.helpers import compute_table_id, extract_text_and_num
from feast.infra.online_stores.sqlite import (
    SqliteOnlineStore,
    SqliteOnlineStoreConfig,
)
from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from feast.utils import make_tzaware

from pipelines.feast.encode import EncodedRows

Row = tuple[EntityKeyProto, dict[str, ValueProto], datetime, datetime | None]
"""One row of Feast's ``online_write_batch``: key, values, event and created time."""


class GuardedSqliteOnlineStoreConfig(SqliteOnlineStoreConfig):
    """Config of :class:`GuardedSqliteOnlineStore` (same fields as SQLite's)."""

    type: Literal["pipelines.feast.sqlite.GuardedSqliteOnlineStore"] = (
        "pipelines.feast.sqlite.GuardedSqliteOnlineStore"  # type: ignore[assignment]
    )


class GuardedSqliteOnlineStore(SqliteOnlineStore):
    """Feast's SQLite online store, where an older write never wins.

    Feast's SQLite store writes every row it is given (``INSERT ... ON
    CONFLICT DO UPDATE``), so materializing an earlier window after a later
    one, or pushing a late event, replaces newer values with older ones. Its
    Redis store skips a write whose event time is not newer than the stored
    one. This store does the same: per entity, only the newest row of a batch,
    and only if it is newer than what the table holds (equal times are
    skipped too, as Redis does). It then writes the same rows as Feast's
    writer, in one ``executemany``.

    Two entry points: Feast's ``online_write_batch`` (protobuf rows: pushes,
    Feast's own engine) and :meth:`write_encoded` (already serialized rows:
    :mod:`pipelines.feast.engine`); both store the same bytes.
    """

    _CHUNK: Final = 500  # host parameters per SELECT, well under SQLite's limit

    def online_write_batch(
        self,
        config: RepoConfig,
        table: FeatureView,
        data: list[Row],
        progress: Callable[[int], Any] | None,
    ) -> None:
        """Write the rows of ``data`` that are newer than the stored values."""
        version = config.entity_key_serialization_version
        keys = [
            serialize_entity_key(row[0], entity_key_serialization_version=version)
            for row in data
        ]
        times = [_naive_utc(row[2]) for row in data]
        fresh = self._fresh(config, table, keys, times)
        online = config.online_store
        if online.vector_enabled or online.enable_openai_compatible_store:
            # Extra columns to fill: Feast's own writer knows them.
            newer = [data[i] for i in fresh]
            super().online_write_batch(config, table, newer, progress)
            return
        params = (
            (
                keys[i],
                feature,
                value.SerializeToString(),
                extract_text_and_num(value, False)[0],
                times[i],
                data[i][3] and _naive_utc(data[i][3]),  # type: ignore[arg-type]
            )
            for i in fresh
            for feature, value in data[i][1].items()
        )
        self._upsert(config, table, params)
        if progress:
            progress(len(data))

    def write_encoded(
        self,
        config: RepoConfig,
        table: FeatureView,
        rows: EncodedRows,
        *,
        commit: bool = True,
    ) -> int:
        """Write serialized rows (``feast_encode.encode_batch`` with texts) that
        are newer than the stored values, as Feast's writer would; rows written.

        ``commit=False`` leaves the transaction open for the next batch
        (:meth:`end_writes` ends it), so a materialization syncs the file once
        per many batches instead of once per batch.
        """
        keys = rows.entity_keys.to_pylist()
        times = rows.event_us.astype("datetime64[us]").tolist()
        created = (
            rows.created_us.astype("datetime64[us]").tolist()
            if rows.created_us is not None
            else [None] * len(keys)
        )
        fresh = self._fresh(config, table, keys, times)
        if not fresh:
            if commit:
                self.end_writes(config)
            return 0
        # Written in entity key order: both of the table's indexes lead with
        # the key, and ordered inserts walk their pages once instead of
        # jumping between them (about a fifth less time in SQLite).
        fresh.sort(key=keys.__getitem__)
        # Feast passes datetimes and sqlite3 adapts each (Feast registers an
        # adapter to epoch seconds); adapt once per row instead of per feature.
        adapt: Callable[[Any], Any] = sqlite3.adapters.get(
            (datetime, sqlite3.PrepareProtocol), _same
        )
        stamps = [adapt(times[i]) for i in fresh]
        made = [created[i] and adapt(created[i]) for i in fresh]
        fresh_keys = [keys[i] for i in fresh]
        names = list(rows.values)
        values, texts = [], []
        order = pa.array(fresh)
        for name in names:
            values.append(rows.values[name].take(order).to_pylist())
            text = rows.texts[name]
            texts.append([text[i] for i in fresh])

        # (key, feature, value, text, event_ts, created_ts) per entity and
        # feature, entity-major, built by C iterators (no Python per row).
        def each_feature(per_row: list[Any]) -> Iterable[Any]:
            return chain.from_iterable(map(repeat, per_row, repeat(len(names))))

        params = zip(
            each_feature(fresh_keys),
            cycle(names),
            chain.from_iterable(zip(*values, strict=True)),
            chain.from_iterable(zip(*texts, strict=True)),
            each_feature(stamps),
            each_feature(made),
        )
        self._upsert(config, table, params, commit=commit)
        return len(fresh)

    def end_writes(self, config: RepoConfig, *, commit: bool = True) -> None:
        """Commit (or roll back) what ``write_encoded(commit=False)`` left open."""
        conn = self._get_conn(config)
        if commit:
            conn.commit()
        else:
            conn.rollback()

    def _upsert(
        self,
        config: RepoConfig,
        table: FeatureView,
        params: Iterable[tuple[Any, ...]],
        *,
        commit: bool = True,
    ) -> None:
        # Feast's writer runs one INSERT per (entity, feature); one
        # executemany of the same statement and values is several times faster.
        name = compute_table_id(
            config.project, table, config.registry.enable_online_feature_view_versioning
        )
        upsert = (
            f'INSERT INTO "{name}" (entity_key, feature_name, value, value_text, '
            "event_ts, created_ts) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(entity_key, feature_name) DO UPDATE SET "
            "value = excluded.value, value_text = excluded.value_text, "
            "event_ts = excluded.event_ts, created_ts = excluded.created_ts"
        )
        conn = self._get_conn(config)
        if not commit:
            conn.executemany(upsert, params)  # sqlite3 opens the transaction
            return
        with conn:
            conn.executemany(upsert, params)

    def _fresh(
        self,
        config: RepoConfig,
        table: FeatureView,
        keys: list[bytes],
        times: list[datetime],
    ) -> list[int]:
        """Indices of the rows to write: per entity the batch's newest row, if
        newer than the stored one (times naive UTC), in batch order."""
        newest: dict[bytes, int] = {}
        for i, (key, ts) in enumerate(zip(keys, times, strict=True)):
            j = newest.get(key)
            if j is None or ts > times[j]:
                newest[key] = i
        stored = self._stored_times(config, table, list(newest))
        return sorted(
            i
            for key, i in newest.items()
            if key not in stored or times[i] > stored[key]
        )

    def _stored_times(
        self, config: RepoConfig, table: FeatureView, keys: list[bytes]
    ) -> dict[bytes, datetime]:
        name = compute_table_id(
            config.project, table, config.registry.enable_online_feature_view_versioning
        )
        conn = self._get_conn(config)
        stored: dict[bytes, datetime] = {}
        for i in range(0, len(keys), self._CHUNK):
            chunk = keys[i : i + self._CHUNK]
            marks = ",".join("?" * len(chunk))
            # `AS "... [timestamp]"` makes sqlite3 parse the aggregate back to a
            # datetime, as it does for the declared column.
            query = (
                f'SELECT entity_key, MAX(event_ts) AS "ts [timestamp]" '
                f'FROM "{name}" WHERE entity_key IN ({marks}) GROUP BY entity_key'
            )
            try:
                stored.update(conn.execute(query, chunk).fetchall())
            except sqlite3.OperationalError as error:
                if "no such table" not in str(error):
                    raise
                # Table not created yet: nothing stored, Feast's write will
                # fail with its own message.
        return stored


def _same(value: Any) -> Any:
    return value


def _naive_utc(ts: datetime) -> datetime:
    # What Feast's SQLite writer stores (naive UTC), so comparisons line up.
    aware = make_tzaware(ts)
    return aware.astimezone(UTC).replace(tzinfo=None)
