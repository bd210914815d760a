"""The student daemon: one vertical student trained continuously from Kafka.

Usage::

    python -m trainer.distill.daemon --kafka-bootstrap HOST:PORT \\
        --examples-topic gem.examples --teacher-topic gem.teacher-outputs \\
        --group gem-student-facebook --domain facebook --teacher CKPT \\
        --checkpoint-dir DIR [--methods full] [--idle-seconds 10] \\
        [--teacher-wait-s 30] [--checkpoint-every 50]

(every flag: ``--help``, :mod:`trainer.distill.daemon`).

It reads the trainer's example messages and, next to them, the teacher-output
topic that :mod:`trainer.distill.teacher_topic` publishes
(:mod:`trainer.distill.teacher_cache`); it joins them by example id and
trains the student on its domain's rows
(:class:`~trainer.distill.streaming_student.StreamingStudent`), each batch
scored before it is trained on (progressive calibration per day, teacher
staleness seen).

Exactly-once, as the trainer daemon (:mod:`trainer.training.daemon`):
checkpoints (:mod:`trainer.training.checkpoint`, atomic) hold the student,
its optimizers, the *next offset per partition of both topics*, and the
teacher rows consumed but not yet joined (so a restart loses none). Example
messages are applied strictly in the order the source delivers them: a
message waits up to ``teacher_wait_s`` for its teacher rows, then trains
with the missing ones masked (labels only; counted as
``examples_without_teacher``).

Checkpoints are verified on load as the trainer daemon's are: a corrupt one
is set aside and an older one used; with checkpoint files but none that
verifies it exits 4 unless ``--start-fresh``. The dead-letter count (both
topics') is run-wide (kept in the checkpoint). As the trainer daemon, it
holds its checkpoint directory for the run (:mod:`features.directory_lock`)
and checks both topics' offsets against the topics on restore and on every
assignment (:mod:`trainer.data.offset_check`): the checkpoint keeps both
topics' ids and offset gaps (exit statuses: :mod:`trainer.training.exits`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from features.directory_lock import DirectoryLock
from features.kafka import KafkaSettings
from trainer.data.kafka_source import Item, KafkaSource
from trainer.distill.run_config import StudentDaemonConfig
from trainer.distill.streaming_student import StreamingStudent
from trainer.distill.teacher_cache import teacher_decoder
from trainer.export.periodic import PeriodicExport
from trainer.metrics.prometheus import DaemonMetrics, RunTotals
from trainer.training.checkpoint import (
    read_model_checkpoint,
    resume_state,
    save_checkpoint,
)

log = logging.getLogger(__name__)


def run(config: StudentDaemonConfig, settings: KafkaSettings) -> dict[str, Any]:
    """Train until idle (``idle_seconds``) or forever; returns counts and metrics."""
    with DirectoryLock(config.checkpoint_dir, "--checkpoint-dir"):
        return _run(config, settings)


def _run(config: StudentDaemonConfig, settings: KafkaSettings) -> dict[str, Any]:
    """:func:`run`, the directory held."""
    # First: a directory to refuse is refused before the teacher is read.
    loaded = resume_state(config.checkpoint_dir, start_fresh=config.start_fresh)
    teacher_state, teacher_path = read_model_checkpoint(config.teacher, "--teacher")
    student = StreamingStudent(config, teacher_state, teacher_path)
    del teacher_state
    offsets: dict[int, int] = {}
    teacher_offsets: dict[int, int] = {}
    state: dict[str, Any] = {}
    if loaded is not None:
        state, path = loaded
        student.load_state_dict(state)
        offsets = {int(p): int(o) for p, o in state["offsets"].items()}
        teacher_offsets = {int(p): int(o) for p, o in state["teacher_offsets"].items()}
        log.info("resumed from %s: step %d, offsets %s", path, student.steps, offsets)
    examples = KafkaSource(
        settings,
        config.examples_topic,
        config.group,
        max_seq_len=1,
        offsets=offsets,
        keep_examples=True,
        topic_id=state.get("topic_id"),
        gaps=state.get("offset_gaps", []),
        on_gap=config.on_offset_gap,
    ).start()
    teacher = KafkaSource(
        settings,
        config.teacher_topic,
        f"{config.group}.teacher",
        max_seq_len=1,
        offsets=teacher_offsets,
        decode_record=teacher_decoder(student.cache.dim),
        topic_id=state.get("teacher_topic_id"),
        gaps=state.get("teacher_offset_gaps", []),
        on_gap=config.on_offset_gap,
    )
    try:
        teacher.start()
    except BaseException:
        examples.close()
        raise
    exported: DaemonMetrics | None = None  # /metrics, when a port is given
    if config.prometheus_port:
        exported = DaemonMetrics(
            "gem_student",
            config.prometheus_port,
            config.metrics_address,
            restored=RunTotals(
                step=student.steps,
                examples=student.examples,
                dead_letters=student.dead_letters,
                checkpoint=loaded[1],
            )
            if loaded is not None
            else None,
            training_gauges=False,
        )
        for source in (examples, teacher):
            exported.watch_consumer(source.topic, source.lag)
            exported.watch_gaps(source.topic, source.gap_records)
    daemon = _StudentDaemon(
        config, student, examples, teacher, exported, config.periodic_export()
    )
    try:
        daemon.train()
        daemon.count()
        daemon.checkpoint()
    finally:
        examples.close()
        teacher.close()
        if exported is not None:
            exported.close()
        if daemon.export is not None:
            daemon.export.close()  # the last export started
    return student.report()


@dataclass(frozen=True)
class _StudentDaemon:
    """One run's loop over both topics, and its checkpoints."""

    config: StudentDaemonConfig
    student: StreamingStudent
    examples: KafkaSource
    teacher: KafkaSource
    exported: DaemonMetrics | None
    export: PeriodicExport | None  # serving versions, with --artifacts

    def train(self) -> None:
        """Apply example messages in the order the source delivers them, each
        after its teacher rows (or ``teacher_wait_s``), until both topics
        are idle ``idle_seconds`` (never, without)."""
        config, examples = self.config, self.examples
        pending: Item | None = None
        waiting_since = 0.0
        since_checkpoint = 0
        while True:
            # Fence points for both sources' rebalance listeners, idle or not.
            examples.iteration_done()
            self.teacher.iteration_done()
            self.count()
            self.pump_teacher(0.0)
            if pending is None:
                pending = examples.next(timeout=0.2)
                waiting_since = time.monotonic()
                if pending is None:
                    if (
                        config.idle_seconds is not None
                        and examples.drained(config.idle_seconds)
                        and self.teacher.drained(config.idle_seconds)
                    ):
                        return
                    continue
            in_time = time.monotonic() - waiting_since < config.teacher_wait_s
            if not self.student.step(pending, wait=in_time):
                self.pump_teacher(0.2)  # the teacher's rows are on their way
                continue
            self.count()  # before the mark: a scrape never sees lag ahead of counts
            examples.mark(pending.partition, pending.offset + 1)
            pending = None
            since_checkpoint += 1
            if since_checkpoint >= config.checkpoint_every:
                self.checkpoint()
                since_checkpoint = 0

    def pump_teacher(self, timeout: float) -> None:
        """Take every teacher-output message there is (waiting up to
        ``timeout`` for the first)."""
        item = self.teacher.next(timeout=timeout)
        while item is not None:
            self.student.add_teacher(item)
            self.teacher.mark(item.partition, item.offset + 1)
            self.teacher.iteration_done()
            item = self.teacher.next(timeout=0)

    def count(self) -> None:
        """Bring the exported counters up to date."""
        if self.exported is not None:
            student = self.student
            self.exported.advance(
                examples=student.examples,
                steps=student.steps,
                dead_letters=student.dead_letters,
            )

    def checkpoint(self) -> None:
        """Write one (both topics' offsets in it), then commit them; hand it
        to the serving export."""
        path = save_checkpoint(
            self.config.checkpoint_dir,
            {
                **self.student.state_dict(),
                "offsets": {str(p): o for p, o in self.examples.offsets().items()},
                "teacher_offsets": {
                    str(p): o for p, o in self.teacher.offsets().items()
                },
                "topic_id": self.examples.topic_id,
                "offset_gaps": self.examples.gaps(),
                "teacher_topic_id": self.teacher.topic_id,
                "teacher_offset_gaps": self.teacher.gaps(),
            },
            keep=self.config.keep,
        )
        if self.exported is not None:
            self.exported.checkpoint_written(self.student.steps)
        self.examples.request_commit()
        self.teacher.request_commit()
        if self.export is not None:
            self.export.checkpoint_written(path, self.student.steps)
