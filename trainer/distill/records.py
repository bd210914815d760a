"""Teacher outputs as Arrow: the schema, Parquet I/O and the join to examples.

One row per example, written once by :mod:`trainer.distill.teacher_pass`
and read by every student (they never run the teacher themselves; ExFM's
"DAS" pattern: one teacher call per unique example, docs/model.md)::

    example_id           string    the impression's event_id (the join key)
    event_time           ts[ms]    the impression time
    teacher_logits       list<f32> NUM_DOMAINS * NUM_OBJECTIVES logits,
                                   domain-major ((d, o) at d * O + o)
    teacher_embedding    list<f32> the teacher's summary embedding (the trunk
                                   output its heads read), width E
    teacher_step         int64     optimizer steps of the teacher checkpoint
    teacher_time         ts[ms]    newest example time the teacher had trained
                                   on (data time: what staleness is measured
                                   against, also when replaying old days)

Parquet layout: ``DIR/part-NNNNN.parquet``; the embedding width is in the
schema metadata (``embedding_dim``). Kept torch-free so that readers need
nothing but Arrow.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from features.arrow_ipc import ipc_to_table, table_to_ipc
from features.vocab import DOMAINS, TRAINING_OBJECTIVES

NUM_LOGITS: Final = len(DOMAINS) * len(TRAINING_OBJECTIVES)
TIMESTAMP: Final = pa.timestamp("ms", tz="UTC")


def teacher_output_schema(embedding_dim: int) -> pa.Schema:
    """The Arrow schema of teacher outputs with summary embeddings of width E.

    Example:
        >>> teacher_output_schema(16).metadata[b"embedding_dim"]
        b'16'
    """
    return pa.schema(
        [
            pa.field("example_id", pa.string(), False),
            pa.field("event_time", TIMESTAMP, False),
            pa.field("teacher_logits", pa.list_(pa.float32(), NUM_LOGITS), False),
            pa.field("teacher_embedding", pa.list_(pa.float32(), embedding_dim), False),
            pa.field("teacher_step", pa.int64(), False),
            pa.field("teacher_time", TIMESTAMP, False),
        ],
        metadata={
            "record": "teacher_output",
            "embedding_dim": str(embedding_dim),
            "logit_layout": "domain-major: (d, o) at d * O + o; "
            f"domains {','.join(DOMAINS)}; objectives {','.join(TRAINING_OBJECTIVES)}",
        },
    )


def teacher_output_table(
    example_ids: pa.Array,
    event_time_ms: npt.NDArray[np.int64],
    logits: npt.NDArray[np.float32],
    embeddings: npt.NDArray[np.float32],
    *,
    step: int,
    teacher_time_ms: int,
) -> pa.Table:
    """Rows for B examples: logits (B, Dm, O) or (B, Dm*O), embeddings (B, E)."""
    n = len(example_ids)
    flat_logits = np.ascontiguousarray(logits, dtype=np.float32).reshape(n, NUM_LOGITS)
    emb = np.ascontiguousarray(embeddings, dtype=np.float32).reshape(n, -1)
    schema = teacher_output_schema(emb.shape[1])
    return pa.table(
        [
            pa.array(example_ids, pa.string()),
            pa.array(np.asarray(event_time_ms, dtype=np.int64)).cast(TIMESTAMP),
            pa.FixedSizeListArray.from_arrays(
                pa.array(flat_logits.reshape(-1)), NUM_LOGITS
            ),
            pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), emb.shape[1]),
            pa.array(np.full(n, step, dtype=np.int64)),
            pa.array(np.full(n, teacher_time_ms, dtype=np.int64)).cast(TIMESTAMP),
        ],
        schema=schema,
    )


def read_teacher_outputs(path: Path | str) -> pa.Table:
    """Every teacher-output row under ``path`` (Parquet parts), one chunk."""
    files = sorted(Path(path).glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no teacher outputs (*.parquet) under {path}")
    return ds.dataset(files, format="parquet").to_table().combine_chunks()


def write_teacher_outputs(table: pa.Table, path: Path | str, part: int) -> Path:
    """Write one part file ``path/part-NNNNN.parquet``."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    file = out / f"part-{part:05d}.parquet"
    pq.write_table(table, file)
    return file


def embedding_dim(table: pa.Table) -> int:
    """E, from the schema metadata (or the list type)."""
    meta = table.schema.metadata or {}
    if b"embedding_dim" in meta:
        return int(meta[b"embedding_dim"])
    return int(table.schema.field("teacher_embedding").type.list_size)


