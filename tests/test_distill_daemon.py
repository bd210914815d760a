"""The stream form: teacher outputs over Kafka and the student daemon, on the
real embedded broker; exactly-once resume with both topics' offsets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from features.serving_artifacts import (
    PROGRAM,
    TEACHER_PROGRAM,
    load_manifest,
    student_model,
)
from features.vocab import DOMAINS
from tests.example_feed import PER_MESSAGE, ExampleFeed, message_chunks
from trainer.distill.run_config import FULL, DistillConfig
from trainer.distill.student import VerticalStudent, student_from_record
from trainer.distill.student_daemon import run as run_student
from trainer.export.checkpoints import write_checkpoint
from trainer.export.programs import StudentProgram, example_inputs
from trainer.training.checkpoint import load_latest

pytestmark = pytest.mark.integration

MESSAGES = 6


def test_teacher_stream_then_student_daemon_exactly_once(
    feed: ExampleFeed, tmp_path: Path
) -> None:
    stream = feed.teacher_stream(tmp_path, MESSAGES)
    produced = stream.produced
    assert produced["messages"] == MESSAGES
    assert produced["teacher_rows"] == MESSAGES * PER_MESSAGE
    assert produced["dead_letters"] == 0

    config = stream.student(
        tmp_path,
        distill=DistillConfig(methods=FULL),
        idle_seconds=1.0,
        checkpoint_every=3,
    )
    first = run_student(config, feed.settings)
    facebook = DOMAINS.index("facebook") + 1
    expected = sum(
        chunk.column("domain").to_pylist().count(facebook)
        for chunk in message_chunks(feed.reference, MESSAGES)
    )
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

    # The checkpoint says which student it holds: it exports as an artifact
    # whose program scores as the checkpoint's student does.
    exported = write_checkpoint(tmp_path / "student", tmp_path / "artifacts")
    manifest = load_manifest(exported)
    assert (manifest.model, manifest.kind, manifest.domain) == (
        student_model("facebook"),
        "student",
        "facebook",
    )
    assert manifest.teacher_embedding_dim > 0
    assert TEACHER_PROGRAM in manifest.files
    assert manifest.trained_to["offsets"] == state["offsets"]
    sizes, domain, _ = student_from_record(state)
    assert domain == "facebook"
    student = VerticalStudent(sizes, torch.zeros(2))
    student.load_state_dict(state["model"]["student"])
    inputs = example_inputs(manifest.max_seq_len)
    embedding = torch.randn(inputs[3].shape[0], manifest.teacher_embedding_dim)
    with torch.no_grad():
        want = StudentProgram(student.eval())(*inputs, embedding)
        got = torch.export.load(exported / PROGRAM).module()(*inputs, embedding)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)

    # A restart resumes from the checkpoint: nothing is applied twice.
    again = run_student(config, feed.settings)
    assert again["examples"] == expected
    assert again["messages"] == MESSAGES
    assert again["step"] == first["step"]
