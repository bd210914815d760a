"""Train one vertical student with any mix of the five transfer methods.

=============  ===============================================================
method         what it changes
=============  ===============================================================
``standard``   the teacher's soft target mixed into the serving loss (baseline)
``aux``        ExFM auxiliary head: serving head on labels only, a separate
               distillation head on ``min(α·σ(z_F), 1)``, gradient × β
``adapter``    ExFM Student Adapter: a second distillation head on
               ``SG(σ(z_SA))``, the adapter trained on the freshest labels
``repr``       the teacher's summary embedding as student input (LoopFM-like)
``share``      the student's id tables start from the teacher's (or reuse
               them frozen, ``share_frozen``)
=============  ===============================================================

"full" = ``aux,adapter,repr,share``. Nothing here imports the teacher's model
code: teacher knowledge arrives as rows (:mod:`trainer.distill.records`)
and, for ``share``, as checkpoint tensors (:mod:`trainer.distill.sharing`).

Per batch, in this order: (1) the adapter scores the batch *before* learning
from it (its output is the stop-gradient target), (2) the student steps on
its loss, (3) the adapter steps on the same batch's labels with its own
optimizer. Every batch of the first epoch is also scored before the student
trains on it (progressive validation), giving per-day calibration of the
student, the raw teacher and the adapter: the freshness curves.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import torch
from torch import nn

from features.metrics import binary_metrics
from features.vocab import TRAINING_OBJECTIVES
from trainer.distill.adapter import OffsetTracker, StudentAdapter
from trainer.distill.losses import (
    adapter_distill_loss,
    adapter_fit_loss,
    auxiliary_head_loss,
    masked_bce,
    standard_kd_loss,
)
from trainer.distill.run_config import DistillConfig
from trainer.distill.sharing import share_tables
from trainer.distill.student import (
    STUDENT_PRESETS,
    StudentConfig,
    StudentOutputs,
    VerticalStudent,
)
from trainer.distill.student_data import StudentBatch, StudentData
from trainer.training.optimizers import adam

_MS_PER_DAY: Final = 86_400_000


def student_loss(
    out: StudentOutputs,
    sb: StudentBatch,
    cfg: DistillConfig,
    adapter_logits: torch.Tensor | None,
) -> torch.Tensor:
    """The student's loss for the enabled methods (see the module table)."""
    labels, teacher, mask = sb.batch.labels, sb.teacher_logits, sb.teacher_mask
    methods = cfg.methods

    def auxiliary() -> torch.Tensor:
        return auxiliary_head_loss(
            out.serving,
            out.distill,
            labels,
            teacher,
            mask,
            weight=cfg.aux_weight,
            label_scale=cfg.label_scale,
        )

    if "standard" in methods:
        loss = standard_kd_loss(
            out.serving,
            labels,
            teacher,
            mask,
            weight=cfg.kd_weight,
            temperature=cfg.kd_temperature,
        )
        if "aux" in methods:  # both: the auxiliary term on top of standard KD
            loss = loss + auxiliary() - masked_bce(out.serving, labels)
    elif "aux" in methods:
        loss = auxiliary()
    else:
        loss = masked_bce(out.serving, labels)
    if adapter_logits is not None:
        loss = loss + cfg.adapter_weight * adapter_distill_loss(
            out.adapter, adapter_logits, mask
        )
    return loss


def adapter_step(
    adapter: StudentAdapter,
    optimizer: torch.optim.Optimizer,
    sb: StudentBatch,
    domain_index: int,
) -> torch.Tensor:
    """One update of the adapter on the batch's labels; touches only its params.

    With a tracker: first the filter takes the batch (its observation is the
    MLP's output the batch was scored with), then the MLP steps on the labels
    with the *updated* offset added as a constant, so the MLP learns what the
    offset does not explain (shape, per-objective) and the filter owns the
    intercept.
    """
    adapter.train()
    optimizer.zero_grad(set_to_none=True)
    domain = torch.full((sb.batch.size,), domain_index, dtype=torch.long)
    logits = adapter.mlp_logits(sb.teacher_logits, domain, sb.staleness_hours)
    if adapter.tracker is not None:
        adapter.tracker.update(
            logits.detach(),
            sb.batch.labels,
            sb.teacher_mask,
            domain,
            sb.staleness_hours,
        )
        logits = logits + adapter.tracker.offset(domain, sb.staleness_hours)
    loss = adapter_fit_loss(logits, sb.batch.labels, sb.teacher_mask)
    loss.backward()
    optimizer.step()
    return loss.detach()


