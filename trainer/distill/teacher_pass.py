"""Teacher outputs, computed once per example: GEM forward → Parquet.

Usage: ``python -m trainer.distill.teacher_outputs --help`` (the flags live
in :mod:`trainer.distill.teacher_outputs`).

``DIR`` (``--examples``) is a feature-job output (examples + timelines,
:mod:`trainer.data.feature_output`); ``CKPT`` a teacher checkpoint file or directory
(:mod:`trainer.distill.teacher`). Every example gets exactly one row
(:mod:`trainer.distill.records`): its logits for every (domain, objective),
its summary embedding, and the checkpoint's step and time. Rows out = examples
in; the summary printed as JSON says so.

The output folder is the job's own: held by its lock while it writes, and
new, empty, or one it wrote before (:data:`OUTPUT_MARKER`), which it then
replaces; a folder with other files is refused
(:func:`features.directory_lock.claim_directory`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from features.cli import progress
from features.directory_lock import DirectoryLock, claim_directory
from trainer.data.feature_output import ExampleDataset, event_time_ms
from trainer.data.inputs import make_batch
from trainer.distill.records import (
    teacher_output_schema,
    teacher_output_table,
    write_teacher_outputs,
)
from trainer.distill.teacher import Teacher, load_teacher, teacher_forward

# Examples per forward. A batch's largest buffers then stay under 32 MB,
# glibc's ceiling for serving blocks from the retained heap
# (features.memory): larger batches pay for their buffers in page faults.
DEFAULT_BATCH_SIZE = 256
OUTPUT_MARKER = ".teacher-outputs"
"""Marks a folder this job wrote."""


def teacher_outputs_for(
    teacher: Teacher, examples: pa.Table, timelines: pa.Table | None, max_seq_len: int
) -> pa.Table:
    """Teacher-output rows for one Arrow batch of examples (one forward).

    ``timelines`` may be full timelines or a message's segments; None reads
    the examples' own ``seq_*`` columns (see :func:`trainer.data.inputs.make_batch`).
    """
    batch = make_batch(examples, timelines, max_seq_len=max_seq_len)
    logits, emb = next(teacher_forward(teacher, iter([batch])))
    return teacher_output_table(
        examples.column("example_id").combine_chunks(),
        event_time_ms(examples),
        logits,
        emb,
        step=teacher.step,
        teacher_time_ms=teacher.time_ms,
    )


def run(
    examples_dir: Path,
    teacher_path: Path,
    output: Path,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_seq_len: int | None = None,
    rows_per_file: int = 200_000,
) -> dict[str, Any]:
    """Write the teacher outputs of every example under ``examples_dir``."""
    started = time.perf_counter()
    teacher = load_teacher(teacher_path)
    seq_len = max_seq_len or teacher.config.embedding.max_seq_len
    data = ExampleDataset(examples_dir, max_seq_len=seq_len)
    with DirectoryLock(output, "--output"):
        # A re-run replaces its own folder, never appends duplicates.
        claim_directory(output, OUTPUT_MARKER, "--output")
        written = _write(teacher, data, output, seq_len, batch_size, rows_per_file)
    return {**written, "seconds": time.perf_counter() - started}


def _write(
    teacher: Teacher,
    data: ExampleDataset,
    output: Path,
    seq_len: int,
    batch_size: int,
    rows_per_file: int,
) -> dict[str, Any]:
    """:func:`run`, the folder held and claimed."""
    parts: list[pa.Table] = []
    pending, files, written = 0, 0, 0
    with progress("teacher outputs", total=len(data)) as bar:
        for start in range(0, len(data), batch_size):
            stop = min(start + batch_size, len(data))
            rows = np.arange(start, stop, dtype=np.int64)
            parts.append(
                teacher_outputs_for(
                    teacher, data.examples.take(pa.array(rows)), data.timelines, seq_len
                )
            )
            pending += len(rows)
            if pending >= rows_per_file:
                written += _flush(parts, output, files)
                files, pending = files + 1, 0
            bar.advance(len(rows))
    if parts or files == 0:
        written += _flush(parts, output, files)
        files += 1
    if written != len(data):
        raise RuntimeError(f"wrote {written} teacher outputs for {len(data)} examples")
    return {
        "examples": len(data),
        "teacher_outputs": written,
        "files": files,
        "teacher_checkpoint": str(teacher.path),
        "teacher_step": teacher.step,
        "teacher_time_ms": teacher.time_ms,
        "max_seq_len": seq_len,
    }


def _flush(parts: list[pa.Table], output: Path, index: int) -> int:
    table = pa.concat_tables(parts) if parts else None
    parts.clear()
    if table is None:  # no examples: still one (empty) file with the schema
        table = teacher_output_schema(0).empty_table()
    write_teacher_outputs(table, output, index)
    return table.num_rows
