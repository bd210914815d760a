"""A checkpoint as a serving artifact: what ``python -m trainer.export`` runs.

A model checkpoint (``trainer.fit --save``, ``trainer.daemon``) becomes the
next ``gem`` version; a student checkpoint (the student daemon's, whose
record :func:`trainer.distill.student.student_record` names its domain and
teacher) the next ``student-<domain>`` version, with its teacher's program
beside it when it reads the teacher's embedding. This process imports the
teacher's model code: a student process that needs a teacher program runs
this command in a subprocess (:mod:`trainer.distill.serving`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainer.distill.sharing import read_checkpoint
from trainer.distill.student import VerticalStudent, student_from_record
from trainer.distill.teacher import load_teacher
from trainer.export.writers import (
    DEFAULT_KEEP,
    gem_program_bytes,
    write_fitted,
    write_student,
)
from trainer.models.config import config_to_dict
from trainer.training.checkpoint import read_model_checkpoint


def write_checkpoint(
    checkpoint: Path,
    artifacts: Path,
    *,
    keep: int = DEFAULT_KEEP,
    max_seq_len: int | None = None,
) -> Path:
    """Export a checkpoint (file, or the newest in a folder) as the next
    version of its model; returns the version's folder.

    ``max_seq_len``: the history window served (default: the model's, or
    for a student its teacher's).
    """
    state = _read(checkpoint)
    if "student_config" in state:
        return write_student_checkpoint(
            state, checkpoint, artifacts, keep=keep, max_seq_len=max_seq_len
        )
    teacher = load_teacher(checkpoint, flag="--checkpoint")
    state = torch.load(teacher.path, map_location="cpu", weights_only=True)
    return write_fitted(
        artifacts,
        teacher.model.model,
        model_config={
            "name": state.get("model_name"),
            "preset": state.get("model_preset"),
            "config": config_to_dict(teacher.config),
        },
        max_seq_len=max_seq_len or teacher.config.embedding.max_seq_len,
        trained_to={
            "step": teacher.step,
            "trained_until_ms": teacher.time_ms,
            "offsets": state.get("offsets", {}),
        },
        calibration={"method": "base-rate offsets as saved"},
        source={"checkpoint": str(teacher.path)},
        keep=keep,
    )


def write_student_checkpoint(
    state: dict[str, Any],
    checkpoint: Path,
    artifacts: Path,
    *,
    keep: int = DEFAULT_KEEP,
    max_seq_len: int | None = None,
) -> Path:
    """Export a student checkpoint's student (``state["model"]["student"]``,
    the :class:`~trainer.distill.student_trainer.StudentTrainer` layout)."""
    config, domain, teacher_path = student_from_record(state)
    student = VerticalStudent(config, torch.zeros(2))
    student.load_state_dict(state["model"]["student"])
    teacher = load_teacher(teacher_path)
    window = max_seq_len or teacher.config.embedding.max_seq_len
    program = None
    if config.teacher_embedding_dim:
        program, _ = gem_program_bytes(teacher.model.model, window)
    return write_student(
        artifacts,
        student.eval(),
        domain,
        teacher_program=program,
        max_seq_len=window,
        trained_to={
            "step": int(state["step"]),
            "examples": int(state.get("examples", 0)),
            "offsets": state.get("offsets", {}),
            "teacher_offsets": state.get("teacher_offsets", {}),
        },
        source={
            "checkpoint": str(checkpoint),
            "teacher_checkpoint": str(teacher.path),
            "teacher_step": teacher.step,
        },
        keep=keep,
    )


def _read(checkpoint: Path) -> dict[str, Any]:
    try:
        return read_checkpoint(checkpoint)
    except (FileNotFoundError, ValueError):
        # The trainer's loader says why in its one-line command error.
        return read_model_checkpoint(checkpoint, "--checkpoint")[0]
