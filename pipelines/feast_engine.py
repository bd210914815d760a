"""Feast batch engine: Parquet -> Arrow -> encoded bytes -> online store.

``feature_repo/feature_store*.yaml`` name it::

    batch_engine:
      type: pipelines.feast_engine.ArrowMaterializationEngine

so ``feast materialize`` / ``materialize-incremental``, ``store.materialize``
and ``python -m pipelines.feast_ops materialize`` all run it. For each
feature view and window Feast hands it, it

1. reads the view's Parquet file with pyarrow and keeps, per entity, the
   latest row in the window (what Feast's offline store pulls, without Dask,
   whose hashing pickled every sequence cell several times);
2. encodes whole columns to Feast's serialized ``ValueProto`` bytes and entity
   keys (:mod:`pipelines.feast_encode`, equal byte for byte to Feast's
   converter);
3. writes them in Feast's own layout through the online store's client:
   :class:`pipelines.feast_ops.GuardedSqliteOnlineStore` (one ``executemany``
   per batch) or Feast's Redis store (one server-side script call per
   thousand entities, written as raw RESP by Arrow: the same ``HSET`` of the
   same hash fields, and the same rule as Feast's writer: a row whose event
   time is not newer than the stored one is skipped).

Whatever it does not cover (another source or store, a transformation, a
Redis cluster) runs Feast's own local engine, unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple

import numpy as np
import pyarrow as pa
from feast import FeatureView, FileSource, RepoConfig
from feast.infra.common.materialization_job import (
    MaterializationJobStatus,
    MaterializationTask,
)
from feast.infra.compute_engines.local.compute import LocalComputeEngine
from feast.infra.compute_engines.local.job import LocalMaterializationJob
from feast.infra.online_stores.helpers import _mmh3
from feast.infra.registry.base_registry import BaseRegistry
from feast.repo_config import FeastConfigBaseModel
from feast.utils import _convert_arrow_to_proto, make_tzaware
from feast.value_type import ValueType

from pipelines import feast_encode
from pipelines.feast_encode import EncodedRows

ENGINE_TYPE: Final = "pipelines.feast_engine.ArrowMaterializationEngine"


class ArrowMaterializationEngineConfig(FeastConfigBaseModel):
    """``batch_engine`` settings of :class:`ArrowMaterializationEngine`."""

    type: Literal["pipelines.feast_engine.ArrowMaterializationEngine"] = (
        "pipelines.feast_engine.ArrowMaterializationEngine"
    )
    batch_rows: int = 20_000
    """Rows encoded and written at once (bounds memory for long sequences)."""


class ArrowMaterializationEngine(LocalComputeEngine):
    """Feast's local engine, with a columnar path for Parquet file sources.

    Historical retrieval and every view it does not cover are the local
    engine's (see the module docstring).
    """

    def __init__(self, batch_rows: int = 20_000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batch_rows = batch_rows

    def _materialize_one(
        self, registry: BaseRegistry, task: MaterializationTask, **kwargs: Any
    ) -> LocalMaterializationJob:
        view = task.feature_view
        path = columnar_path(view, task)
        if path is None:
            return super()._materialize_one(registry, task, **kwargs)
        job_id = f"{view.name}-{task.start_time}-{task.end_time}"
        try:
            self._materialize_file(view, path, task)
        except Exception as error:
            return LocalMaterializationJob(
                job_id=job_id, status=MaterializationJobStatus.ERROR, error=error
            )
        return LocalMaterializationJob(
            job_id=job_id, status=MaterializationJobStatus.SUCCEEDED
        )

    def _materialize_file(
        self, view: FeatureView, path: Path, task: MaterializationTask
    ) -> None:
        # Imported here: feast_ops imports this module's siblings, and the
        # yaml loads this module on its own.
        from pipelines.feast_ops import latest_in_window

        source = view.batch_source
        assert source is not None
        join_keys = {c.name: c.dtype.to_value_type() for c in view.entity_columns}
        if len(join_keys) != 1:
            raise ValueError(f"view {view.name!r}: one join key expected")
        (entity,) = join_keys
        table = latest_in_window(
            path,
            entity,
            make_tzaware(task.start_time),
            make_tzaware(task.end_time),
            timestamp_field=source.timestamp_field,
        )
        bar = task.tqdm_builder(table.num_rows) if task.tqdm_builder else None
        writer = online_writer(self.online_store, self.repo_config)
        batches = table.to_batches(max_chunksize=self.batch_rows)
        # Two stages: batch i+1 is encoded on a worker thread while batch i is
        # written (numpy / Arrow and the store's socket or SQLite release the
        # GIL, so the two overlap on two cores).
        with ThreadPoolExecutor(max_workers=1) as encoder:
            pending = [
                encoder.submit(writer.encode, view, b, join_keys) for b in batches[:1]
            ]
            for i, batch in enumerate(batches):
                encoded = pending.pop().result()
                if i + 1 < len(batches):
                    pending.append(
                        encoder.submit(writer.encode, view, batches[i + 1], join_keys)
                    )
                writer.write(view, encoded)
                if bar is not None:
                    bar.update(batch.num_rows)
        if bar is not None:
            bar.close()


def columnar_path(view: Any, task: MaterializationTask) -> Path | None:
    """The local Parquet file :class:`ArrowMaterializationEngine` reads for
    ``view``, or None where Feast's own engine must run."""
    source = getattr(view, "batch_source", None)
    if (
        type(view) is not FeatureView  # batch / stream views: transformations
        or task.disable_event_timestamp
        or not isinstance(source, FileSource)
        or source.field_mapping
        or source.created_timestamp_column
        or len(view.entity_columns) != 1
    ):
        return None
    path = Path(source.path)
    if "://" in source.path or path.suffix != ".parquet" or not path.is_file():
        return None
    return path


