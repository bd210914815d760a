"""Example messages of a tiny generated set on Kafka, as the daemon tests
feed them: :func:`tiny_reference`, :func:`messages`, :func:`publish`, and
:class:`ExampleFeed` (the ``feed`` fixture of ``conftest.py``), which holds
the session's broker, fresh topics on it and the tiny set together; for the
student daemon, :func:`initial_teacher` and :meth:`ExampleFeed.teacher_stream`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.generated import example_chunks, generated_reference
from features.example_messages import encode_example_message, message_headers
from features.kafka import KafkaSettings
from features.windows import timeline_segments
from pipelines.core.reference import ReferenceOutput
from pipelines.sources.synthetic import GeneratorConfig

PER_MESSAGE = 16
MAX_LEN = 4096  # the tiny preset's
TEACHER_TIME_MS = 1_700_000_000_000
"""When :func:`initial_teacher` was trained until: before every generated example."""

Sent = list[tuple[int, int]]
"""(partition, offset) of each record sent."""


@functools.cache
def tiny_reference() -> ReferenceOutput:
    """A tiny generated set (a few hundred examples), built once per session."""
    return generated_reference(GeneratorConfig(users=120, ads=30, days=2, seed=11))


def messages(reference: ReferenceOutput, count: int) -> list[bytes]:
    """``count`` example messages of PER_MESSAGE examples each."""
    return [
        encode_example_message(chunk, segments, max_seq_len=MAX_LEN)
        for chunk, segments in example_chunks(reference, count, PER_MESSAGE, MAX_LEN)
    ]


def message_chunks(reference: ReferenceOutput, count: int) -> list[pa.Table]:
    """The example rows of ``messages(reference, count)``, message by message."""
    return [
        chunk for chunk, _ in example_chunks(reference, count, PER_MESSAGE, MAX_LEN)
    ]


def out_of_range_message(reference: ReferenceOutput) -> bytes:
    """Decodes fine, but ``user_gender`` ids are outside their table."""
    chunk = reference.examples.slice(0, 4)
    index = chunk.schema.get_field_index("user_gender")
    chunk = chunk.set_column(
        index, chunk.schema.field(index), pa.array([10**6] * 4, pa.int64())
    )
    return encode_example_message(
        chunk,
        timeline_segments(chunk, reference.timelines, MAX_LEN),
        max_seq_len=MAX_LEN,
    )


def publish(
    settings: KafkaSettings, topic: str, values: list[bytes], partitions: int
) -> Sent:
    """Send ``values`` round-robin over partitions; returns (partition, offset)."""
    producer = settings.producer(acks="all", max_request_size=16 * 1024 * 1024)
    futures = [
        producer.send(
            topic, value=v, partition=i % partitions, headers=message_headers()
        )
        for i, v in enumerate(values)
    ]
    producer.flush()
    sent = [(f.get(10).partition, f.get(10).offset) for f in futures]
    producer.close()
    return sent


def initial_teacher(directory: Path) -> Path:
    """A GEM teacher checkpoint: tiny preset, initial weights, step 7, trained
    until :data:`TEACHER_TIME_MS`."""
    import torch

    from trainer.models.base_rate import BaseRateOffset, prior_logits
    from trainer.models.config import tiny
    from trainer.models.loss_wrapper import GEMTrain
    from trainer.models.registry import build_model
    from trainer.training.checkpoint import model_record, save_checkpoint

    torch.manual_seed(0)
    model = GEMTrain(BaseRateOffset(build_model("gem", "tiny"), prior_logits()))
    return save_checkpoint(
        directory,
        {
            "model": model.state_dict(),
            "optimizer": {},
            "step": 7,
            "offsets": {},
            "trained_until_ms": TEACHER_TIME_MS,
            **model_record("gem", "tiny", tiny()),
        },
    )


@dataclass(frozen=True)
class TeacherStream:
    """Example messages and their teacher outputs, each on a topic."""

    examples_topic: str
    teacher_topic: str
    teacher: Path
    """The teacher checkpoint (:func:`initial_teacher`)."""
    produced: dict[str, Any]
    """What the teacher-output job reported."""

    def student(self, directory: Path, **options: Any) -> Any:
        """The ``facebook`` student daemon's config on both topics, its
        checkpoints in ``directory / "student"``; ``options`` set the rest."""
        from trainer.distill.student_daemon import StudentDaemonConfig

        return StudentDaemonConfig(
            examples_topic=self.examples_topic,
            teacher_topic=self.teacher_topic,
            group="student",
            domain="facebook",
            teacher=self.teacher,
            checkpoint_dir=directory / "student",
            **options,
        )


@dataclass(frozen=True)
class ExampleFeed:
    """The session's broker, a factory of fresh topics on it, and the tiny set."""

    settings: KafkaSettings
    new_topic: Callable[[int], str]
    reference: ReferenceOutput

    def messages(self, count: int) -> list[bytes]:
        """``count`` example messages of the tiny set (:func:`messages`)."""
        return messages(self.reference, count)

    def publish(self, topic: str, values: list[bytes], partitions: int = 1) -> Sent:
        """Send ``values`` round-robin over ``topic``'s partitions."""
        return publish(self.settings, topic, values, partitions)

    def topic(self, values: list[bytes], partitions: int = 1) -> tuple[str, Sent]:
        """A fresh topic of ``partitions`` holding ``values``, and what was sent."""
        topic = self.new_topic(partitions)
        return topic, self.publish(topic, values, partitions)

    def teacher_stream(self, directory: Path, count: int) -> TeacherStream:
        """``count`` messages on a fresh 2-partition topic, and the
        teacher-output job of :func:`initial_teacher` (under ``directory``)
        run over them into another."""
        from trainer.distill.teacher_topic import run_stream

        examples_topic, _ = self.topic(self.messages(count), 2)
        teacher_topic = self.new_topic(2)
        teacher = initial_teacher(directory / "teacher")
        produced = run_stream(
            self.settings,
            examples_topic=examples_topic,
            output_topic=teacher_topic,
            group="teacher-job",
            teacher_path=teacher,
            checkpoint_dir=directory / "teacher-job",
            idle_seconds=1.0,
            partitions=2,
        )
        return TeacherStream(examples_topic, teacher_topic, teacher, produced)
