"""Arrow tables as IPC stream bytes, and back: the one codec of the project.

Every table that crosses a process boundary as bytes (a Beam shuffle, keyed
state, a Kafka example message) is one Arrow IPC stream: the schema, then the
batches. Readers read it zero-copy over the bytes they hold.

Compression is the writer's choice: LZ4 frames by default (cheap to
compress, faster still to decompress, and they cut the bytes a runner or a
broker copies), none where the bytes hardly compress or are read back at
once (ids and times; a stage's own state).
"""

from __future__ import annotations

from typing import Final, Literal

import pyarrow as pa

Compression = Literal["lz4"] | None

_OPTIONS: Final = {
    "lz4": pa.ipc.IpcWriteOptions(compression="lz4"),
    None: pa.ipc.IpcWriteOptions(compression=None),
}


def table_to_ipc(table: pa.Table, *, compression: Compression = "lz4") -> bytes:
    """``table`` as one Arrow IPC stream (its buffers ``compression``-compressed).

    Example:
        >>> ipc_to_table(table_to_ipc(pa.table({"a": [1, 2]}))).to_pydict()
        {'a': [1, 2]}
    """
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_OPTIONS[compression]) as out:
        out.write_table(table)
    return bytes(sink.getvalue())


def ipc_to_table(data: bytes) -> pa.Table:
    """The table of an IPC stream (zero-copy over ``data``; any compression)."""
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
