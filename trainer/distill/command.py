"""``python -m trainer.distill``: the flags, then one student per domain
(:mod:`trainer.distill.run`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path
from typing import Any

from features.cli import CommandError, CommandParser, run_command
from features.config_flags import (
    add_config_flags,
    config_fields,
    flag,
    flag_field,
    positive_int,
)
from features.vocab import DOMAINS
from trainer.cli import (
    CHECKPOINT_HELP,
    REPORT_HELP,
    THREADS_HELP,
    feature_dir,
    start_torch,
)
from trainer.distill.run_config import DistillConfig

DESCRIPTION = """\
Train one vertical student per domain from the GEM teacher.

--examples (and --eval) are feature-job outputs; without --eval the last UTC
day of --examples is the eval split. Teacher outputs default to
DIR/teacher_outputs and are computed once (python -m
trainer.distill.teacher_outputs, in a subprocess) when absent. The teacher
model is the one its checkpoint describes. The metrics file holds, per
domain, the student's NE / AUC / calibration per objective next to the raw
teacher's (and the adapter's), the teacher steps and staleness the student
saw, and per-day progressive calibration. Each student is exported as a
serving artifact (--artifacts) for python -m serving."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistillJob:
    """What ``python -m trainer.distill`` is told beside the students'
    :class:`~trainer.distill.run_config.DistillConfig`: the data, the
    teacher, the domains, where the report goes."""

    examples: Path = field(metadata=flag("feature-job output the students train on"))
    eval: Path | None = flag_field(
        None,
        "feature-job output to evaluate on, sharing --examples' timelines "
        "(python -m trainer.data.split writes such folders; default: the "
        "last day of --examples)",
    )
    teacher: Path = field(metadata=flag(CHECKPOINT_HELP, metavar="PATH"))
    teacher_outputs: Path | None = flag_field(
        None, "teacher outputs of --examples (default: EXAMPLES/teacher_outputs)"
    )
    eval_teacher_outputs: Path | None = flag_field(
        None, "teacher outputs of --eval (default: EVAL/teacher_outputs)"
    )
    teacher_max_seq_len: int | None = flag_field(
        None,
        "most recent history events the teacher sees per example: the "
        "length it was trained on (default: its configuration's max_seq_len)",
        type=positive_int,
    )
    domains: str = flag_field(
        ",".join(DOMAINS), "comma list of the domains to train a student for"
    )
    threads: int = flag_field(
        1, f"{THREADS_HELP} (the teacher's pass and the students')", type=positive_int
    )
    metrics_out: Path = field(metadata=flag(REPORT_HELP, metavar="FILE"))
    artifacts: Path | None = flag_field(
        None,
        "serving artifacts root: each student as ARTIFACTS/student-<domain> "
        "(features.serving_artifacts), with the teacher as ARTIFACTS/gem when "
        "a student reads its embedding (default: METRICS_OUT's folder/serving)",
    )


def build_parser() -> CommandParser:
    """The flags of ``python -m trainer.distill``."""
    parser = CommandParser("trainer.distill", DESCRIPTION, configs=[DistillJob])
    add_config_flags(parser.add_argument_group("Student"), DistillConfig)
    return parser


def run(args: argparse.Namespace) -> int:
    """Check the input, train the students, write the report."""
    job = DistillJob(**config_fields(args, DistillJob))
    domains = tuple(d.strip() for d in job.domains.split(",") if d.strip())
    unknown = sorted(set(domains) - set(DOMAINS))
    if unknown or not domains:
        raise CommandError(
            f"--domains {job.domains}: unknown domains {unknown}",
            f"choose from {','.join(DOMAINS)}",
        )
    feature_dir("--examples", job.examples)
    if job.eval is not None:
        feature_dir("--eval", job.eval)
    cfg = DistillConfig(**config_fields(args, DistillConfig))
    start_torch(job.threads)
    from features.json_report import json_safe
    from trainer.distill.artifacts import StudentExporter
    from trainer.distill.run import (
        combined_outputs,
        distill_domains,
        ensure_teacher_outputs,
        load_split,
        staleness_summary,
    )
    from trainer.training.checkpoint import model_from_record, read_model_checkpoint

    # Checked here, before a subprocess would run the teacher over the data.
    state, teacher_path = read_model_checkpoint(job.teacher, "--teacher")
    sets = [(job.examples, job.teacher_outputs)]
    if job.eval is not None:
        sets.append((job.eval, job.eval_teacher_outputs))
    try:
        output_dirs = [
            ensure_teacher_outputs(
                folder,
                teacher_path,
                out or folder / "teacher_outputs",
                max_seq_len=job.teacher_max_seq_len,
                # The teacher's pass is most of the command's time.
                extra_args=("--threads", str(job.threads)),
            )
            for folder, out in sets
        ]
    except subprocess.CalledProcessError as error:
        # The job's own one-line error is on stderr above this one.
        raise CommandError(
            "python -m trainer.distill.teacher_outputs failed (its error is above)"
        ) from error
    try:
        split = load_split(job.examples, job.eval)
    except ValueError as error:
        raise CommandError(str(error)) from error
    exporter = StudentExporter(
        job.artifacts or job.metrics_out.parent / "serving",
        teacher_path,
        state,
        job.teacher_max_seq_len
        or model_from_record(state, teacher_path)[1].embedding.max_seq_len,
    )
    try:
        report_domains = distill_domains(
            cfg,
            split,
            combined_outputs(*output_dirs),
            state,
            domains=domains,
            checkpoint_path=teacher_path,
            exporter=exporter,
        )
    except subprocess.CalledProcessError as error:
        raise CommandError(
            "python -m trainer.export failed on the teacher (its error is above)"
        ) from error
    report = {
        "teacher_checkpoint": str(teacher_path),
        "teacher_step": int(state["step"]),
        "teacher_time_ms": state.get("trained_until_ms"),
        "train_examples": split.train.num_rows,
        "eval_examples": split.eval.num_rows,
        "teacher_seen": staleness_summary(report_domains),
        "domains": report_domains,
    }
    job.metrics_out.parent.mkdir(parents=True, exist_ok=True)
    job.metrics_out.write_text(
        json.dumps(json_safe(report), indent=1, sort_keys=True) + "\n"
    )
    print(format_table(report))
    return 0


def format_table(report: dict[str, Any]) -> str:
    """One line per (domain, objective): student vs teacher NE / AUC / calib."""
    head = (
        f"{'slice':<22}{'count':>7}{'pos':>6}  "
        f"{'student NE/AUC/cal':<26}{'teacher NE/AUC/cal':<26}"
    )
    rows = [head, "-" * len(head)]

    def cell(m: dict[str, Any] | None) -> str:
        if not m:
            return "n/a"
        vals = [m.get(k) for k in ("ne", "auc", "calibration")]
        return " / ".join(
            "n/a" if v is None or not math.isfinite(v) else f"{v:.4f}" for v in vals
        )

    for domain, r in report["domains"].items():
        if "eval" not in r:
            rows.append(f"{domain:<22}{r.get('skipped', '')}")
            continue
        for o, m in r["eval"]["student"].items():
            t = r["eval"].get("teacher", {}).get(o)
            rows.append(
                f"{domain + '/' + o:<22}{m['count']:>7}{m['positives']:>6}  "
                f"{cell(m):<26}{cell(t):<26}"
            )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.distill`` (see :data:`DESCRIPTION`)."""
    return run_command(build_parser(), run, argv)
