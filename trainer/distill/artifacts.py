"""The batch form's students as serving artifacts
(:mod:`features.serving_artifacts`): one ``student-<domain>`` version each.

A student that reads the teacher's summary embedding is served with the
teacher's program beside it. That program is the teacher's ``gem`` version
under the same root: the current one when it was exported from this
teacher checkpoint at this history window, else one ``python -m
trainer.export`` writes in a *subprocess*, so the student process never
imports the teacher's model code (as for the teacher's outputs,
:func:`trainer.distill.run.ensure_teacher_outputs`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from features.serving_artifacts import (
    GEM_MODEL,
    PROGRAM,
    VERSIONS,
    ArtifactError,
    current_version,
    load_manifest,
)
from trainer.distill.student import VerticalStudent
from trainer.export.writers import DEFAULT_KEEP, write_student


def exported_teacher(artifacts: Path, teacher: Path, max_seq_len: int) -> Path | None:
    """The current ``gem`` version under ``artifacts`` when it is ``teacher``'s
    at ``max_seq_len`` and intact; None otherwise."""
    model_dir = artifacts / GEM_MODEL
    version = current_version(model_dir)
    if version is None:
        return None
    try:
        manifest = load_manifest(model_dir / VERSIONS / version)
    except ArtifactError:
        return None
    source = manifest.source.get("checkpoint")
    same = source is not None and Path(source).resolve() == teacher.resolve()
    if same and manifest.max_seq_len == max_seq_len:
        return model_dir / VERSIONS / version
    return None


def export_teacher(artifacts: Path, teacher: Path, max_seq_len: int) -> Path:
    """The teacher's ``gem`` version: :func:`exported_teacher`, or a new one
    written by ``python -m trainer.export`` in a subprocess.

    Raises:
        subprocess.CalledProcessError: the export failed; its one-line error
            is on stderr already (the child shares it).
    """
    found = exported_teacher(artifacts, teacher, max_seq_len)
    if found is not None:
        return found
    command = [sys.executable, "-m", "trainer.export", "--checkpoint", str(teacher)]
    command += ["--artifacts", str(artifacts), "--max-seq-len", str(max_seq_len)]
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
    return Path(done.stdout.strip().splitlines()[-1])


class StudentExporter:
    """Writes each trained student's version under ``artifacts``.

    Args:
        artifacts: the serving artifacts root.
        teacher: the teacher checkpoint file the students learnt from.
        teacher_state: its state (step and time are recorded).
        max_seq_len: the history window the teacher's outputs were computed
            with (the teacher program serves it).
        keep: versions kept per model.
    """

    def __init__(
        self,
        artifacts: Path,
        teacher: Path,
        teacher_state: dict[str, Any],
        max_seq_len: int,
        keep: int = DEFAULT_KEEP,
    ) -> None:
        self.artifacts = artifacts
        self.teacher = teacher
        self.teacher_state = teacher_state
        self.max_seq_len = max_seq_len
        self.keep = keep
        self._teacher_version: Path | None = None

    def teacher_version(self) -> Path:
        """The teacher's ``gem`` version, exported once per run."""
        if self._teacher_version is None:
            self._teacher_version = export_teacher(
                self.artifacts, self.teacher, self.max_seq_len
            )
        return self._teacher_version

    def write(
        self, domain: str, student: VerticalStudent, steps: int, trained_until_ms: int
    ) -> Path:
        """Export one domain's trained student; returns its version folder."""
        program = None
        source: dict[str, Any] = {
            "command": "trainer.distill",
            "teacher_checkpoint": str(self.teacher),
            "teacher_step": int(self.teacher_state["step"]),
            "teacher_time_ms": self.teacher_state.get("trained_until_ms"),
        }
        if student.config.teacher_embedding_dim:
            version = self.teacher_version()
            program = (version / PROGRAM).read_bytes()
            source["teacher_version"] = version.name
        return write_student(
            self.artifacts,
            student.eval(),
            domain,
            teacher_program=program,
            max_seq_len=self.max_seq_len,
            trained_to={
                "step": steps,
                "trained_until_ms": trained_until_ms,
                "offsets": {},
            },
            source=source,
            keep=self.keep,
        )
