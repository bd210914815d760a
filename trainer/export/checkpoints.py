"""A model checkpoint (``trainer.fit --save``, ``trainer.daemon``) as a serving
artifact: what ``python -m trainer.export`` runs, and how a process that must
not import the teacher's model code (a student's) gets its program."""

from __future__ import annotations

from pathlib import Path

import torch

from trainer.distill.teacher import load_teacher
from trainer.export.writers import DEFAULT_KEEP, write_fitted
from trainer.models.config import config_to_dict


def write_checkpoint(
    checkpoint: Path, artifacts: Path, *, keep: int = DEFAULT_KEEP
) -> Path:
    """Export a model checkpoint (``trainer.fit --save``, the daemon's) as the
    next ``gem`` version; the checkpoint's step, time and offsets say what it
    was trained to."""
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
        max_seq_len=teacher.config.embedding.max_seq_len,
        trained_to={
            "step": teacher.step,
            "trained_until_ms": teacher.time_ms,
            "offsets": state.get("offsets", {}),
        },
        calibration={"method": "base-rate offsets as saved"},
        source={"checkpoint": str(teacher.path)},
        keep=keep,
    )
