"""The student daemon's trainer: one vertical student trained from example
messages joined, by example id, with the teacher's rows.

:class:`StreamingStudent` holds the :class:`StudentTrainer` (student,
adapter, optimizers), the teacher rows waiting for their examples
(:class:`~trainer.distill.teacher_cache.TeacherCache`), the progressive
calibration per day and the teacher staleness seen, and the run-wide
counters: everything a checkpoint holds besides the two topics' offsets, and the
student's record (:func:`~trainer.distill.student.student_record`), so
``python -m trainer.export`` exports a checkpoint as a serving artifact.

The teacher's model code is never imported: dims and shared tables come from
its checkpoint's tensors (:mod:`trainer.distill.sharing`) and the model
configuration its checkpoint carries
(:func:`trainer.training.checkpoint.model_record`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from features.vocab import DOMAINS
from trainer.data.kafka_source import Item
from trainer.distill.run import teacher_embedding_settings
from trainer.distill.run_config import StudentDaemonConfig
from trainer.distill.sharing import summary_embedding_dim, teacher_tables
from trainer.distill.student import student_record
from trainer.distill.student_data import domain_rows, student_batch
from trainer.distill.student_trainer import (
    DayCalibration,
    StudentTrainer,
    TeacherSeen,
    apply_sharing,
    build_student,
)
from trainer.distill.teacher_cache import TeacherCache
from trainer.models.base_rate import prior_logits


class StreamingStudent:
    """One student daemon's model and progress (see the module docstring).

    Args:
        config: the daemon's run (its domain, methods and cache bound).
        teacher_state: the teacher checkpoint's state.
        teacher_path: where it was read (named in its errors).

    The counters count the whole run across restarts: ``steps``,
    ``examples`` (this domain's rows trained on), ``messages`` (example
    messages applied, poison included) and ``dead_letters`` (both topics').
    """

    def __init__(
        self,
        config: StudentDaemonConfig,
        teacher_state: dict[str, Any],
        teacher_path: Path,
    ) -> None:
        cfg = config.distill
        self.config = config
        self.domain_index = DOMAINS.index(config.domain)
        dim, cap = teacher_embedding_settings(teacher_state, teacher_path)
        embedding_dim = summary_embedding_dim(teacher_state)
        torch.manual_seed(cfg.seed)
        student = build_student(
            cfg,
            dim=dim,
            cap=cap,
            teacher_embedding_dim=embedding_dim,
            base_logits=prior_logits()[self.domain_index],
        )
        tables = teacher_tables(teacher_state) if "share" in cfg.methods else None
        self.shared = apply_sharing(cfg, student, tables)
        # What python -m trainer.export needs to rebuild the student.
        self.record = student_record(student.config, config.domain, teacher_path)
        self.trainer = StudentTrainer(cfg, student, self.domain_index)
        self.cache = TeacherCache(embedding_dim, config.max_cached_rows)
        self.calibration, self.seen = DayCalibration(), TeacherSeen()
        self.steps = self.examples = self.messages = self.dead_letters = 0

    def add_teacher(self, item: Item) -> None:
        """Keep one teacher-output message's rows (poison: a dead letter)."""
        if item.payload is not None:
            self.cache.add(item.payload)
        else:
            self.dead_letters += 1

    def step(self, item: Item, *, wait: bool) -> bool:
        """Apply one example message: train on its rows of this domain, each
        batch scored before it is trained on (poison: a dead letter).

        With ``wait``, a message some of whose rows have no teacher row yet
        is left alone (False); without, the missing rows train on labels
        only (their teacher targets masked).
        """
        if item.batch is None:
            self.dead_letters += 1
            self.messages += 1
            return True
        rows = domain_rows(item.decoded.examples, self.config.domain)
        ids = rows.column("example_id").to_pylist()
        if wait and self.cache.missing(ids):
            return False
        if ids:
            sb = student_batch(
                rows, item.decoded.segments, self.domain_index, self.cache.aligned(ids)
            )
            _, student_p, adapter_p = self.trainer.step(sb)
            self.calibration.add(sb, student_p, adapter_p)
            self.seen.add(sb)
            self.examples += len(ids)
            self.steps += 1
        # Every example id occurs once: its teacher row is never needed again.
        self.cache.drop(item.decoded.examples.column("example_id").to_pylist())
        self.messages += 1
        return True

    def state_dict(self) -> dict[str, Any]:
        """Everything a restart needs but the offsets."""
        return {
            "model": self.trainer.state_dict(),
            "optimizer": {},  # inside "model": student's and adapter's
            "step": self.steps,
            "examples": self.examples,
            "messages": self.messages,
            "dead_letters": self.dead_letters,
            "teacher_cache": self.cache.state_dict(),
            "calibration": self.calibration.state_dict(),
            "teacher_seen": self.seen.state_dict(),
            "domain": self.config.domain,
            "methods": list(self.config.distill.methods),
            **self.record,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a checkpoint's state."""
        self.trainer.load_state_dict(state["model"])
        self.cache.load_state_dict(state["teacher_cache"])
        self.calibration.load_state_dict(state["calibration"])
        self.seen.load_state_dict(state["teacher_seen"])
        self.steps, self.examples, self.messages = (
            int(state[k]) for k in ("step", "examples", "messages")
        )
        self.dead_letters = int(state.get("dead_letters", 0))

    def report(self) -> dict[str, Any]:
        """The run's counts, the teacher seen and the progressive calibration."""
        return {
            "domain": self.config.domain,
            "methods": list(self.config.distill.methods),
            "step": self.steps,
            "examples": self.examples,
            "messages": self.messages,
            "dead_letters": self.dead_letters,
            "shared_tables": self.shared,
            "cached_teacher_rows": len(self.cache.rows),
            "evicted_teacher_rows": self.cache.evicted,
            "teacher_seen": self.seen.report(),
            "progressive": self.calibration.report(self.trainer.adapter is not None),
        }
