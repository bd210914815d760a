"""Feast batch engine: Parquet -> Arrow -> encoded bytes -> online store.

``feature_repo/feature_store*.yaml`` name it::

    batch_engine:
      type: pipelines.feast.engine.ArrowMaterializationEngine

so ``feast materialize`` / ``materialize-incremental``, ``store.materialize``
and ``python -m pipelines.feast materialize`` all run it. For each
feature view and window Feast hands it, it

1. finds, per entity, the latest row in the window from the key and time
   columns alone (what Feast's offline store pulls, without Dask, whose
   hashing pickled every sequence cell several times), then streams the
   feature columns in batches of a few MB (never the whole table: decoding
   a 100k-user sequence table at once cost more kernel time, faulting in
   fresh memory, than the decoding itself);
2. encodes whole columns to Feast's serialized ``ValueProto`` bytes and entity
   keys (:mod:`pipelines.feast.encode`, equal byte for byte to Feast's
   converter);
3. writes them in Feast's own layout through the online store's client:
   :class:`pipelines.feast.sqlite.GuardedSqliteOnlineStore` (one ``executemany``
   per batch, in entity key order, a commit per ``batch_rows``) or Feast's
   Redis store (plain ``HSET`` commands written as raw RESP by Arrow, in
   ``WATCH``/``MULTI``/``EXEC`` transactions behind a check of the stored
   event times: Feast's rule, a row not newer than the stored one is
   skipped, kept atomically; see :class:`RedisWriter`).

Reading, encoding and writing run on three threads, two batches apart.
Whatever it does not cover (another source or store, a transformation, a
Redis cluster) runs Feast's own local engine, unchanged.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from queue import Empty, Full, Queue
from typing import Any, Final, Literal, NamedTuple, TypeVar

from pipelines.feast.version import require_supported_feast

# Before Feast's internals are imported: another Feast may lack them or lay its
# data out differently, and this names the pin to install instead.
require_supported_feast()

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
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

from pipelines.feast import encode as feast_encode
from pipelines.feast.encode import EncodedRows

ENGINE_TYPE: Final = "pipelines.feast.engine.ArrowMaterializationEngine"

T = TypeVar("T")


class ArrowMaterializationEngineConfig(FeastConfigBaseModel):
    """``batch_engine`` settings of :class:`ArrowMaterializationEngine`."""

    type: Literal["pipelines.feast.engine.ArrowMaterializationEngine"] = (
        "pipelines.feast.engine.ArrowMaterializationEngine"
    )
    batch_rows: int = 20_000
    """Most rows encoded and written at once."""
    batch_bytes: int = 8 << 20
    """About this much decoded Parquet per batch: fewer rows for long
    sequences, so each batch's temporary arrays stay a few MB."""
    heap_pad_bytes: int = 256 << 20
    """Freed heap glibc keeps for reuse while materializing (0: leave glibc's
    default; see :func:`reuse_freed_heap`)."""


