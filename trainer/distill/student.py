"""Vertical students: one compact DLRM-style model per domain.

**Per domain, not per objective**: a vertical model serves one app's
surfaces, where click and conversion are predicted for the same requests
from the same features; one model with a head per objective shares the
backbone between them, and a standalone conversion model would have too few
positives to learn from (a few per thousand impressions).

**Compact**: torchrec's ``DenseArch`` and ``InteractionArch`` (the DLRM dot
interaction) over the *non-sequential* features only (the 14 sparse ids and
the 27 counters): no sequence encoder, no InterFormer, no PLE. What the
teacher learnt from long user histories can reach a student only through
transfer, which is the point of a vertical model (cheap at serving).

Heads on one shared backbone (ExFM's auxiliary-head layout):

- ``serving``: the head that is served and evaluated;
- ``distill``: the teacher's head (ExFM AH), gradient into the backbone
  scaled by β;
- ``adapter``: the Student Adapter's head (ExFM Eq. 7), likewise.

Representation transfer (our design, in the spirit of LoopFM): the teacher's
summary embedding, layer-normed, joins the counters as dense input.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn
from torchrec.models.dlrm import DenseArch, InteractionArch
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from features.registry import DENSE_FEATURES, SPARSE_FEATURES
from features.vocab import TRAINING_OBJECTIVES
from trainer.data.batch import Batch
from trainer.distill.losses import scale_gradient
from trainer.modules.embeddings import fold_ids, sparse_tables
from trainer.modules.mlp import mlp


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudentConfig:
    """A student's size.

    Args:
        dim: embedding width (equal to the teacher's so tables can be shared).
        max_num_embeddings: table cap (equal to the teacher's so ids match).
        dense_arch: hidden widths of the dense MLP (it ends in ``dim``).
        over_arch: widths of the backbone after the interaction.
        teacher_embedding_dim: width E of the teacher's summary embedding
            read as input (0: no representation transfer).
        grad_scale: β, multiplies the distillation heads' gradient into the
            backbone.
    """

    dim: int = 8
    max_num_embeddings: int | None = 1_000
    dense_arch: tuple[int, ...] = (32,)
    over_arch: tuple[int, ...] = (32, 16)
    teacher_embedding_dim: int = 0
    grad_scale: float = 1.0


STUDENT_PRESETS = {
    # Sizes relative to the teacher's dim and cap (set from its checkpoint).
    "dlrm_small": {"dense_arch": (64,), "over_arch": (64, 32)},
    "dlrm_tiny": {"dense_arch": (16,), "over_arch": (16, 8)},
}


class StudentOutputs(NamedTuple):
    """Logits (B, O) of the three heads."""

    serving: torch.Tensor
    distill: torch.Tensor
    adapter: torch.Tensor


class VerticalStudent(nn.Module):
    """A compact DLRM for one domain, three heads (see the module docstring).

    Args:
        config: sizes.
        base_logits: (O,) initial serving / distillation biases, e.g. the
            logit of the domain's training base rate.

    Shapes: ``forward(batch, teacher_embedding (B, E) | None)`` →
    :class:`StudentOutputs` of (B, O) logits.

    Example:
        >>> student = VerticalStudent(StudentConfig(), torch.zeros(2))
        >>> sorted(student.ebc.embedding_bags)[:2]
        ['t_ad_creative_category', 't_ad_format']
    """

    def __init__(self, config: StudentConfig, base_logits: torch.Tensor) -> None:
        super().__init__()
        self.config = config
        dim, cap = config.dim, config.max_num_embeddings
        self.num_sparse = len(SPARSE_FEATURES)
        self.ebc = EmbeddingBagCollection(tables=sparse_tables(dim, cap))
        self.modulo = fold_ids(SPARSE_FEATURES, cap)
        extra = config.teacher_embedding_dim
        self.teacher_norm = nn.LayerNorm(extra) if extra else None
        self.dense_arch = DenseArch(
            len(DENSE_FEATURES) + extra, [*config.dense_arch, dim]
        )
        self.interaction = InteractionArch(self.num_sparse)
        width = dim + self.num_sparse * (self.num_sparse + 1) // 2
        self.backbone = mlp(width, config.over_arch)
        hidden = config.over_arch[-1]
        objectives = len(TRAINING_OBJECTIVES)
        self.serving = nn.Linear(hidden, objectives)
        self.distill = nn.Linear(hidden, objectives)
        self.adapter = nn.Linear(hidden, objectives)
        with torch.no_grad():
            for head in (self.serving, self.distill, self.adapter):
                head.bias.copy_(base_logits)

    def forward(
        self, batch: Batch, teacher_embedding: torch.Tensor | None = None
    ) -> StudentOutputs:
        sparse = batch.sparse if self.modulo is None else self.modulo(batch.sparse)
        embedded = self.ebc(sparse).values().view(-1, self.num_sparse, self.config.dim)
        dense = batch.dense
        if self.teacher_norm is not None:
            if teacher_embedding is None:
                raise ValueError("this student reads the teacher embedding as input")
            dense = torch.cat([dense, self.teacher_norm(teacher_embedding)], dim=1)
        h = self.backbone(self.interaction(self.dense_arch(dense), embedded))
        scaled = scale_gradient(h, self.config.grad_scale)
        return StudentOutputs(
            self.serving(h), self.distill(scaled), self.adapter(scaled)
        )


def student_record(config: StudentConfig, domain: str, teacher: Path) -> dict[str, Any]:
    """The checkpoint keys that describe a student: ``student_config`` (its
    sizes, as plain data), ``student_domain`` and ``student_teacher`` (the
    teacher checkpoint file whose embedding it reads, and whose program is
    exported beside it)."""
    return {
        "student_config": student_config_dict(config),
        "student_domain": domain,
        "student_teacher": str(teacher.resolve()),
    }


def student_config_dict(config: StudentConfig) -> dict[str, Any]:
    """A student's configuration as plain data (tuples as lists)."""
    return {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in dataclasses.asdict(config).items()
    }


def student_from_record(state: dict[str, Any]) -> tuple[StudentConfig, str, Path]:
    """(config, domain, teacher checkpoint) of a checkpoint's student record.

    Raises:
        KeyError: the checkpoint carries no student record.
    """
    raw = dict(state["student_config"])
    config = StudentConfig(
        **{
            k: tuple(v) if k in ("dense_arch", "over_arch") else v
            for k, v in raw.items()
        }
    )
    return config, str(state["student_domain"]), Path(state["student_teacher"])
