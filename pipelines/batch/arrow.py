"""Arrow tables as Beam elements: the IPC coder and the shuffles' element types.

Batches cross every shuffle of the job as Arrow IPC streams
(:mod:`features.arrow_ipc`), never pickled: :class:`ArrowTableCoder` is
registered for ``pyarrow.Table``, so any PCollection whose type hint names
``pa.Table`` (``tuple[int, pa.Table]`` for keyed shards) is encoded with it;
IPC bytes through a GroupByKey run several times faster than pickled tables.
The kernels that work on those tables are :mod:`pipelines.core`'s.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import pyarrow as pa

from features.arrow_ipc import ipc_to_table, table_to_ipc

ShardedTable = tuple[int, pa.Table]
"""A batch of rows and the shard (a small int) they belong to."""


ShardedIpc = tuple[int, bytes]
"""A batch as Arrow IPC bytes and its shard: what crosses a GroupByKey.

Shuffles carry explicit IPC bytes rather than tables behind a coder: a runner
that groups in its own process (FnApiRunner does) decodes and re-encodes
every grouped value with the value coder, which for bytes is a copy."""


TaggedIpc = tuple[str, bytes]
"""IPC bytes and what they hold, for shuffles that carry several kinds."""


TablePart = tuple[str, int, bytes]
"""One part of a feature table: its name, its part number (the shard that
made it, unique per table) and its rows as IPC bytes."""


class ArrowTableCoder(beam.coders.Coder):  # type: ignore[misc]
    """Encodes a ``pyarrow.Table`` as one Arrow IPC stream (schema + batches)."""

    def encode(self, value: pa.Table) -> bytes:
        """The table as IPC stream bytes."""
        return table_to_ipc(value)

    def decode(self, encoded: bytes) -> pa.Table:
        """The table back from IPC stream bytes."""
        return ipc_to_table(encoded)

    def is_deterministic(self) -> bool:
        """Same table, same bytes (needed only if a table were ever a key)."""
        return True

    def estimate_size(self, value: pa.Table, nested: bool = False) -> int:
        """Arrow's own byte count: Beam's default would encode the table
        a second time just to measure it (it samples sizes for its metrics)."""
        return int(value.nbytes)

    def to_type_hint(self) -> Any:
        """The Python type this coder is for."""
        return pa.Table


beam.coders.registry.register_coder(pa.Table, ArrowTableCoder)
