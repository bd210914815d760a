"""The student daemon: one vertical student trained continuously from Kafka.

Usage::

    python -m trainer.distill.daemon --kafka-bootstrap HOST:PORT \\
        --examples-topic gem.examples --teacher-topic gem.teacher-outputs \\
        --group gem-student-facebook --domain facebook --teacher CKPT \\
        --checkpoint-dir DIR [--methods full] [--idle-seconds 10] \\
        [--teacher-wait-s 30] [--checkpoint-every 50]

(every flag: ``--help``, :mod:`trainer.distill.daemon`).

It reads the trainer's example messages and, next to them, the teacher-output
topic that :mod:`trainer.distill.teacher_topic` publishes; it joins them by
example id and trains the student (:mod:`trainer.distill.student_trainer`) on its
domain's rows, each batch scored before it is trained on (progressive
calibration per day, teacher staleness seen).

Exactly-once, as the trainer daemon (:mod:`trainer.training.daemon`): checkpoints
(:mod:`trainer.training.checkpoint`, atomic) hold the student, its optimizers, the
*next offset per partition of both topics*, and the teacher rows consumed
but not yet joined (so a restart loses none). Example messages are applied
strictly in the order the source delivers them: a message waits up to
``teacher_wait_s`` for its teacher rows, then trains with the missing ones
masked (labels only; counted as ``examples_without_teacher``). Teacher rows
are at-least-once upstream; a duplicate row is dropped. The teacher's model
code is never imported: dims and shared tables come from its checkpoint's
tensors (:mod:`trainer.distill.sharing`) and the model configuration its
checkpoint carries (:func:`trainer.training.checkpoint.model_record`).

Checkpoints are verified on load as the trainer daemon's are: a corrupt one
is set aside and the previous one used; with checkpoint files but none that
verifies it exits 2 unless ``--start-fresh``. A teacher-output message that
does not decode, or whose embedding width is not the teacher's, is a dead
letter. The dead-letter count is run-wide (kept in the checkpoint).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from features.kafka import KafkaSettings
from features.vocab import DOMAINS
from trainer.data.kafka_source import Item, KafkaSource
from trainer.distill.records import (
    NUM_LOGITS,
    AlignedTeacher,
    decode_teacher_message,
)
from trainer.distill.run import teacher_embedding_settings
from trainer.distill.sharing import summary_embedding_dim, teacher_tables
from trainer.distill.student_data import domain_rows, student_batch
from trainer.distill.student_trainer import (
    FULL,
    DayCalibration,
    DistillConfig,
    StudentTrainer,
    TeacherSeen,
    apply_sharing,
    build_student,
)
from trainer.metrics.prometheus import DaemonMetrics, RunTotals
from trainer.models.base_rate import prior_logits
from trainer.training.checkpoint import (
    read_model_checkpoint,
    resume_state,
    save_checkpoint,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudentDaemonConfig:
    """One student daemon (the CLI's arguments)."""

    examples_topic: str
    teacher_topic: str
    group: str
    domain: str
    teacher: Path
    checkpoint_dir: Path
    distill: DistillConfig = dataclasses.field(
        default_factory=lambda: DistillConfig(methods=FULL)
    )
    idle_seconds: float | None = None
    teacher_wait_s: float = 30.0
    checkpoint_every: int = 50
    keep: int = 3
    max_cached_rows: int = 2_000_000
    start_fresh: bool = False
    prometheus_port: int = 0
    metrics_address: str = "127.0.0.1"


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
        return sum(1 for i in ids if i not in self.rows)

    def aligned(self, ids: list[str]) -> AlignedTeacher:
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
        for example_id in ids:
            self.rows.pop(example_id, None)

    def state_dict(self) -> dict[str, Any]:
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


def _teacher_decoder(
    embedding_width: int,
) -> Any:
    """Teacher-output messages of this teacher's embedding width, else a reason."""

    def decode(
        value: bytes, headers: list[tuple[str, bytes]]
    ) -> tuple[pa.Table | None, str | None]:
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


def run(config: StudentDaemonConfig, settings: KafkaSettings) -> dict[str, Any]:
    """Train until idle (``idle_seconds``) or forever; returns counts and metrics."""
    # First: a directory to refuse is refused before the teacher is read.
    loaded = resume_state(config.checkpoint_dir, start_fresh=config.start_fresh)
    cfg = config.distill
    domain_index = DOMAINS.index(config.domain)
    teacher_state, teacher_path = read_model_checkpoint(config.teacher, "--teacher")
    dim, cap = teacher_embedding_settings(teacher_state, teacher_path)
    emb_dim = summary_embedding_dim(teacher_state)
    torch.manual_seed(cfg.seed)
    student = build_student(
        cfg,
        dim=dim,
        cap=cap,
        teacher_embedding_dim=emb_dim,
        base_logits=prior_logits()[domain_index],
    )
    shared = apply_sharing(
        cfg, student, teacher_tables(teacher_state) if "share" in cfg.methods else None
    )
    del teacher_state
    trainer = StudentTrainer(cfg, student, domain_index)
    cache = TeacherCache(emb_dim, config.max_cached_rows)
    calibration, seen = DayCalibration(), TeacherSeen()
    step = applied = messages = dead_letters = 0
    offsets: dict[int, int] = {}
    teacher_offsets: dict[int, int] = {}
    if loaded is not None:
        state, path = loaded
        trainer.load_state_dict(state["model"])
        cache.load_state_dict(state["teacher_cache"])
        calibration.load_state_dict(state["calibration"])
        seen.load_state_dict(state["teacher_seen"])
        step, applied, messages = (
            int(state[k]) for k in ("step", "examples", "messages")
        )
        dead_letters = int(state.get("dead_letters", 0))
        offsets = {int(p): int(o) for p, o in state["offsets"].items()}
        teacher_offsets = {int(p): int(o) for p, o in state["teacher_offsets"].items()}
        log.info("resumed from %s: step %d, offsets %s", path, step, offsets)
    fresh = loaded is None and config.start_fresh
    examples_source = KafkaSource(
        settings,
        config.examples_topic,
        config.group,
        max_seq_len=1,
        offsets=offsets,
        keep_examples=True,
        start_at_earliest=fresh,
    ).start()
    teacher_source = KafkaSource(
        settings,
        config.teacher_topic,
        f"{config.group}.teacher",
        max_seq_len=1,
        offsets=teacher_offsets,
        decode_record=_teacher_decoder(emb_dim),
        start_at_earliest=fresh,
    ).start()
    exported: DaemonMetrics | None = None  # /metrics, when a port is given
    if config.prometheus_port:
        exported = DaemonMetrics(
            "gem_student",
            config.prometheus_port,
            config.metrics_address,
            restored=RunTotals(
                step=step,
                examples=applied,
                dead_letters=dead_letters,
                checkpoint=loaded[1],
            )
            if loaded is not None
            else None,
            training_gauges=False,
        )
        exported.watch_consumer(config.examples_topic, examples_source.lag)
        exported.watch_consumer(config.teacher_topic, teacher_source.lag)

    def count() -> None:
        if exported is not None:
            exported.advance(examples=applied, steps=step, dead_letters=dead_letters)

    def checkpoint() -> None:
        save_checkpoint(
            config.checkpoint_dir,
            {
                "model": trainer.state_dict(),
                "optimizer": {},  # inside "model": student's and adapter's
                "step": step,
                "examples": applied,
                "messages": messages,
                "dead_letters": dead_letters,
                "offsets": {str(p): o for p, o in examples_source.offsets().items()},
                "teacher_offsets": {
                    str(p): o for p, o in teacher_source.offsets().items()
                },
                "teacher_cache": cache.state_dict(),
                "calibration": calibration.state_dict(),
                "teacher_seen": seen.state_dict(),
                "domain": config.domain,
                "methods": list(cfg.methods),
            },
            keep=config.keep,
        )
        if exported is not None:
            exported.checkpoint_written(step)
        examples_source.request_commit()
        teacher_source.request_commit()

    def pump_teacher(timeout: float) -> None:
        nonlocal dead_letters
        item = teacher_source.next(timeout=timeout)
        while item is not None:
            if item.payload is not None:
                cache.add(item.payload)
            else:
                dead_letters += 1
            teacher_source.mark(item.partition, item.offset + 1)
            teacher_source.iteration_done()
            item = teacher_source.next(timeout=0)

    pending: Item | None = None
    waiting_since = 0.0
    since_checkpoint = 0
    try:
        while True:
            # Fence points for both sources' rebalance listeners, idle or not.
            examples_source.iteration_done()
            teacher_source.iteration_done()
            count()
            pump_teacher(0.0)
            if pending is None:
                pending = examples_source.next(timeout=0.2)
                waiting_since = time.monotonic()
                if pending is None:
                    if (
                        config.idle_seconds is not None
                        and examples_source.drained(config.idle_seconds)
                        and teacher_source.drained(config.idle_seconds)
                    ):
                        break
                    continue
            if pending.batch is not None:
                rows = domain_rows(pending.decoded.examples, config.domain)
                all_ids = pending.decoded.examples.column("example_id").to_pylist()
                ids = rows.column("example_id").to_pylist()
                in_time = time.monotonic() - waiting_since < config.teacher_wait_s
                if cache.missing(ids) and in_time:
                    pump_teacher(0.2)  # the teacher's rows are on their way
                    continue
                if ids:
                    sb = student_batch(
                        rows, pending.decoded.segments, domain_index, cache.aligned(ids)
                    )
                    _, student_p, adapter_p = trainer.step(sb)
                    calibration.add(sb, student_p, adapter_p)
                    seen.add(sb)
                    applied += len(ids)
                    step += 1
                cache.drop(all_ids)  # every example id occurs once: never needed again
            else:
                dead_letters += 1
            count()  # before the mark: a scrape never sees lag ahead of counts
            examples_source.mark(pending.partition, pending.offset + 1)
            messages += 1
            pending = None
            since_checkpoint += 1
            if since_checkpoint >= config.checkpoint_every:
                checkpoint()
                since_checkpoint = 0
        count()
        checkpoint()
    finally:
        examples_source.close()
        teacher_source.close()
        if exported is not None:
            exported.close()
    return {
        "domain": config.domain,
        "methods": list(cfg.methods),
        "step": step,
        "examples": applied,
        "messages": messages,
        "dead_letters": dead_letters,
        "shared_tables": shared,
        "cached_teacher_rows": len(cache.rows),
        "evicted_teacher_rows": cache.evicted,
        "teacher_seen": seen.report(),
        "progressive": calibration.report(trainer.adapter is not None),
    }
