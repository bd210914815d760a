"""The teacher side of the student daemon: teacher-output messages decoded
for one teacher, and their rows kept by example id until the example
message they belong to is trained on.

Teacher rows are at-least-once upstream: a duplicate row is dropped. A
message that does not decode, or whose embedding width is not the
teacher's, is a dead letter. The cache is bounded (oldest rows evicted
first) and goes into the student's checkpoints, so a restart loses no row
consumed but not yet joined.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from trainer.distill.records import (
    NUM_LOGITS,
    AlignedTeacher,
    decode_teacher_message,
)


class TeacherCache:
    """Teacher rows by example id, oldest first, bounded (FIFO eviction)."""

    def __init__(self, embedding_dim: int, max_rows: int) -> None:
        self.dim = embedding_dim
        self.max_rows = max_rows
        self.rows: OrderedDict[str, tuple[np.ndarray, np.ndarray, int, int]] = (
            OrderedDict()
        )
        self.evicted = 0

    def add(self, table: pa.Table) -> None:
        """Keep a teacher-output message's rows (the first of duplicates)."""
        if table.num_rows == 0:
            return
        ids = table.column("example_id").to_pylist()
        logits = np.asarray(
            table.column("teacher_logits").combine_chunks().flatten(), np.float32
        ).reshape(-1, NUM_LOGITS)
        emb = np.asarray(
            table.column("teacher_embedding").combine_chunks().flatten(), np.float32
        ).reshape(len(ids), self.dim)
        steps = table.column("teacher_step").to_numpy()
        times = table.column("teacher_time").cast(pa.int64()).to_numpy()
        for i, example_id in enumerate(ids):
            if example_id not in self.rows:  # a replayed duplicate: keep the first
                self.rows[example_id] = (
                    logits[i],
                    emb[i],
                    int(steps[i]),
                    int(times[i]),
                )
        while len(self.rows) > self.max_rows:
            self.rows.popitem(last=False)
            self.evicted += 1

    def missing(self, ids: list[str]) -> int:
        """How many of ``ids`` have no teacher row yet."""
        return sum(1 for i in ids if i not in self.rows)

    def aligned(self, ids: list[str]) -> AlignedTeacher:
        """The teacher rows of ``ids``, in their order (absent ones masked)."""
        n = len(ids)
        present = np.zeros(n, bool)
        logits = np.zeros((n, NUM_LOGITS), np.float32)
        emb = np.zeros((n, self.dim), np.float32)
        step = np.full(n, -1, np.int64)
        time_ms = np.zeros(n, np.int64)
        for k, example_id in enumerate(ids):
            row = self.rows.get(example_id)
            if row is not None:
                present[k] = True
                logits[k], emb[k], step[k], time_ms[k] = row
        return AlignedTeacher.from_arrays(present, logits, emb, step, time_ms)

    def drop(self, ids: list[str]) -> None:
        """Forget the rows of ``ids`` (their examples are trained on)."""
        for example_id in ids:
            self.rows.pop(example_id, None)

    def state_dict(self) -> dict[str, Any]:
        """The rows and the eviction count, as tensors (for a checkpoint)."""
        ids = list(self.rows)
        rows = list(self.rows.values())
        return {
            "ids": ids,
            "logits": torch.from_numpy(
                np.stack([r[0] for r in rows]) if rows else np.zeros((0, NUM_LOGITS))
            ),
            "embedding": torch.from_numpy(
                np.stack([r[1] for r in rows]) if rows else np.zeros((0, self.dim))
            ),
            "step": torch.tensor([r[2] for r in rows], dtype=torch.int64),
            "time_ms": torch.tensor([r[3] for r in rows], dtype=torch.int64),
            "evicted": self.evicted,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s rows."""
        self.rows.clear()
        logits, emb = state["logits"].numpy(), state["embedding"].numpy()
        for k, example_id in enumerate(state["ids"]):
            self.rows[example_id] = (
                logits[k].astype(np.float32),
                emb[k].astype(np.float32),
                int(state["step"][k]),
                int(state["time_ms"][k]),
            )
        self.evicted = int(state["evicted"])


Decoded = tuple[pa.Table | None, str | None]
"""A decoded teacher-output message, or None and why it is a dead letter."""


def teacher_decoder(
    embedding_width: int,
) -> Callable[[bytes, list[tuple[str, bytes]]], Decoded]:
    """Teacher-output messages of this teacher's embedding width, else a reason."""

    def decode(value: bytes, headers: list[tuple[str, bytes]]) -> Decoded:
        table, reason = decode_teacher_message(value, headers)
        if table is not None:
            width = table.schema.field("teacher_embedding").type.list_size
            if width != embedding_width:
                return None, (
                    f"teacher embedding width {width}, the teacher's is "
                    f"{embedding_width}"
                )
        return table, reason

    return decode
