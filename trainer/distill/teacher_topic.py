"""Teacher outputs over Kafka: example messages in, teacher-output messages out.

Usage::

    python -m trainer.distill.teacher_stream --kafka-bootstrap HOST:PORT \\
        --examples-topic gem.examples --output-topic gem.teacher-outputs \\
        --group gem-teacher-outputs --teacher CKPT --checkpoint-dir DIR \\
        [--idle-seconds 10] [--partitions 4]

(every flag: ``--help``, :mod:`trainer.distill.teacher_stream`; the teacher
model is the one its checkpoint describes).

The stream form of :mod:`trainer.distill.teacher_pass`: every example
message of the trainer's topic (:mod:`features.example_messages`) is run
through the teacher once and its rows (:mod:`trainer.distill.records`) are
published as one message (Kafka key: the first example id; each row carries
its own). Offsets of the examples topic live in checkpoints written with
:mod:`trainer.training.checkpoint` *after* the producer flushed, so a crash replays
at most the messages since the last checkpoint: teacher rows are
at-least-once, and a duplicate is harmless (same example id, same values
for one teacher checkpoint; readers keep the first). Its checkpoints are
verified on load (:mod:`trainer.training.checkpoint`); with checkpoint files but none
that verifies it exits 2 unless ``--start-fresh`` (then it reads the
examples topic from the earliest offsets).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from features.kafka import KafkaSettings
from features.kafka.settings import MAX_MESSAGE_BYTES
from features.kafka.topics import ensure_topics
from trainer.data.feature_output import event_time_ms
from trainer.data.kafka_source import Item, KafkaSource
from trainer.distill.records import (
    encode_teacher_message,
    teacher_message_headers,
    teacher_output_table,
)
from trainer.distill.teacher import Teacher, load_teacher, teacher_forward
from trainer.training.checkpoint import resume_state, save_checkpoint

log = logging.getLogger(__name__)


def run_stream(
    settings: KafkaSettings,
    *,
    examples_topic: str,
    output_topic: str,
    group: str,
    teacher_path: Path,
    checkpoint_dir: Path,
    idle_seconds: float | None = None,
    checkpoint_every: int = 50,
    partitions: int = 4,
    start_fresh: bool = False,
) -> dict[str, Any]:
    """Run until idle for ``idle_seconds`` (or forever); returns counts."""
    loaded = resume_state(checkpoint_dir, start_fresh=start_fresh)
    teacher = load_teacher(teacher_path)
    offsets: dict[int, int] = {}
    counts = {"messages": 0, "teacher_rows": 0, "dead_letters": 0}
    if loaded is not None:
        state = loaded[0]
        offsets = {int(p): int(o) for p, o in state["offsets"].items()}
        counts["messages"] = int(state["step"])
        counts["teacher_rows"] = int(state["rows"])
        counts["dead_letters"] = int(state.get("dead_letters", 0))
    ensure_topics(settings, {output_topic: partitions})
    source = KafkaSource(
        settings,
        examples_topic,
        group,
        max_seq_len=teacher.config.embedding.max_seq_len,
        offsets=offsets,
        keep_examples=True,
        dead_letter=f"{examples_topic}.{group}.dead-letter",
    ).start()
    # Its topics allow MAX_MESSAGE_BYTES (ensure_topics); so does the producer.
    producer = settings.producer(acks="all", max_request_size=MAX_MESSAGE_BYTES)
    since_checkpoint = 0

    def checkpoint() -> None:
        producer.flush()  # the rows are durable before the offsets move on
        save_checkpoint(
            checkpoint_dir,
            {
                "model": {},
                "optimizer": {},
                "step": counts["messages"],
                "rows": counts["teacher_rows"],
                "dead_letters": counts["dead_letters"],
                "offsets": {str(p): o for p, o in source.offsets().items()},
                "teacher_step": teacher.step,
            },
        )
        source.request_commit()

    try:
        while True:
            # Every loop iteration is a fence point for rebalances (the
            # source's listener waits for one), idle or not.
            source.iteration_done()
            item = source.next(timeout=0.5)
            if item is None:
                if idle_seconds is not None and source.drained(idle_seconds):
                    break
                continue
            if item.batch is not None:
                counts["teacher_rows"] += publish(producer, output_topic, teacher, item)
            else:
                counts["dead_letters"] += 1
            counts["messages"] += 1
            source.mark(item.partition, item.offset + 1)
            since_checkpoint += 1
            if since_checkpoint >= checkpoint_every:
                checkpoint()
                since_checkpoint = 0
        checkpoint()
    finally:
        producer.close()
        source.close()
    return {**counts, "teacher_step": teacher.step}


def publish(producer: Any, topic: str, teacher: Teacher, item: Item) -> int:
    """Run the teacher over ``item``'s batch and send its rows to ``topic`` as
    one message (key: the first example id); returns the rows sent."""
    assert item.batch is not None
    logits, emb = next(teacher_forward(teacher, iter([item.batch])))
    rows = item.decoded.examples
    ids = rows.column("example_id").combine_chunks()
    table = teacher_output_table(
        ids,
        event_time_ms(rows),
        logits,
        emb,
        step=teacher.step,
        teacher_time_ms=teacher.time_ms,
    )
    producer.send(
        topic,
        key=str(ids[0]).encode(),
        value=encode_teacher_message(table),
        headers=teacher_message_headers(),
    )
    return int(table.num_rows)
