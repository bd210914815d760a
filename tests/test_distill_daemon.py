"""The stream form: teacher outputs over Kafka and the student daemon, on the
real embedded broker; exactly-once resume with both topics' offsets."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from features.kafka import KafkaSettings
from features.vocab import DOMAINS
from trainer.distill.run_config import FULL, DistillConfig, StudentDaemonConfig
from trainer.distill.student_daemon import run as run_student
from trainer.distill.teacher_topic import run_stream
from trainer.models.base_rate import BaseRateOffset, prior_logits
from trainer.models.config import tiny
from trainer.models.loss_wrapper import GEMTrain
from trainer.models.registry import build_model
from trainer.training.checkpoint import load_latest, model_record, save_checkpoint

from .test_daemon import PER_MESSAGE, messages, publish, tiny_reference

pytestmark = pytest.mark.integration

MESSAGES = 6
TEACHER_TIME_MS = 1_700_000_000_000  # before every generated example


def _teacher(directory: Path) -> Path:
    """A GEM teacher checkpoint (tiny preset, initial weights, step 7)."""
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


def test_teacher_stream_then_student_daemon_exactly_once(
    kafka_settings: KafkaSettings,
    kafka_topic: Callable[[int], str],
    tmp_path: Path,
) -> None:
    reference = tiny_reference()
    examples_topic, teacher_topic = kafka_topic(2), kafka_topic(2)
    values = messages(reference, MESSAGES)
    publish(kafka_settings, examples_topic, values, 2)
    teacher = _teacher(tmp_path / "teacher")

    produced = run_stream(
        kafka_settings,
        examples_topic=examples_topic,
        output_topic=teacher_topic,
        group="teacher-job",
        teacher_path=teacher,
        checkpoint_dir=tmp_path / "teacher-job",
        idle_seconds=1.0,
        partitions=2,
    )
    assert produced["messages"] == MESSAGES
    assert produced["teacher_rows"] == MESSAGES * PER_MESSAGE
    assert produced["dead_letters"] == 0

    config = StudentDaemonConfig(
        examples_topic=examples_topic,
        teacher_topic=teacher_topic,
        group="student",
        domain="facebook",
        teacher=teacher,
        checkpoint_dir=tmp_path / "student",
        distill=DistillConfig(methods=FULL),
        idle_seconds=1.0,
        checkpoint_every=3,
    )
    first = run_student(config, kafka_settings)
    facebook = DOMAINS.index("facebook") + 1
    expected = 0
    for i in range(MESSAGES):
        start = (i * PER_MESSAGE) % (reference.examples.num_rows - PER_MESSAGE)
        chunk = reference.examples.slice(start, PER_MESSAGE)
        expected += sum(1 for d in chunk.column("domain").to_pylist() if d == facebook)
    assert expected > 0
    assert first["messages"] == MESSAGES
    assert first["examples"] == expected
    seen = first["teacher_seen"]
    assert seen["examples_with_teacher"] == expected
    assert seen["examples_without_teacher"] == 0
    assert seen["teacher_steps"] == [7]
    assert seen["staleness_hours"]["min"] > 0  # the teacher is older than all
    assert "t_user_id" in first["shared_tables"]
    # Every joined row was dropped; only the other domains' rows were dropped too.
    assert first["cached_teacher_rows"] == 0

    state, _ = load_latest(tmp_path / "student")
    assert sum(state["offsets"].values()) == MESSAGES  # 2 partitions, from 0
    assert sum(state["teacher_offsets"].values()) == MESSAGES
    assert state["examples"] == expected

    # A restart resumes from the checkpoint: nothing is applied twice.
    again = run_student(config, kafka_settings)
    assert again["examples"] == expected
    assert again["messages"] == MESSAGES
    assert again["step"] == first["step"]