class ArrowMaterializationEngine(LocalComputeEngine):
    """Feast's local engine, with a columnar path for Parquet file sources.

    Historical retrieval and every view it does not cover are the local
    engine's (see the module docstring).
    """

    def __init__(
        self,
        batch_rows: int = 20_000,
        batch_bytes: int = 8 << 20,
        heap_pad_bytes: int = 256 << 20,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.heap_pad_bytes = heap_pad_bytes

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
        source = view.batch_source
        assert source is not None
        join_keys = join_keys_of(view)
        if len(join_keys) != 1:
            raise ValueError(f"view {view.name!r}: one join key expected")
        (entity,) = join_keys
        parquet = pq.ParquetFile(path)
        columns = [entity, source.timestamp_field, *(f.name for f in view.features)]
        keep = latest_rows(
            parquet,
            entity,
            make_tzaware(task.start_time),
            make_tzaware(task.end_time),
            source.timestamp_field,
        )
        rows = batch_rows(parquet, columns, self.batch_rows, self.batch_bytes)
        bar = task.tqdm_builder(int(keep.sum())) if task.tqdm_builder else None
        writer = online_writer(self.online_store, self.repo_config, self.batch_rows)
        # Three stages on three threads, two batches in flight between each:
        # Parquet decoding (Arrow's C++), encoding (numpy / Arrow) and the
        # store's writes (SQLite steps, the Redis socket) each release the GIL
        # for most of their time, so they overlap on two cores. Small batches
        # keep every temporary array small enough to be reused from the heap
        # (see reuse_freed_heap).
        batches = prefetch(window_batches(parquet, columns, keep, rows))
        encoded = prefetch(writer.encode(view, b, join_keys) for b in batches)
        with (
            reuse_freed_heap(self.heap_pad_bytes),
            contextlib.closing(batches),  # closed last, as the encoder stops first
            contextlib.closing(encoded),
        ):
            try:
                for batch in encoded:
                    writer.write(view, batch)
                    if bar is not None:
                        bar.update(len(batch))
            except BaseException:
                writer.finish(True)
                raise
            writer.finish(False)
        if bar is not None:
            bar.close()


# --- reading the window ----------------------------------------------------------


def latest_rows(
    parquet: pq.ParquetFile,
    entity: str,
    start: datetime,
    end: datetime,
    timestamp_field: str,
) -> np.ndarray:
    """Which rows of a feature table materialization writes: per entity, the
    latest row with ``start <= t <= end`` (ties: the last in the file), as a
    boolean mask over the file's rows.

    Reads only the key and time columns; the feature columns are streamed
    afterwards (:func:`window_batches`), never held whole.
    """
    table = parquet.read(columns=[entity, timestamp_field])
    times = table.column(timestamp_field)
    inside = pc.and_(
        pc.greater_equal(times, pa.scalar(start, times.type)),
        pc.less_equal(times, pa.scalar(end, times.type)),
    )
    rows = np.flatnonzero(inside.to_numpy(zero_copy_only=False))
    keys = table.column(entity).to_numpy()[rows]
    ms = times.cast(pa.int64()).to_numpy()[rows]
    # The feature job writes rows sorted by (entity, time); sort only if not.
    ordered = bool(
        np.all((keys[1:] > keys[:-1]) | ((keys[1:] == keys[:-1]) & (ms[1:] >= ms[:-1])))
    )
    if not ordered:
        order = np.lexsort((ms, keys))  # stable: ties keep their file order
        rows, keys = rows[order], keys[order]
    last = np.append(keys[1:] != keys[:-1], True) if keys.size else keys.astype(bool)
    keep = np.zeros(table.num_rows, bool)
    keep[rows[last]] = True
    return keep


def batch_rows(
    parquet: pq.ParquetFile, columns: list[str], most: int, target_bytes: int
) -> int:
    """Rows per batch: about ``target_bytes`` of decoded ``columns`` (from the
    file's metadata), at most ``most``."""
    meta = parquet.metadata
    if meta.num_rows == 0:
        return most
    wanted = set(columns)
    decoded = sum(
        chunk.total_uncompressed_size
        for group in range(meta.num_row_groups)
        for chunk in map(meta.row_group(group).column, range(meta.num_columns))
        if chunk.path_in_schema.split(".")[0] in wanted
    )
    per_row = max(1, decoded // meta.num_rows)
    return int(min(most, max(64, target_bytes // per_row)))


def window_batches(
    parquet: pq.ParquetFile, columns: list[str], keep: np.ndarray, rows: int
) -> Iterator[pa.RecordBatch]:
    """The kept rows of ``columns``, streamed in batches of about ``rows``."""
    if not keep.any():
        return
    pending: list[pa.RecordBatch] = []
    held = 0
    offset = 0
    for batch in parquet.iter_batches(batch_size=rows, columns=columns):
        mask = keep[offset : offset + batch.num_rows]
        offset += batch.num_rows
        if not mask.all():
            if not mask.any():
                continue
            batch = batch.filter(pa.array(mask))
        if not pending and batch.num_rows >= rows // 2:
            yield batch
            continue
        # A filtered window: gather small pieces into batches of ~`rows`.
        pending.append(batch)
        held += batch.num_rows
        if held >= rows:
            yield pa.Table.from_batches(pending).combine_chunks().to_batches()[0]
            pending, held = [], 0
    if pending:
        yield pa.Table.from_batches(pending).combine_chunks().to_batches()[0]


# --- running stages on threads ------------------------------------------------------

_DONE: Final = object()


def prefetch(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """``items``, produced on a worker thread up to ``depth`` ahead of the
    consumer. An error in the producer is raised in the consumer; a consumer
    that stops early stops the producer."""
    queue: Queue[Any] = Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        queue.put(item, timeout=0.1)
                        break
                    except Full:
                        continue
                if stop.is_set():
                    return
            queue.put(_DONE)
        except BaseException as error:  # handed to the consumer
            queue.put(_Failed(error))

    worker = threading.Thread(target=produce, name="feast-engine-stage", daemon=True)
    worker.start()
    try:
        while True:
            item = queue.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue
            with contextlib.suppress(Empty):
                queue.get_nowait()
            worker.join(timeout=0.05)


@dataclass(frozen=True)
class _Failed:
    error: BaseException


# --- memory ---------------------------------------------------------------------------

# glibc's mallopt parameters, their environment variables and defaults.
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_GLIBC_DEFAULTS: Final = {
    _M_TRIM_THRESHOLD: ("MALLOC_TRIM_THRESHOLD_", 128 * 1024),
    _M_TOP_PAD: ("MALLOC_TOP_PAD_", 128 * 1024),
    _M_MMAP_THRESHOLD: ("MALLOC_MMAP_THRESHOLD_", 128 * 1024),
}
_MMAP_ABOVE: Final = 32 << 20  # glibc's own ceiling for its adaptive threshold


@contextlib.contextmanager
def reuse_freed_heap(pad_bytes: int) -> Iterator[None]:
    """While inside, glibc keeps up to ``pad_bytes`` of freed heap memory for
    reuse instead of handing it back to the kernel, and serves blocks up to
    32 MB from the heap (``mallopt``: ``M_TOP_PAD``, ``M_TRIM_THRESHOLD``,
    ``M_MMAP_THRESHOLD``).

    Encoding allocates and frees the same few arrays per batch; by default
    glibc returns freed memory (or maps a block of its own for each large
    array) and every batch then faults its pages in again, zero-filled by
    the kernel: on a 2-core VM that was more system time than the encoding's
    own work (about 1.3 M page faults and 4 s for one 100k-user Redis run).
    All three settings are needed: setting any one of them turns off glibc's
    adaptive mmap threshold, leaving large arrays mapped (and faulted) anew
    each time. Afterwards glibc's defaults (or the ``MALLOC_*_`` environment
    variables) are set back and the pad trimmed; the adaptive threshold stays
    off (glibc has no way back), which costs a process nothing but the
    reuse of freed blocks over 128 kB. Nothing happens off glibc or with
    ``pad_bytes`` 0.
    """
    mallopt = _glibc_function("mallopt")
    if not pad_bytes or mallopt is None:
        yield
        return
    wanted = {
        _M_TOP_PAD: pad_bytes,
        _M_TRIM_THRESHOLD: pad_bytes,
        _M_MMAP_THRESHOLD: _MMAP_ABOVE,
    }
    for parameter, value in wanted.items():
        mallopt(parameter, value)
    try:
        yield
    finally:
        for parameter, (variable, default) in _GLIBC_DEFAULTS.items():
            text = os.environ.get(variable, "")
            mallopt(parameter, int(text) if text.isdigit() else default)
        trim = _glibc_function("malloc_trim")
        if trim is not None:
            trim(0)


_GLIBC_ARGUMENTS: Final = {
    "mallopt": [ctypes.c_int, ctypes.c_int],
    "malloc_trim": [ctypes.c_size_t],
}


def _glibc_function(name: str) -> Any:
    """glibc's ``name`` through ctypes, or None (another platform or libc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = _GLIBC_ARGUMENTS[name]
    function.restype = ctypes.c_int
    return function


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


# --- Redis -------------------------------------------------------------------------
#
# Feast's Redis writer reads each key's ``_ts:<view>`` and writes the hash
# fields only if the row is newer, in two separate pipelines: a concurrent
# write (a push) landing between them can be overwritten by an older row.
# Ours is atomic and cheaper for Redis to run: per chunk of keys,
#
#   WATCH keys; EVALSHA check (which rows are newer than stored, one flag each)
#   MULTI; HSET (+ EXPIRE) of the newer rows; EXEC
#
# If any watched key changed in between, Redis discards the whole EXEC and the
# chunk is written again by REDIS_WRITE_SCRIPT, which checks and writes each
# key inside one script. The values themselves travel as plain HSET commands:
# passing them through a script's ARGV cost Redis about twice the CPU time
# (every value copied into Lua and back), and Redis is one thread shared with
# every other client. Chunks are pipelined one deep: the next chunk's WATCH
# and check go out with the previous chunk's MULTI...EXEC.

_LUA_EVENT_TIME: Final = """
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
-- Feast's rule: skip a row whose event time is not newer than the stored one.
local function newer(key, ts_field, seconds, nanos)
  local stored = redis.call('HGET', key, ts_field)
  if not stored then return true end
  local s, n = seconds_nanos(stored)
  return (s == 0 and n == 0) or seconds > s or (seconds == s and nanos > n)
end
"""

REDIS_CHECK_SCRIPT: Final = (
    """
-- KEYS: the entities' Redis keys. ARGV: ts field, then per key seconds, nanos.
-- Returns one byte per key: '1' if the row is newer than the stored one.
"""
    + _LUA_EVENT_TIME
    + """
local ts_field = ARGV[1]
local flags = {}
for i = 1, #KEYS do
  local seconds, nanos = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  flags[i] = newer(KEYS[i], ts_field, seconds, nanos) and '1' or '0'
end
return table.concat(flags)
"""
)

REDIS_WRITE_SCRIPT: Final = (
    """
-- KEYS: the entities' Redis keys (serialized entity key + project).
-- ARGV: ts field, feature count F, dedup (1/0), ttl seconds (0: none),
--   F hash fields, then per key: serialized Timestamp, seconds, nanos, F values.
-- Writes a key's hash fields unless (dedup) its stored event time is at
-- least as new: Feast's RedisOnlineStore.online_write_batch, in one script.
"""
    + _LUA_EVENT_TIME
    + """
local ts_field = ARGV[1]
local nf = tonumber(ARGV[2])
local dedup = ARGV[3] == '1'
local ttl = tonumber(ARGV[4])
local written = 0
for i = 1, #KEYS do
  local base = 4 + nf + (i - 1) * (3 + nf)
  local seconds = tonumber(ARGV[base + 2])
  local nanos = tonumber(ARGV[base + 3])
  if not dedup or newer(KEYS[i], ts_field, seconds, nanos) then
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
)

REDIS_KEYS_PER_CHECK: Final = 100
"""Keys per WATCH, check and transaction. Small: Redis 7.0's WATCH scans the
connection's watched keys for each key added (quadratic in the chunk; 1,000
keys cost 4 ms of Redis time per WATCH, more than the writes they guard)."""
REDIS_LANES: Final = 8
"""Connections a writer uses, one chunk in flight on each."""


def _resp_array(count: int, *args: bytes | str | int) -> bytes:
    """The header of a RESP array of ``count`` items and its first ``args``."""
    return b"*%d\r\n" % count + feast_encode.resp_bulk_bytes(*args)


@dataclass(frozen=True)
class RedisCommands:
    """One batch of view rows as Redis commands, packed as RESP by Arrow (see
    :func:`redis_commands`); each row's bytes are one slice of a buffer."""

    rows: int
    names: list[str]
    dedup: bool
    ts_field: str
    keys: _ByteRows
    """Each row's key as a RESP bulk string."""
    times: _ByteRows
    """Each row's event seconds and nanos as two bulk strings (the check's)."""
    writes: _ByteRows
    """Each row's ``HSET`` (and ``EXPIRE``) command."""
    script_header: bytes
    """:data:`REDIS_WRITE_SCRIPT`'s arguments after the keys, before the rows."""
    script_parts: list[pa.Array]
    """Each row's arguments to :data:`REDIS_WRITE_SCRIPT`, in pieces: joined
    only for the rare chunk a concurrent write aborts."""

    def __len__(self) -> int:
        return self.rows

    def watch_and_check(self, sha: str, start: int, stop: int) -> list[Any]:
        """``WATCH`` the keys of rows ``[start, stop)`` and run the check."""
        count = stop - start
        keys = self.keys.slice(start, stop)
        return [
            _resp_array(1 + count, b"WATCH"),
            keys,
            _resp_array(3 + count + 1 + 2 * count, b"EVALSHA", sha, count),
            keys,
            feast_encode.resp_bulk_bytes(self.ts_field),
            self.times.slice(start, stop),
        ]

    def transaction(self, rows: list[int] | range) -> list[Any]:
        """``MULTI``, the writes of ``rows`` (row indices), ``EXEC``."""
        if isinstance(rows, range) and rows.step == 1:
            body = [self.writes.slice(rows.start, rows.stop)]
        else:
            body = [self.writes.slice(i, i + 1) for i in rows]
        return [_resp_array(1, b"MULTI"), *body, _resp_array(1, b"EXEC")]

    def script(self, sha: str, rows: list[int]) -> list[Any]:
        """:data:`REDIS_WRITE_SCRIPT` over ``rows`` (row indices)."""
        count = len(rows)
        arguments = 3 + count + 4 + len(self.names) + count * (3 + len(self.names))
        taken = pa.array(rows, pa.int64())
        per_row = feast_encode.join_rows(*(p.take(taken) for p in self.script_parts))
        return [
            _resp_array(arguments, b"EVALSHA", sha, count),
            *(self.keys.slice(i, i + 1) for i in rows),
            self.script_header,
            _ByteRows.of(per_row).slice(0, count),
        ]


@dataclass(frozen=True)
class _ByteRows:
    """Byte rows as one buffer and offsets: a run of rows is one slice."""

    offsets: np.ndarray
    data: memoryview

    @classmethod
    def of(cls, rows: pa.Array) -> _ByteRows:
        offsets, data = feast_encode.row_slices(rows)
        return cls(offsets, data)

    def slice(self, start: int, stop: int) -> memoryview:
        return self.data[self.offsets[start] : self.offsets[stop]]


def redis_commands(
    config: RepoConfig, view: FeatureView, rows: EncodedRows
) -> RedisCommands:
    """Encoded view rows as the commands that write them.

    Same keys as Feast's Redis store (``serialize_entity_key + project``),
    same hash fields (``mmh3("<view>:<feature>")`` and ``_ts:<view>`` holding
    a serialized ``Timestamp``), same skip rule and key TTL; packed as RESP by
    Arrow (``feast_encode.resp_*``), not one argument at a time.
    """
    from feast.infra.online_stores.redis import _versioned_fv_name

    online = config.online_store
    fv_name = _versioned_fv_name(view, config)
    names = list(rows.values)
    fields = [_mmh3(f"{fv_name}:{name}") for name in names]
    ts_field = f"_ts:{fv_name}"
    ttl = online.key_ttl_seconds or 0
    n = len(rows)
    project = pa.scalar(config.project.encode("utf-8"), pa.large_binary())
    keys = feast_encode.resp_bulk(feast_encode.join_rows(rows.entity_keys, project))
    stamps = feast_encode.resp_bulk(feast_encode.encode_timestamps(rows.event_us))
    values = [feast_encode.resp_bulk(rows.values[name]) for name in names]
    seconds = np.floor_divide(rows.event_us, 1_000_000)
    nanos = (rows.event_us - seconds * 1_000_000) * 1000
    times = feast_encode.join_rows(
        feast_encode.resp_bulk(pa.array(seconds).cast(pa.string())),
        feast_encode.resp_bulk(pa.array(nanos).cast(pa.string())),
    )

    def constant(data: bytes) -> pa.Array:
        return feast_encode.constant_rows(data, n)

    field_bulks = [feast_encode.resp_bulk_bytes(f) for f in fields]
    expire = (
        [constant(_resp_array(3, b"EXPIRE")), keys, constant(_resp_bulk_int(ttl))]
        if ttl
        else []
    )
    writes = feast_encode.join_rows(
        constant(_resp_array(2 + 2 + 2 * len(names), b"HSET")),
        keys,
        constant(feast_encode.resp_bulk_bytes(ts_field)),
        stamps,
        *(
            part
            for bulk, value in zip(field_bulks, values, strict=True)
            for part in (constant(bulk), value)
        ),
        *expire,
    )
    script_header = feast_encode.resp_bulk_bytes(
        ts_field, len(names), 0 if online.skip_dedup else 1, ttl, *fields
    )
    return RedisCommands(
        rows=n,
        names=names,
        dedup=not online.skip_dedup,
        ts_field=ts_field,
        keys=_ByteRows.of(keys),
        times=_ByteRows.of(times),
        writes=_ByteRows.of(writes),
        script_header=script_header,
        script_parts=[stamps, times, *values],
    )


def _resp_bulk_int(value: int) -> bytes:
    return feast_encode.resp_bulk_bytes(value)


@dataclass
class _Lane:
    """One connection of a :class:`RedisWriter` and what was sent on it whose
    replies are not read yet, in send order: ``("check", commands, start,
    stop)``, ``("transaction", commands, rows)`` or ``("unwatch",)``."""

    connection: Any
    unread: list[tuple[Any, ...]] = field(default_factory=list)


class RedisWriter:
    """Writes :class:`RedisCommands` batches, newer rows only, atomically per
    chunk of :data:`REDIS_KEYS_PER_CHECK` keys (see the section comment).

    Chunks go round-robin over :data:`REDIS_LANES` connections of the store's
    client (a WATCH holds its connection until the EXEC). A lane's replies are
    read when the lane comes round again, so while Redis answers one lane the
    writer sends on the others; :meth:`finish` reads what is left.
    """

    def __init__(self, online_store: Any, config: RepoConfig) -> None:
        client = online_store._get_client(config.online_store)
        self._pool = client.connection_pool
        self._check = client.script_load(REDIS_CHECK_SCRIPT)
        self._script = client.script_load(REDIS_WRITE_SCRIPT)
        self._lanes: list[_Lane] = []
        self._turn = 0
        self._aborted: list[tuple[RedisCommands, list[int]]] = []
        self.written = 0
        self.retried = 0
        """Chunks whose transaction a concurrent write aborted (then scripted)."""

    def write(self, commands: RedisCommands) -> None:
        try:
            for start in range(0, commands.rows, REDIS_KEYS_PER_CHECK):
                stop = min(start + REDIS_KEYS_PER_CHECK, commands.rows)
                if commands.dedup:
                    self._visit(self._lane(), ("check", commands, start, stop))
                else:  # Feast's skip_dedup: every row, no check
                    rows = range(start, stop)
                    self._visit(self._lane(), ("transaction", commands, rows))
        except BaseException:
            self.close(failed=True)
            raise

    def finish(self) -> int:
        """Complete the chunks in flight; the rows written in all."""
        try:
            for lane in self._lanes:
                while lane.unread:
                    self._visit(lane, None)
            # A watched key changed between a chunk's check and its EXEC:
            # check and write those rows again, atomically, in one script.
            for commands, rows in self._aborted:
                lane = self._lane()
                self._send(lane, commands.script(self._script, rows))
                self.written += int(lane.connection.read_response())
            self._aborted.clear()
        except BaseException:
            self.close(failed=True)
            raise
        self.close(failed=False)
        return self.written

    def close(self, *, failed: bool) -> None:
        """Hand the connections back (dropped after a failure: replies may be
        left unread on them)."""
        for lane in self._lanes:
            if failed:
                lane.connection.disconnect()
            self._pool.release(lane.connection)
        self._lanes.clear()

    def _lane(self) -> _Lane:
        if len(self._lanes) < REDIS_LANES:
            self._lanes.append(_Lane(self._pool.get_connection()))
            return self._lanes[-1]
        lane = self._lanes[self._turn]  # the one whose chunk went out first
        self._turn = (self._turn + 1) % len(self._lanes)
        return lane

    def _visit(self, lane: _Lane, new: tuple[Any, ...] | None) -> None:
        """Read ``lane``'s replies; send the transaction of the chunk whose
        check came back (its newer rows), then ``new`` (a check or an
        unchecked transaction)."""
        checked = None
        for sent in lane.unread:
            if sent[0] == "check":
                checked = (sent[1], self._read_check(lane, *sent[1:]))
            elif sent[0] == "transaction":
                self._read_transaction(lane, *sent[1:])
            else:
                lane.connection.read_response()  # UNWATCH: OK
        lane.unread = []
        parts: list[Any] = []
        if checked is not None:
            commands, rows = checked
            if rows:
                parts += commands.transaction(rows)
                lane.unread.append(("transaction", commands, rows))
            else:
                parts.append(_resp_array(1, b"UNWATCH"))
                lane.unread.append(("unwatch",))
        if new is not None:
            if new[0] == "check":
                parts += new[1].watch_and_check(self._check, new[2], new[3])
            else:
                parts += new[1].transaction(new[2])
            lane.unread.append(new)
        self._send(lane, parts)

    def _read_check(
        self, lane: _Lane, commands: RedisCommands, start: int, stop: int
    ) -> list[int] | range:
        """The rows of ``[start, stop)`` newer than what Redis holds."""
        lane.connection.read_response()  # WATCH: OK
        flags = lane.connection.read_response()
        if isinstance(flags, str):  # a client with decode_responses
            flags = flags.encode()
        if flags.count(b"1") == stop - start:
            return range(start, stop)
        return [start + i for i, flag in enumerate(flags) if flag == ord("1")]

    def _read_transaction(
        self, lane: _Lane, commands: RedisCommands, rows: list[int] | range
    ) -> None:
        lane.connection.read_response()  # MULTI: OK
        for _ in rows:
            lane.connection.read_response()  # QUEUED
        result = lane.connection.read_response()
        if result is None:  # aborted: a watched key changed since the check
            self.retried += 1
            self._aborted.append((commands, list(rows)))
            return
        failed = [reply for reply in result if isinstance(reply, Exception)]
        if failed:
            raise failed[0]
        self.written += len(rows)

    @staticmethod
    def _send(lane: _Lane, parts: list[Any]) -> None:
        if parts:
            lane.connection.send_packed_command(parts, check_health=False)


def write_redis_encoded(
    online_store: Any, config: RepoConfig, view: FeatureView, rows: EncodedRows
) -> int:
    """Write encoded view rows the way Feast's Redis store does; rows written."""
    writer = RedisWriter(online_store, config)
    writer.write(redis_commands(config, view, rows))
    return writer.finish()