def make_tracker(cfg: DistillConfig) -> OffsetTracker | None:
    """The adapter's calibration filter for ``cfg`` (None when switched off)."""
    if not cfg.adapter_tracker:
        return None
    return OffsetTracker(
        level_noise=cfg.adapter_level_noise, slope_noise=cfg.adapter_slope_noise
    )


def adapter_logits_of(
    adapter: StudentAdapter, sb: StudentBatch, domain_index: int
) -> torch.Tensor:
    """The adapter's current output on a batch, without a graph."""
    with torch.no_grad():
        domain = torch.full((sb.batch.size,), domain_index, dtype=torch.long)
        return adapter(sb.teacher_logits, domain, sb.staleness_hours)


class DayCalibration:
    """Per UTC day and objective: sums of predictions and labels, progressively."""

    def __init__(self) -> None:
        self.sums: dict[int, np.ndarray] = defaultdict(
            lambda: np.zeros((len(TRAINING_OBJECTIVES), 6))
        )

    def add(
        self,
        sb: StudentBatch,
        student_p: torch.Tensor,
        adapter_p: torch.Tensor | None,
    ) -> None:
        day = (sb.event_time_ms // _MS_PER_DAY).numpy()
        y = sb.batch.labels.numpy().astype(np.float64)
        mask = sb.teacher_mask.numpy()[:, 0] > 0
        p_s = student_p.numpy().astype(np.float64)
        p_t = torch.sigmoid(sb.teacher_logits).numpy().astype(np.float64)
        p_a = adapter_p.numpy().astype(np.float64) if adapter_p is not None else p_t
        for d in np.unique(day):
            rows = day == d
            taught = rows & mask
            self.sums[int(d)] += np.stack(
                [
                    np.full(y.shape[1], rows.sum()),
                    y[rows].sum(0),
                    p_s[rows].sum(0),
                    y[taught].sum(0),
                    p_t[taught].sum(0),
                    p_a[taught].sum(0),
                ],
                axis=1,
            )

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Day (as a string) → sums tensor, for a checkpoint."""
        return {str(day): torch.from_numpy(s.copy()) for day, s in self.sums.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.sums.clear()
        for day, sums in state.items():
            self.sums[int(day)] = sums.numpy().astype(np.float64)

    def report(self, with_adapter: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for day in sorted(self.sums):
            date = str(np.datetime64(day, "D"))
            s = self.sums[day]
            out[date] = {}
            for i, o in enumerate(TRAINING_OBJECTIVES):
                n, y, ps, yt, pt, pa = s[i]
                row = {
                    "count": int(n),
                    "positives": int(y),
                    # Raw sums too: a benchmark may divide by other references
                    # (the generator's true probabilities).
                    "student_sum": ps,
                    "teacher_sum": pt,
                    "positives_with_teacher": int(yt),
                    "student_calibration": ps / y if y else math.nan,
                    "teacher_calibration": pt / yt if yt else math.nan,
                }
                if with_adapter:
                    row["adapter_calibration"] = pa / yt if yt else math.nan
                    row["adapter_sum"] = pa
                out[date][o] = row
        return out


def build_student(
    cfg: DistillConfig,
    *,
    dim: int,
    cap: int | None,
    teacher_embedding_dim: int,
    base_logits: torch.Tensor,
) -> VerticalStudent:
    """The student for ``cfg`` (sizes from the preset, width/cap = teacher's)."""
    sizes = STUDENT_PRESETS[cfg.student]
    config = StudentConfig(
        dim=dim,
        max_num_embeddings=cap,
        teacher_embedding_dim=teacher_embedding_dim if "repr" in cfg.methods else 0,
        grad_scale=cfg.grad_scale,
        **sizes,
    )
    return VerticalStudent(config, base_logits)


def _check_teacher(cfg: DistillConfig, data: StudentData) -> None:
    needs = set(cfg.methods) - {"share"}
    if needs and data.teacher is None:
        raise ValueError(f"methods {sorted(needs)} need teacher outputs")


class StudentTrainer:
    """A student, its optimizer and (with ``adapter``) the Student Adapter and
    its own optimizer: one :meth:`step` per batch, for the batch form and the
    daemon alike.

    Args:
        cfg: the run.
        student: the model (shared tables already copied / frozen).
        domain_index: the student's domain.
    """

    def __init__(
        self, cfg: DistillConfig, student: VerticalStudent, domain_index: int
    ) -> None:
        self.cfg = cfg
        self.student = student
        self.domain_index = domain_index
        self.trainable = [p for p in student.parameters() if p.requires_grad]
        self.optimizer = adam(self.trainable, lr=cfg.lr)
        self.adapter = (
            StudentAdapter(tracker=make_tracker(cfg))
            if "adapter" in cfg.methods
            else None
        )
        self.adapter_optimizer = (
            adam(self.adapter.parameters(), lr=cfg.adapter_lr)
            if self.adapter is not None
            else None
        )
        self.use_repr = "repr" in cfg.methods

    def step(
        self, sb: StudentBatch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Train on one batch; returns the loss and the probabilities the
        student (serving head) and the adapter gave it *before* training."""
        adapter, optimizer = self.adapter, self.adapter_optimizer
        target = (
            adapter_logits_of(adapter, sb, self.domain_index)
            if adapter is not None
            else None
        )
        self.student.train()
        self.optimizer.zero_grad(set_to_none=True)
        out = self.student(sb.batch, sb.teacher_embedding if self.use_repr else None)
        loss = student_loss(out, sb, self.cfg, target)
        loss.backward()
        nn.utils.clip_grad_norm_(self.trainable, self.cfg.max_grad_norm)
        self.optimizer.step()
        if adapter is not None and optimizer is not None:
            adapter_step(adapter, optimizer, sb, self.domain_index)
        return (
            loss.detach(),
            torch.sigmoid(out.serving.detach()),
            torch.sigmoid(target) if target is not None else None,
        )

    def state_dict(self) -> dict[str, Any]:
        """Everything a restart needs (tensors and plain containers only)."""
        state: dict[str, Any] = {
            "student": self.student.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }
        if self.adapter is not None and self.adapter_optimizer is not None:
            state["adapter"] = self.adapter.state_dict()
            state["adapter_optimizer"] = self.adapter_optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.student.load_state_dict(state["student"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.adapter is not None and self.adapter_optimizer is not None:
            self.adapter.load_state_dict(state["adapter"])
            self.adapter_optimizer.load_state_dict(state["adapter_optimizer"])


def train_student(
    cfg: DistillConfig,
    train: StudentData,
    *,
    dim: int,
    cap: int | None,
    teacher_tables: dict[str, torch.Tensor] | None = None,
    on_epoch_end: Callable[[int, VerticalStudent, StudentAdapter | None], None]
    | None = None,
) -> tuple[VerticalStudent, StudentAdapter | None, dict[str, Any]]:
    """Train one student on ``train``; returns it, its adapter and a report.

    ``on_epoch_end(epoch, student, adapter)`` runs after every epoch (the
    benchmark scores a validation day there to pick the epoch count).
    """
    _check_teacher(cfg, train)
    torch.manual_seed(cfg.seed)
    student = build_student(
        cfg,
        dim=dim,
        cap=cap,
        teacher_embedding_dim=train.teacher_embedding_dim,
        base_logits=train.base_logits(),
    )
    shared = apply_sharing(cfg, student, teacher_tables)
    trainer = StudentTrainer(cfg, student, train.domain_index)
    progressive = DayCalibration()
    seen = TeacherSeen()
    epoch_loss: list[float] = []
    started = time.perf_counter()
    steps = 0
    for epoch in range(cfg.epochs):
        total = torch.zeros(())
        batches = 0
        for sb in train.batches(
            cfg.batch_size, shuffle=cfg.shuffle, seed=cfg.seed, epoch=epoch
        ):
            loss, student_p, adapter_p = trainer.step(sb)
            if epoch == 0:  # scored before trained on: progressive validation
                progressive.add(sb, student_p, adapter_p)
                seen.add(sb)
            total += loss
            batches += 1
            steps += 1
        epoch_loss.append(float(total) / max(batches, 1))
        if on_epoch_end is not None:
            on_epoch_end(epoch, student, trainer.adapter)
    seconds = time.perf_counter() - started
    report = {
        "domain": train.domain,
        "methods": list(cfg.methods),
        "config": dataclasses.asdict(cfg),
        "student": dataclasses.asdict(student.config),
        "parameters": sum(p.numel() for p in student.parameters()),
        "trainable_parameters": sum(p.numel() for p in trainer.trainable),
        "shared_tables": shared,
        "train": {
            "examples": len(train),
            "steps": steps,
            "seconds": seconds,
            "epoch_loss": epoch_loss,
        },
        "teacher_seen": seen.report(),
        "progressive": progressive.report(trainer.adapter is not None),
    }
    return student, trainer.adapter, report


def apply_sharing(
    cfg: DistillConfig,
    student: VerticalStudent,
    teacher_tables: dict[str, torch.Tensor] | None,
) -> list[str]:
    """Copy (and with ``share_frozen`` freeze) the teacher's tables if ``share``."""
    if "share" not in cfg.methods:
        return []
    if teacher_tables is None:
        raise ValueError("method 'share' needs the teacher checkpoint's tables")
    return share_tables(
        student.ebc.embedding_bags, teacher_tables, frozen=cfg.share_frozen
    )


class TeacherSeen:
    """Which teacher checkpoints and what staleness the student trained with."""

    def __init__(self) -> None:
        self.steps: set[int] = set()
        self.missing = 0
        self.count = 0
        self.stale_sum = 0.0
        self.stale_min = math.inf
        self.stale_max = -math.inf

    def add(self, sb: StudentBatch) -> None:
        mask = sb.teacher_mask[:, 0] > 0
        self.missing += int((~mask).sum())
        if not bool(mask.any()):
            return
        stale = sb.staleness_hours[mask]
        self.steps.update(int(s) for s in torch.unique(sb.teacher_step[mask]))
        self.count += int(mask.sum())
        self.stale_sum += float(stale.sum())
        self.stale_min = min(self.stale_min, float(stale.min()))
        self.stale_max = max(self.stale_max, float(stale.max()))

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": sorted(self.steps),
            "counts": [self.missing, self.count],
            "staleness": [self.stale_sum, self.stale_min, self.stale_max],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = set(state["steps"])
        self.missing, self.count = state["counts"]
        self.stale_sum, self.stale_min, self.stale_max = state["staleness"]

    def report(self) -> dict[str, Any]:
        return {
            "teacher_steps": sorted(self.steps),
            "examples_with_teacher": self.count,
            "examples_without_teacher": self.missing,
            "staleness_hours": {
                "min": self.stale_min if self.count else None,
                "mean": self.stale_sum / self.count if self.count else None,
                "max": self.stale_max if self.count else None,
            },
        }


@torch.no_grad()
def predict_student(
    student: VerticalStudent,
    adapter: StudentAdapter | None,
    data: StudentData,
    batch_size: int = 4096,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Serving-head probabilities (N, O), and the adapter's (or None)."""
    student.eval()
    use_repr = student.teacher_norm is not None
    probs, adapted = [], []
    for sb in data.batches(batch_size):
        out = student(sb.batch, sb.teacher_embedding if use_repr else None)
        probs.append(torch.sigmoid(out.serving).numpy())
        if adapter is not None:
            adapter.eval()
            adapted.append(
                torch.sigmoid(adapter_logits_of(adapter, sb, data.domain_index)).numpy()
            )
    o = len(TRAINING_OBJECTIVES)
    p = np.concatenate(probs) if probs else np.zeros((0, o), np.float32)
    if adapter is None:
        return p, None
    return p, np.concatenate(adapted) if adapted else np.zeros((0, o), np.float32)


def evaluate_student(
    student: VerticalStudent,
    adapter: StudentAdapter | None,
    data: StudentData,
    batch_size: int = 4096,
) -> dict[str, Any]:
    """NE / AUC / calibration per objective: student serving head, raw teacher
    and (with an adapter) the adapted teacher, on the same examples."""
    p, a = predict_student(student, adapter, data, batch_size)
    y = data.labels()
    result: dict[str, Any] = {"examples": len(data), "student": {}}
    for i, o in enumerate(TRAINING_OBJECTIVES):
        result["student"][o] = dataclasses.asdict(binary_metrics(y[:, i], p[:, i]))
    if data.teacher is not None:
        has = data.teacher.present
        teacher_p = 1 / (1 + np.exp(-data.teacher_own_logits().astype(np.float64)))
        result["teacher"] = {
            o: dataclasses.asdict(binary_metrics(y[has, i], teacher_p[has, i]))
            for i, o in enumerate(TRAINING_OBJECTIVES)
        }
        result["examples_with_teacher"] = int(has.sum())
        if a is not None:
            result["adapter"] = {
                o: dataclasses.asdict(binary_metrics(y[has, i], a[has, i]))
                for i, o in enumerate(TRAINING_OBJECTIVES)
            }
    return result
