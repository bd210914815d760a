"""One domain's examples joined with their teacher outputs, as student batches.

Students read examples + timelines like every model (:mod:`trainer.data.feature_output`)
plus the teacher-output rows of the same example ids
(:class:`~trainer.distill.records.AlignedTeacher`); an example without a
teacher output still trains on its labels, its distillation terms masked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from features.vocab import DOMAINS, TRAINING_OBJECTIVES
from trainer.data.batch import Batch
from trainer.data.feature_output import event_time_ms
from trainer.data.inputs import make_batch
from trainer.distill.records import AlignedTeacher

_MS_PER_HOUR = 3_600_000.0


class StudentBatch(NamedTuple):
    """A :class:`Batch` plus its teacher outputs (own domain only).

    teacher_logits (B, O), teacher_embedding (B, E), teacher_mask (B, 1)
    (1 = has a teacher output), staleness_hours (B,) (example time minus
    teacher time; 0 where absent), teacher_step (B,) (-1 where absent),
    event_time_ms (B,).
    """

    batch: Batch
    teacher_logits: torch.Tensor
    teacher_embedding: torch.Tensor
    teacher_mask: torch.Tensor
    staleness_hours: torch.Tensor
    teacher_step: torch.Tensor
    event_time_ms: torch.Tensor


def domain_rows(examples: pa.Table, domain: str) -> pa.Table:
    """The examples of one domain (``domain`` column holds 1-based ids)."""
    index = DOMAINS.index(domain) + 1
    return examples.filter(pc.equal(examples.column("domain"), index))


class StudentData:
    """One domain's examples with their aligned teacher outputs, in memory.

    Args:
        examples: the examples (any domains; only ``domain``'s are kept).
        timelines: their timelines (the input path needs them even though
            students read no sequences: the batch contract is shared).
        domain: the vertical.
        teacher_outputs: teacher-output rows (any superset), or None.
    """

    def __init__(
        self,
        examples: pa.Table,
        timelines: pa.Table,
        domain: str,
        teacher_outputs: pa.Table | None,
    ) -> None:
        self.domain = domain
        self.domain_index = DOMAINS.index(domain)
        self.examples = domain_rows(examples, domain)
        self.timelines = timelines
        self.times = event_time_ms(self.examples)
        self.teacher = (
            AlignedTeacher(self.examples.column("example_id"), teacher_outputs)
            if teacher_outputs is not None
            else None
        )

    def __len__(self) -> int:
        return self.examples.num_rows

    @property
    def teacher_embedding_dim(self) -> int:
        return 0 if self.teacher is None else self.teacher.embedding.shape[1]

    def labels(self) -> np.ndarray:
        """(N, O) labels in row order."""
        return np.stack(
            [
                self.examples.column(f"label_{o}").to_numpy().astype(np.float32)
                for o in TRAINING_OBJECTIVES
            ],
            axis=1,
        )

    def teacher_own_logits(self) -> np.ndarray:
        """(N, O) the teacher's logits for this domain (0 where absent)."""
        if self.teacher is None:
            raise ValueError("no teacher outputs")
        o = len(TRAINING_OBJECTIVES)
        start = self.domain_index * o
        return self.teacher.logits[:, start : start + o]

    def base_logits(self, smoothing: float = 1.0) -> torch.Tensor:
        """(O,) logit of each objective's smoothed base rate in these examples."""
        y = self.labels().astype(np.float64)
        rate = (y.sum(0) + smoothing) / (len(self) + 2 * smoothing)
        return torch.logit(torch.from_numpy(rate)).float()

    def batch(self, rows: np.ndarray) -> StudentBatch:
        """The student batch of the given rows."""
        examples = self.examples.take(pa.array(rows, pa.int64()))
        return student_batch(
            examples,
            self.timelines,
            self.domain_index,
            self.teacher,
            rows=rows,
            times=self.times[rows],
        )

    def batches(
        self, batch_size: int, *, shuffle: bool = False, seed: int = 0, epoch: int = 0
    ) -> Iterator[StudentBatch]:
        """One epoch; shuffled with a ``(seed, epoch)`` generator, or in time order."""
        n = len(self)
        order = (
            np.random.default_rng([seed, epoch]).permutation(n)
            if shuffle
            else np.arange(n, dtype=np.int64)
        )
        for start in range(0, n, batch_size):
            yield self.batch(order[start : start + batch_size])


def student_batch(
    examples: pa.Table,
    timelines: pa.Table,
    domain_index: int,
    teacher: AlignedTeacher | None,
    *,
    rows: np.ndarray | None = None,
    times: np.ndarray | None = None,
) -> StudentBatch:
    """A student batch of ``examples`` (one domain's).

    Args:
        examples: the batch's example rows.
        timelines: their timelines or segments.
        domain_index: the student's domain.
        teacher: teacher outputs aligned with a superset of rows, or None.
        rows: which rows of ``teacher`` these examples are (default: all).
        times: their event times in ms (default: read from ``examples``).
    """
    # Students read no sequences: one-event windows keep the shared batch
    # contract at almost no cost.
    batch = make_batch(examples, timelines, max_seq_len=1)
    times = event_time_ms(examples) if times is None else times
    n, o = examples.num_rows, len(TRAINING_OBJECTIVES)
    if rows is None:
        rows = np.arange(n, dtype=np.int64)
    if teacher is None:
        logits = np.zeros((n, o), np.float32)
        emb = np.zeros((n, 0), np.float32)
        present = np.zeros(n, bool)
        stale = np.zeros(n, np.float32)
        step = np.full(n, -1, np.int64)
    else:
        start = domain_index * o
        logits = teacher.logits[rows, start : start + o]
        emb = teacher.embedding[rows]
        present = teacher.present[rows]
        stale = np.where(present, (times - teacher.time_ms[rows]) / _MS_PER_HOUR, 0.0)
        step = teacher.step[rows]
    return StudentBatch(
        batch=batch,
        teacher_logits=torch.from_numpy(np.ascontiguousarray(logits)),
        teacher_embedding=torch.from_numpy(np.ascontiguousarray(emb)),
        teacher_mask=torch.from_numpy(present.astype(np.float32)).view(-1, 1),
        staleness_hours=torch.from_numpy(stale.astype(np.float32)),
        teacher_step=torch.from_numpy(step),
        event_time_ms=torch.from_numpy(np.array(times, dtype=np.int64)),
    )
