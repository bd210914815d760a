"""Write serving artifacts (:mod:`features.serving_artifacts`) of trained models.

``trainer.fit --save`` writes the fitted model's (:func:`write_fitted`),
``trainer.distill --artifacts`` each domain's student (:func:`write_student`);
``python -m trainer.export`` any model checkpoint's
(:mod:`trainer.export.checkpoints`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from features.serving_artifacts import (
    GEM_MODEL,
    PROGRAM,
    TEACHER_PROGRAM,
    Manifest,
    student_model,
    write_version,
)
from trainer.distill.student import VerticalStudent, student_config_dict
from trainer.export.programs import (
    GemProgram,
    StudentProgram,
    example_inputs,
    export_program,
    program_bytes,
)

DEFAULT_KEEP = 3


def gem_program_bytes(model: nn.Module, max_seq_len: int) -> tuple[bytes, int]:
    """The exported program of a ``BaseRateOffset``-wrapped model and the
    width of its summary embedding."""
    program = GemProgram(model).eval()
    inputs = example_inputs(max_seq_len)
    with torch.no_grad():
        _, embedding = program(*inputs)
    return program_bytes(export_program(program, inputs)), int(embedding.shape[1])


def write_fitted(
    artifacts: Path,
    model: nn.Module,
    *,
    model_config: dict[str, Any],
    max_seq_len: int,
    trained_to: dict[str, Any],
    calibration: dict[str, Any],
    source: dict[str, Any],
    keep: int = DEFAULT_KEEP,
) -> Path:
    """Export a trained model as the next ``gem`` version under ``artifacts``."""
    data, _ = gem_program_bytes(model, max_seq_len)
    manifest = Manifest(
        model=GEM_MODEL,
        kind="gem",
        domain=None,
        max_seq_len=max_seq_len,
        teacher_embedding_dim=0,
        model_config=model_config,
        trained_to=trained_to,
        calibration=calibration,
        source=source,
    )
    path = write_version(artifacts / GEM_MODEL, manifest, {PROGRAM: data}, keep=keep)
    print(f"exported the model to {path}", file=sys.stderr)
    return path


def write_student(
    artifacts: Path,
    student: VerticalStudent,
    domain: str,
    *,
    teacher_program: bytes | None,
    max_seq_len: int,
    trained_to: dict[str, Any],
    source: dict[str, Any],
    keep: int = DEFAULT_KEEP,
) -> Path:
    """Export a domain's student as the next ``student-<domain>`` version.

    A student that reads the teacher's summary embedding is served with the
    teacher's program beside it (``teacher_program``, required then): the
    version holds both and needs nothing else.
    """
    dim = student.config.teacher_embedding_dim
    if dim and teacher_program is None:
        raise ValueError("this student reads the teacher embedding: pass its program")
    inputs = example_inputs(max_seq_len)
    if dim:
        inputs = (*inputs, torch.randn(inputs[3].shape[0], dim))
    program = StudentProgram(student).eval()
    files = {PROGRAM: program_bytes(export_program(program, inputs))}
    if dim:
        assert teacher_program is not None
        files[TEACHER_PROGRAM] = teacher_program
    manifest = Manifest(
        model=student_model(domain),
        kind="student",
        domain=domain,
        max_seq_len=max_seq_len,
        teacher_embedding_dim=dim,
        model_config={"student": student_config_dict(student.config)},
        trained_to=trained_to,
        calibration={"method": "none", "head": "serving"},
        source=source,
    )
    path = write_version(artifacts / student_model(domain), manifest, files, keep=keep)
    print(f"exported the {domain} student to {path}", file=sys.stderr)
    return path
