"""``python -m trainer.distill``: train one vertical student per domain.

Usage::

    python -m trainer.distill --examples DIR --teacher CKPT \\
        [--eval DIR] [--teacher-outputs DIR [--eval-teacher-outputs DIR]] \\
        [--student dlrm_small|dlrm_tiny] [--methods none|full|standard|aux,...] \\
        [--domains facebook,instagram,messaging] [--epochs N] [--batch-size B] \\
        [--lr LR] [--seed S] [knobs] --metrics-out FILE.json

``--examples`` (and ``--eval``) are feature-job outputs
(:mod:`trainer.data`); without ``--eval`` the last UTC day of
``--examples`` is the eval split. Teacher outputs default to
``DIR/teacher_outputs`` and are computed (once, in a subprocess) when absent.
Methods: see :mod:`trainer.distill.train`. The metrics file holds, per
domain, the student's NE / AUC / calibration per objective on the eval
split next to the raw teacher's (and the adapter's), what the student saw of
the teacher (checkpoint steps, staleness in hours) and per-day progressive
calibration.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from features.vocab import DOMAINS
from trainer.distill.run import (
    combined_outputs,
    distill_domains,
    ensure_teacher_outputs,
    load_split,
    staleness_summary,
)
from trainer.distill.sharing import read_checkpoint
from trainer.distill.student import STUDENT_PRESETS
from trainer.distill.train import DistillConfig, parse_methods


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


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
    """CLI entry point (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m trainer.distill", description=__doc__.splitlines()[0]
    )
    p.add_argument("--examples", type=Path, required=True)
    p.add_argument("--eval", type=Path, default=None)
    p.add_argument("--teacher", type=Path, required=True, help="checkpoint file/dir")
    p.add_argument("--teacher-outputs", type=Path, default=None)
    p.add_argument("--eval-teacher-outputs", type=Path, default=None)
    p.add_argument("--teacher-preset", default="tiny", help="config-less checkpoints")
    p.add_argument("--student", choices=sorted(STUDENT_PRESETS), default="dlrm_small")
    p.add_argument("--methods", default="full", help="none, full or a comma list")
    p.add_argument("--domains", default=",".join(DOMAINS))
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kd-weight", type=float, default=1.0)
    p.add_argument("--kd-temperature", type=float, default=1.0)
    p.add_argument("--aux-weight", type=float, default=1.0)
    p.add_argument("--label-scale", type=float, default=1.0)
    p.add_argument("--grad-scale", type=float, default=1.0)
    p.add_argument("--adapter-lr", type=float, default=1e-2)
    p.add_argument(
        "--no-adapter-tracker",
        action="store_true",
        help="the Student Adapter without its calibration filter (MLP only)",
    )
    p.add_argument("--share-frozen", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--metrics-out", type=Path, required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    domains = tuple(d.strip() for d in args.domains.split(",") if d.strip())
    unknown = sorted(set(domains) - set(DOMAINS))
    if unknown:
        p.error(f"unknown domains {unknown}; choose from {DOMAINS}")
    try:
        methods = parse_methods(args.methods)
    except ValueError as error:
        p.error(str(error))
    cfg = DistillConfig(
        methods=methods,
        student=args.student,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        kd_weight=args.kd_weight,
        kd_temperature=args.kd_temperature,
        aux_weight=args.aux_weight,
        label_scale=args.label_scale,
        grad_scale=args.grad_scale,
        adapter_lr=args.adapter_lr,
        adapter_tracker=not args.no_adapter_tracker,
        share_frozen=args.share_frozen,
    )
    output_dirs = [
        ensure_teacher_outputs(
            args.examples,
            args.teacher,
            args.teacher_outputs or args.examples / "teacher_outputs",
        )
    ]
    if args.eval is not None:
        output_dirs.append(
            ensure_teacher_outputs(
                args.eval,
                args.teacher,
                args.eval_teacher_outputs or args.eval / "teacher_outputs",
            )
        )
    split = load_split(args.examples, args.eval)
    state = read_checkpoint(args.teacher)
    domains_report = distill_domains(
        cfg,
        split,
        combined_outputs(*output_dirs),
        state,
        domains=domains,
        teacher_preset=args.teacher_preset,
    )
    report = {
        "teacher_checkpoint": str(args.teacher),
        "teacher_step": int(state["step"]),
        "teacher_time_ms": state.get("trained_until_ms"),
        "train_examples": split.train.num_rows,
        "eval_examples": split.eval.num_rows,
        "teacher_seen": staleness_summary(domains_report),
        "domains": domains_report,
    }
    args.metrics_out.parent.mkdir(parents=True, exist_ok=True)
    args.metrics_out.write_text(
        json.dumps(_clean(report), indent=1, sort_keys=True) + "\n"
    )
    print(format_table(report), file=sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