class AlignedTeacher:
    """Teacher outputs aligned row by row with a set of examples.

    Attributes:
        present: (N,) bool, the example has a teacher output.
        logits: (N, Dm*O) float32 (0 where absent).
        embedding: (N, E) float32 (0 where absent).
        step: (N,) int64 teacher step (-1 where absent).
        time_ms: (N,) int64 teacher time (0 where absent).
    """

    @classmethod
    def from_arrays(
        cls,
        present: npt.NDArray[np.bool_],
        logits: npt.NDArray[np.float32],
        embedding: npt.NDArray[np.float32],
        step: npt.NDArray[np.int64],
        time_ms: npt.NDArray[np.int64],
    ) -> AlignedTeacher:
        """Already aligned arrays (the student daemon's join cache)."""
        self = cls.__new__(cls)
        self.present, self.logits, self.embedding = present, logits, embedding
        self.step, self.time_ms = step, time_ms
        return self

    def __init__(self, example_ids: pa.Array | pa.ChunkedArray, outputs: pa.Table):
        if isinstance(example_ids, pa.ChunkedArray):
            example_ids = example_ids.combine_chunks()
        n, dim = len(example_ids), embedding_dim(outputs)
        # Duplicates (a job re-run, a replayed Kafka message) are harmless:
        # index_in takes the first match and every copy holds the same values
        # for one teacher checkpoint.
        index = pc.index_in(example_ids, value_set=outputs.column("example_id"))
        self.present = np.asarray(pc.is_valid(index).to_numpy(zero_copy_only=False))
        rows = np.asarray(pc.fill_null(index, 0).to_numpy(zero_copy_only=False))
        rows = rows.astype(np.int64)
        self.logits = np.zeros((n, NUM_LOGITS), dtype=np.float32)
        self.embedding = np.zeros((n, dim), dtype=np.float32)
        self.step = np.full(n, -1, dtype=np.int64)
        self.time_ms = np.zeros(n, dtype=np.int64)
        if len(outputs) == 0:
            return
        logits = _fixed_list(outputs.column("teacher_logits"), NUM_LOGITS)
        emb = _fixed_list(outputs.column("teacher_embedding"), dim)
        step = outputs.column("teacher_step").to_numpy()
        time_ms = outputs.column("teacher_time").cast(pa.int64()).to_numpy()
        hit = self.present
        self.logits[hit] = logits[rows[hit]]
        self.embedding[hit] = emb[rows[hit]]
        self.step[hit] = step[rows[hit]]
        self.time_ms[hit] = time_ms[rows[hit]]


def _fixed_list(column: pa.ChunkedArray, width: int) -> npt.NDArray[np.float32]:
    array = column.combine_chunks()
    values = array.flatten().to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=np.float32).reshape(-1, width)


# ---- the Kafka form: one message = one Arrow IPC stream of teacher rows ----

MAGIC: Final = b"GEMT"
MESSAGE_VERSION: Final = 2
"""Version of the frame; 2 carries the CRC-32."""
CONTENT_TYPE: Final = "application/vnd.gem.teacher-outputs+arrow"
_HEADER: Final = struct.Struct("<4sHI")


def teacher_message_headers() -> list[tuple[str, bytes]]:
    """The Kafka headers every teacher-output message carries."""
    return [
        ("schema-version", str(MESSAGE_VERSION).encode()),
        ("content-type", CONTENT_TYPE.encode()),
    ]


def encode_teacher_message(table: pa.Table) -> bytes:
    """``b"GEMT" + version (uint16 LE) + CRC-32 (uint32 LE) + IPC stream``.

    The CRC-32 (zlib) covers the IPC stream of teacher-output rows: it is
    checked before decoding, so a corrupted message is a reason, not rows.

    Example:
        >>> t = teacher_output_schema(2).empty_table()
        >>> table, reason = decode_teacher_message(encode_teacher_message(t))
        >>> reason is None, table.num_rows
        (True, 0)
    """
    body = table_to_ipc(table)
    return _HEADER.pack(MAGIC, MESSAGE_VERSION, zlib.crc32(body)) + body


def decode_teacher_message(
    data: bytes, headers: list[tuple[str, bytes]] | None = None
) -> tuple[pa.Table | None, str | None]:
    """The rows of a teacher-output message, or None and why (never raises).

    Rows must be complete (no nulls) and their logits and embeddings finite:
    a student trains on them as they are.

    Example:
        >>> decode_teacher_message(b"junk")
        (None, 'not a teacher-output message (bad magic)')
    """
    if data is None or len(data) < _HEADER.size or bytes(data[:4]) != MAGIC:
        return None, "not a teacher-output message (bad magic)"
    _, version, checksum = _HEADER.unpack_from(data)
    if version != MESSAGE_VERSION:
        return None, f"teacher-output message version {version} unsupported"
    body = data[_HEADER.size :]
    if zlib.crc32(body) != checksum:
        return None, "teacher-output message fails its CRC-32 (corrupted)"
    try:
        table = ipc_to_table(body)
        table.validate(full=True)
    except (pa.ArrowException, ValueError, OSError) as error:
        return None, f"undecodable teacher-output stream: {error}"
    try:
        expected = teacher_output_schema(embedding_dim(table))
    except (KeyError, AttributeError, ValueError, TypeError, OverflowError):
        expected = None
    if expected is None or not table.schema.equals(expected, check_metadata=False):
        return None, "teacher-output rows not in the teacher-output schema"
    if any(column.null_count for column in table.columns):
        return None, "teacher-output rows hold nulls"
    for name in ("teacher_logits", "teacher_embedding"):
        values = table.column(name).combine_chunks().flatten()
        if len(values) and not pc.all(pc.is_finite(values)).as_py():
            return None, f"teacher-output {name} not finite"
    return table, None
