"""Parameter sharing: students start from (or freeze) the teacher's id tables.

Reads the teacher checkpoint's *tensors* (``torch.load(weights_only=True)``),
never the teacher's code: a student's table ``t_<feature>`` takes the
teacher's table of the same feature when the shapes match (same ids, same
hashing and cap, same width). Which parts of the teacher a vertical model
reuses is not public (docs/model.md); reusing the id embeddings is our
choice: they are the teacher's most data-hungry parameters and cost a
student nothing at serving time.

Also reads the few facts a student needs from the checkpoint without the
teacher's code: embedding width and cap, step and teacher time.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import torch
from torch import nn

from trainer.training.checkpoint import load_latest, read_checkpoint_file

_TABLE_KEY: Final = re.compile(r"(?:^|\.)embedding_bags\.(t_\w+)\.weight$")


def read_checkpoint(path: Path) -> dict[str, Any]:
    """The state dict of a checkpoint file, or of the newest one in a directory.

    Verified either way (:mod:`trainer.training.checkpoint`): a corrupt file raises
    :class:`~trainer.training.checkpoint.CheckpointCorruptError`.
    """
    if path.is_dir():
        found = load_latest(path)
        if found is None:
            raise FileNotFoundError(f"no readable checkpoint in {path}")
        return found[0]
    return read_checkpoint_file(path)


def teacher_tables(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """``t_<feature>`` → weight of every pooled id table in the teacher."""
    tables = {}
    for key, value in state["model"].items():
        match = _TABLE_KEY.search(key)
        if match:
            tables[match.group(1)] = value
    return tables


def summary_embedding_dim(state: dict[str, Any]) -> int:
    """E, the width of the teacher's summary embedding: the input width of its
    PLE heads' first shared expert (read from the tensor, not the code)."""
    for key, value in state["model"].items():
        if re.search(r"(?:^|\.)heads\.shared\.0\.0\.weight$", key):
            return int(value.shape[1])
    raise ValueError("no GEM heads in this checkpoint: cannot tell the embedding width")


def embedding_settings(state: dict[str, Any]) -> tuple[int, int | None] | None:
    """(dim, cap) of the teacher's embeddings, from a stored config (or None)."""
    config = state.get("model_config")
    if not config:
        return None
    emb = config["embedding"]
    return int(emb["dim"]), emb["max_num_embeddings"]


def share_tables(
    student_tables: nn.ModuleDict, teacher: dict[str, torch.Tensor], *, frozen: bool
) -> list[str]:
    """Copy matching teacher tables into the student's; optionally freeze them.

    Args:
        student_tables: the student's ``EmbeddingBagCollection.embedding_bags``.
        teacher: :func:`teacher_tables` of the teacher checkpoint.
        frozen: ``requires_grad = False`` on the shared tables (reuse) instead
            of fine-tuning them (start from).

    Returns:
        The names of the tables shared (sorted).
    """
    shared = []
    for name, bag in student_tables.items():
        weight = teacher.get(name)
        if weight is None or weight.shape != bag.weight.shape:
            continue
        with torch.no_grad():
            bag.weight.copy_(weight)
        bag.weight.requires_grad_(not frozen)
        shared.append(name)
    return sorted(shared)