# --- writers -----------------------------------------------------------------------


class Writer(NamedTuple):
    """How view rows reach an online store, in two stages (see above)."""

    encode: Callable[[FeatureView, pa.RecordBatch, dict[str, ValueType]], Any]
    write: Callable[[FeatureView, Any], object]


def online_writer(online_store: Any, config: RepoConfig) -> Writer:
    """The fastest faithful way to write view rows into ``online_store``."""
    from feast.infra.online_stores.redis import RedisOnlineStore, RedisType

    from pipelines.feast_ops import GuardedSqliteOnlineStore

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
        return Writer(
            encode=lambda view, batch, keys: encode(view, batch, keys, True),
            write=lambda view, rows: online_store.write_encoded(config, view, rows),
        )
    if (
        isinstance(online_store, RedisOnlineStore)
        and online.redis_type == RedisType.redis
    ):
        return Writer(
            encode=lambda view, batch, keys: redis_commands(
                config, view, encode(view, batch, keys, False)
            ),
            write=lambda view, commands: send_redis_commands(
                online_store, config, commands
            ),
        )
    # Anything else: Feast's converter and the store's own writer.
    return Writer(
        encode=_convert_arrow_to_proto,
        write=lambda view, rows: online_store.online_write_batch(
            config, view, rows, progress=None
        ),
    )


def _feature_types(view: FeatureView) -> dict[str, ValueType]:
    return {f.name: f.dtype.to_value_type() for f in view.features}


# --- Redis -------------------------------------------------------------------------

REDIS_WRITE_SCRIPT: Final = """
-- KEYS: the entities' Redis keys (serialized entity key + project).
-- ARGV: ts field, feature count F, dedup (1/0), ttl seconds (0: none),
--   F hash fields, then per key: serialized Timestamp, seconds, nanos, F values.
-- Writes a key's hash fields unless (dedup) its stored event time is at
-- least as new: Feast's RedisOnlineStore.online_write_batch, server-side.
local ts_field = ARGV[1]
local nf = tonumber(ARGV[2])
local dedup = ARGV[3] == '1'
local ttl = tonumber(ARGV[4])
local function varint(s, pos)
  local value, scale = 0, 1
  while true do
    local b = string.byte(s, pos)
    pos = pos + 1
    value = value + (b % 128) * scale
    if b < 128 then
      if value >= 9223372036854775808 then value = value - 18446744073709551616 end
      return value, pos
    end
    scale = scale * 128
  end
end
local function seconds_nanos(s)
  local seconds, nanos, pos = 0, 0, 1
  while pos <= #s do
    local tag = string.byte(s, pos)
    local value
    value, pos = varint(s, pos + 1)
    if tag == 8 then seconds = value elseif tag == 16 then nanos = value end
  end
  return seconds, nanos
end
local written = 0
for i = 1, #KEYS do
  local base = 4 + nf + (i - 1) * (3 + nf)
  local seconds = tonumber(ARGV[base + 2])
  local nanos = tonumber(ARGV[base + 3])
  local fresh = true
  if dedup then
    local stored = redis.call('HGET', KEYS[i], ts_field)
    if stored then
      local s, n = seconds_nanos(stored)
      if (s ~= 0 or n ~= 0) and (seconds < s or (seconds == s and nanos <= n)) then
        fresh = false
      end
    end
  end
  if fresh then
    local args = {ts_field, ARGV[base + 1]}
    for f = 1, nf do
      args[#args + 1] = ARGV[4 + f]
      args[#args + 1] = ARGV[base + 3 + f]
    end
    redis.call('HSET', KEYS[i], unpack(args))
    if ttl > 0 then redis.call('EXPIRE', KEYS[i], ttl) end
    written = written + 1
  end
end
return written
"""

