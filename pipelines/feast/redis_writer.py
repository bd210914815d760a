"""Encoded view rows into Feast's Redis store: Feast's layout, written atomically.

The rows become the commands of Feast's layout (:func:`redis_commands`:
its keys, hash fields, skip rule and key TTL, packed as RESP by Arrow) and
:class:`RedisWriter` sends them.

Feast's Redis writer reads each key's ``_ts:<view>`` and writes the hash
fields only if the row is newer, in two separate pipelines: a concurrent
write (a push) landing between them can be overwritten by an older row.
Ours is atomic and cheaper for Redis to run: per chunk of keys,

    WATCH keys; EVALSHA check (which rows are newer than stored, one flag each)
    MULTI; HSET (+ EXPIRE) of the newer rows; EXEC

If any watched key changed in between, Redis discards the whole EXEC and the
chunk is written again by :data:`REDIS_WRITE_SCRIPT`, which checks and writes
each key inside one script. The values themselves travel as plain HSET
commands: passing them through a script's ARGV costs Redis much more CPU
(every value copied into Lua and back), and Redis is one thread shared with
every other client. Chunks are pipelined one deep: the next chunk's WATCH
and check go out with the previous chunk's MULTI...EXEC.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from pipelines.feast.version import require_supported_feast

# Before Feast's internals are imported: another Feast may lack them or lay its
# data out differently, and this names the pin to install instead.
require_supported_feast()

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from feast import FeatureView, RepoConfig  # noqa: E402
from feast.infra.online_stores.helpers import _mmh3  # noqa: E402

from pipelines.feast import encode as feast_encode  # noqa: E402
from pipelines.feast.encode import EncodedRows  # noqa: E402

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
connection's watched keys for each key added (quadratic in the chunk: a
chunk of a thousand keys costs Redis more per WATCH than the writes it
guards)."""


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
    chunk of :data:`REDIS_KEYS_PER_CHECK` keys (see the module docstring).

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
