"""The batch form: teacher outputs (once) → one student per domain → metrics.

Used by ``python -m trainer.distill`` (:mod:`trainer.distill.__main__`), the
benchmark and the demo. The teacher-output job runs in a *subprocess* when
its Parquet is missing, so a student process never imports the teacher's
model code (a test checks ``sys.modules``).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.cli import progress
from features.vocab import DOMAINS
from trainer.data.feature_output import event_time_ms, read_examples, read_timelines
from trainer.distill.artifacts import StudentExporter
from trainer.distill.records import read_teacher_outputs
from trainer.distill.run_config import DistillConfig
from trainer.distill.sharing import embedding_settings, teacher_tables
from trainer.distill.student_data import StudentData
from trainer.distill.student_trainer import evaluate_student, train_student
from trainer.training.checkpoint import missing_model_config

_MS_PER_DAY = 86_400_000


def ensure_teacher_outputs(
    examples_dir: Path,
    teacher: Path,
    output: Path,
    *,
    max_seq_len: int | None = None,
    extra_args: tuple[str, ...] = (),
) -> Path:
    """``output`` if it holds teacher outputs, else compute them in a subprocess.

    Raises:
        subprocess.CalledProcessError: the job failed; its one-line error is
            on stderr already (the child shares it).
    """
    if any(output.glob("*.parquet")):
        return output
    command = [
        sys.executable,
        "-m",
        "trainer.distill.teacher_outputs",
        "--examples",
        str(examples_dir),
        "--teacher",
        str(teacher),
        "--output",
        str(output),
        *extra_args,
    ]
    if max_seq_len is not None:
        command += ["--max-seq-len", str(max_seq_len)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return output


@dataclasses.dataclass
class Split:
    """Train and eval examples (Arrow) sharing one timelines table."""

    train: pa.Table
    eval: pa.Table
    timelines: pa.Table


def last_day_split(examples: pa.Table, timelines: pa.Table) -> Split:
    """Time-forward: the last UTC day is eval, everything before trains.

    Data of a single day is cut at the time before which 80 % of it lies.
    """
    times = event_time_ms(examples)
    if times.size == 0:
        raise ValueError("no examples")
    cut = int(times.max()) // _MS_PER_DAY * _MS_PER_DAY
    if not (times < cut).any():
        cut = int(np.sort(times)[int(0.8 * (times.size - 1))])
    before = pa.array(times < cut)
    return Split(examples.filter(before), examples.filter(pc.invert(before)), timelines)


def teacher_embedding_settings(
    state: dict[str, Any], path: Path
) -> tuple[int, int | None]:
    """(dim, cap) of the teacher's embeddings, from the config its checkpoint
    (loaded from ``path``) carries.

    Raises:
        trainer.training.checkpoint.MissingModelConfigError: it carries none.
    """
    found = embedding_settings(state)
    if found is None:
        raise missing_model_config(path)
    return found


def distill_domains(
    cfg: DistillConfig,
    split: Split,
    outputs: pa.Table | None,
    checkpoint_state: dict[str, Any],
    *,
    domains: tuple[str, ...] = DOMAINS,
    checkpoint_path: Path = Path("teacher checkpoint"),
    exporter: StudentExporter | None = None,
) -> dict[str, Any]:
    """Train and evaluate one student per domain; the report by domain.

    ``checkpoint_path`` names the teacher's checkpoint in the error of one
    that carries no model configuration; ``exporter`` writes each trained
    student's serving artifact (its folder is the report's ``artifact``).
    """
    dim, cap = teacher_embedding_settings(checkpoint_state, checkpoint_path)
    tables = teacher_tables(checkpoint_state) if "share" in cfg.methods else None
    report: dict[str, Any] = {}
    with progress("students (domains)", total=len(domains)) as bar:
        for domain in domains:
            train = StudentData(split.train, split.timelines, domain, outputs)
            evals = StudentData(split.eval, split.timelines, domain, outputs)
            if len(train) == 0:
                report[domain] = {"skipped": "no training examples in this domain"}
                bar.advance()
                continue
            student, adapter, r = train_student(
                cfg, train, dim=dim, cap=cap, teacher_tables=tables
            )
            r["eval"] = evaluate_student(student, adapter, evals)
            if exporter is not None:
                newest = int(train.times.max())
                steps = int(r["train"]["steps"])
                r["artifact"] = str(exporter.write(domain, student, steps, newest))
            report[domain] = r
            bar.advance()
    return report


def load_split(examples_dir: Path, eval_dir: Path | None) -> Split:
    """The train / eval examples: two feature-job dirs, or one split by day."""
    examples = read_examples(examples_dir)
    timelines = read_timelines(examples_dir)
    if eval_dir is None:
        return last_day_split(examples, timelines)
    eval_examples = read_examples(eval_dir)
    eval_timelines = read_timelines(eval_dir)
    if eval_timelines.num_rows != timelines.num_rows or not eval_timelines.equals(
        timelines
    ):
        # Different timelines: index into one table that holds both sets.
        raise ValueError(
            "--eval must share --examples' timelines "
            "(trainer.data.feature_output.time_forward_split)"
        )
    return Split(examples, eval_examples, timelines)


def combined_outputs(*dirs: Path) -> pa.Table:
    """Teacher outputs of several dirs as one table."""
    tables = [read_teacher_outputs(d) for d in dirs]
    return pa.concat_tables(tables).combine_chunks() if len(tables) > 1 else tables[0]


def staleness_summary(report: dict[str, Any]) -> dict[str, Any]:
    """The teacher steps and staleness every domain's student saw, merged."""
    steps: set[int] = set()
    highs = [
        r["teacher_seen"]["staleness_hours"]["max"]
        for r in report.values()
        if "teacher_seen" in r
        and r["teacher_seen"]["staleness_hours"]["max"] is not None
    ]
    for r in report.values():
        if "teacher_seen" in r:
            steps.update(r["teacher_seen"]["teacher_steps"])
    return {
        "teacher_steps": sorted(steps),
        "max_staleness_hours": float(np.max(highs)) if highs else None,
    }