REDIS_KEYS_PER_CALL: Final = 1000
REDIS_CALLS_IN_FLIGHT: Final = 8


@dataclass(frozen=True)
class RedisCommands:
    """The ``EVALSHA`` calls writing one batch, packed as RESP (see
    :func:`redis_commands`)."""

    rows: int
    names: list[str]
    header: bytes
    key_offsets: np.ndarray
    keys: memoryview
    row_offsets: np.ndarray
    values: memoryview

    def command(self, sha: str, start: int, stop: int) -> list[bytes | memoryview]:
        """``EVALSHA sha n key... header... row...`` for rows ``[start, stop)``."""
        count = stop - start
        arguments = 3 + count + 4 + len(self.names) + count * (3 + len(self.names))
        return [
            b"*%d\r\n" % arguments
            + feast_encode.resp_bulk_bytes(b"EVALSHA", sha, count),
            self.keys[self.key_offsets[start] : self.key_offsets[stop]],
            self.header,
            self.values[self.row_offsets[start] : self.row_offsets[stop]],
        ]


def redis_commands(
    config: RepoConfig, view: FeatureView, rows: EncodedRows
) -> RedisCommands:
    """Encoded view rows as the arguments of :data:`REDIS_WRITE_SCRIPT`.

    Same keys as Feast's Redis store (``serialize_entity_key + project``),
    same hash fields (``mmh3("<view>:<feature>")`` and ``_ts:<view>`` holding
    a serialized ``Timestamp``), same skip rule and key TTL; the arguments are
    packed as RESP by Arrow (``feast_encode.resp_*``), not one by one.
    """
    from feast.infra.online_stores.redis import _versioned_fv_name

    online = config.online_store
    fv_name = _versioned_fv_name(view, config)
    names = list(rows.values)
    project = pa.scalar(config.project.encode("utf-8"), pa.large_binary())
    keys = feast_encode.resp_bulk(feast_encode.join_rows(rows.entity_keys, project))
    seconds = np.floor_divide(rows.event_us, 1_000_000)
    nanos = (rows.event_us - seconds * 1_000_000) * 1000
    per_row = feast_encode.join_rows(
        feast_encode.resp_bulk(feast_encode.encode_timestamps(rows.event_us)),
        feast_encode.resp_bulk(pa.array(seconds).cast(pa.string())),
        feast_encode.resp_bulk(pa.array(nanos).cast(pa.string())),
        *(feast_encode.resp_bulk(rows.values[name]) for name in names),
    )
    header = feast_encode.resp_bulk_bytes(
        f"_ts:{fv_name}",
        len(names),
        0 if online.skip_dedup else 1,
        online.key_ttl_seconds or 0,
        *(_mmh3(f"{fv_name}:{name}") for name in names),
    )
    key_offsets, key_data = feast_encode.row_slices(keys)
    row_offsets, row_data = feast_encode.row_slices(per_row)
    return RedisCommands(
        len(rows), names, header, key_offsets, key_data, row_offsets, row_data
    )


def send_redis_commands(
    online_store: Any, config: RepoConfig, commands: RedisCommands
) -> int:
    """Run the script over the batch, a few calls in flight on one connection
    of the store's client; the number of rows written (newer than stored)."""
    if commands.rows == 0:
        return 0
    client = online_store._get_client(config.online_store)
    sha = client.script_load(REDIS_WRITE_SCRIPT)
    starts = list(range(0, commands.rows, REDIS_KEYS_PER_CALL))
    written = 0
    with _connection(client) as connection:
        for first in range(0, len(starts), REDIS_CALLS_IN_FLIGHT):
            group = starts[first : first + REDIS_CALLS_IN_FLIGHT]
            for start in group:
                stop = min(start + REDIS_KEYS_PER_CALL, commands.rows)
                connection.send_packed_command(
                    commands.command(sha, start, stop), check_health=False
                )
            for _ in group:
                written += int(connection.read_response())
    return written


def write_redis_encoded(
    online_store: Any, config: RepoConfig, view: FeatureView, rows: EncodedRows
) -> int:
    """Write encoded view rows the way Feast's Redis store does; rows written."""
    return send_redis_commands(online_store, config, redis_commands(config, view, rows))


@contextlib.contextmanager
def _connection(client: Any) -> Iterator[Any]:
    """A connection of ``client``'s pool; dropped (not reused) after an error,
    since replies may be left unread on it."""
    pool = client.connection_pool
    connection = pool.get_connection()
    try:
        yield connection
    except BaseException:
        connection.disconnect()
        raise
    finally:
        pool.release(connection)
