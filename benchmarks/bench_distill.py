"""Knowledge transfer: GEM teacher → per-domain students, the transfer ratio.

Usage::

    python -m benchmarks.bench_distill [--section all|generated|movielens|freshness]
        [--users 4000 --ads 400 --days 11 --warmup-days 3 --click-logit-shift 1]
        [--teacher-epochs 2] [--ml-steps 100] [--student-epochs 3]
        [--max-seq-len 64] [--variants alone,standard,full] [--work DIR] [--json FILE]

Per data set, one process, time forward in four parts:

1. **teacher period**: GEM (``bench_quality.bench_config``: the ``default``
   preset, tables capped, short windows; on MovieLens with TargetMatch's
   joint rows only, as ``bench_quality`` chose there) trained offline, then
   frozen;
2. **student period**: the teacher-output job runs the frozen teacher once
   per example of everything after (1); every student trains on the
   student days, with those outputs (the teacher is stale, as in ExFM, and
   its outputs are out-of-sample: it never trained on these examples);
3. **validation day**: picks each student's epoch count (1..N) and standard
   distillation's weight λ; nothing is chosen on (4);
4. **eval day**: NE / AUC / calibration per domain and objective for the
   teacher, the student alone, with standard distillation and with the full
   transfer (aux head + Student Adapter + representation + shared tables),
   each method alone, and parameter sharing with the teacher's tables frozen
   (``share_frozen``, ``full_frozen``).

Transfer ratio (LoopFM's reading of "2x the effectiveness", docs/model.md):
``(NE_alone - NE_method) / (NE_alone - NE_teacher)`` on the pooled eval
predictions of the three domain students (and per domain).

Generated: ``pipelines.sources.synthetic`` (``--days 11 --warmup-days 3``: days 1-3
only fill histories and counters, teacher days 4-7, students 8-9,
validation 10, eval 11; ``--teacher-period through-students`` trains the
teacher through day 9 and shows the in-sample leak, never a result).
MovieLens-1M-dev (the shared data folder next to the repository): impressions
split at the 80 / 88 / 90 % time quantiles (teacher: ``--ml-steps`` batches of
512 sampled from the first 80 %, as in ``bench_quality``; eval: the last 10 %,
the same examples as ``bench_quality``'s eval).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from benchmarks.bench_quality import (
    MOVIELENS_TARGET_MATCH_SHARED,
    SHARED,
    TABLE_CAP,
    bench_config,
    finish_run,
    save_result,
    table_head,
)
from benchmarks.generated import generated_features, reference_features, world_config
from benchmarks.machine import cpu_model
from features.metrics import binary_metrics
from features.vocab import DOMAINS, TRAINING_OBJECTIVES
from pipelines.sources import movielens
from pipelines.sources.synthetic import GeneratorConfig, ModelParams
from trainer.data.feature_output import (
    ExampleDataset,
    cut_at_fraction,
    event_time_ms,
    read_examples,
    read_timelines,
    time_forward_split,
)
from trainer.distill import teacher_pass as teacher_outputs
from trainer.distill.records import read_teacher_outputs
from trainer.distill.run_config import FULL, DistillConfig
from trainer.distill.sharing import read_checkpoint, teacher_tables
from trainer.distill.student_data import StudentData
from trainer.distill.student_trainer import predict_student, train_student
from trainer.distill.teacher import train_teacher
from trainer.metrics.reporting import save_png
from trainer.models.config import tiny
from trainer.training.checkpoint import list_checkpoints

VARIANTS: dict[str, tuple[str, ...]] = {
    "alone": (),
    "standard": ("standard",),
    "aux": ("aux",),
    "adapter": ("adapter",),
    "repr": ("repr",),
    "share": ("share",),
    "full": FULL,
    # Parameter sharing with the teacher's id tables *frozen* (reused as
    # they are, not fine-tuned): the student trains only its dense part.
    "share_frozen": ("share",),
    "full_frozen": FULL,
}
FROZEN_TABLES = ("share_frozen", "full_frozen")
KD_WEIGHTS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)  # λ for standard KD, chosen on val


def _ms(day: dt.date) -> int:
    return int(dt.datetime.combine(day, dt.time(), dt.UTC).timestamp() * 1000)


def _metrics(y: np.ndarray, p: np.ndarray) -> dict[str, Any]:
    return dataclasses.asdict(binary_metrics(y, p))


@dataclasses.dataclass
class Period:
    """The student-side examples split into train / val / eval, per domain."""

    train: dict[str, StudentData]
    val: dict[str, StudentData]
    eval: dict[str, StudentData]


def student_period(
    features: Path, outputs: pa.Table, val_cut: int, eval_cut: int
) -> Period:
    examples, timelines = read_examples(features), read_timelines(features)
    t = pa.array(event_time_ms(examples))
    parts = {
        "train": examples.filter(pc.less(t, val_cut)),
        "val": examples.filter(
            pc.and_(pc.greater_equal(t, val_cut), pc.less(t, eval_cut))
        ),
        "eval": examples.filter(pc.greater_equal(t, eval_cut)),
    }
    return Period(
        **{
            name: {d: StudentData(table, timelines, d, outputs) for d in DOMAINS}
            for name, table in parts.items()
        }
    )


def pooled(
    period: dict[str, StudentData], probs: dict[str, np.ndarray]
) -> dict[str, Any]:
    """Metrics per domain/objective and over all domains, from (N, O) probs."""
    out: dict[str, Any] = {}
    for i, o in enumerate(TRAINING_OBJECTIVES):
        ys, ps = [], []
        for d in DOMAINS:
            y = period[d].labels()[:, i]
            out[f"{d}/{o}"] = _metrics(y, probs[d][:, i])
            ys.append(y)
            ps.append(probs[d][:, i])
        out[f"all/{o}"] = _metrics(np.concatenate(ys), np.concatenate(ps))
    return out


def teacher_probs(period: dict[str, StudentData]) -> dict[str, np.ndarray]:
    out = {}
    for d, data in period.items():
        assert data.teacher is not None
        assert data.teacher.present.all()
        out[d] = 1 / (1 + np.exp(-data.teacher_own_logits().astype(np.float64)))
    return out


def run_variant(
    cfg: DistillConfig, p: Period, dim: int, cap: int | None, tables: Any
) -> dict[str, Any]:
    """Train one student per domain, pick the epoch on val, score eval."""
    val_probs, eval_probs, chosen, reports = {}, {}, {}, {}
    for d in DOMAINS:
        snapshots: list[tuple[float, np.ndarray, np.ndarray, np.ndarray | None]] = []

        def on_epoch(
            epoch: int,
            student: Any,
            adapter: Any,
            d: str = d,
            snapshots: list[Any] = snapshots,
        ) -> None:
            v, _ = predict_student(student, adapter, p.val[d])
            e, a = predict_student(student, adapter, p.eval[d])
            ne = binary_metrics(p.val[d].labels()[:, 0], v[:, 0]).ne
            snapshots.append((ne if math.isfinite(ne) else math.inf, v, e, a))

        _, _, report = train_student(
            cfg,
            p.train[d],
            dim=dim,
            cap=cap,
            teacher_tables=tables,
            on_epoch_end=on_epoch,
        )
        best = int(np.argmin([s[0] for s in snapshots]))
        chosen[d] = best + 1
        val_probs[d], eval_probs[d] = snapshots[best][1], snapshots[best][2]
        adapted = snapshots[best][3]
        reports[d] = {
            "epochs_chosen": best + 1,
            "train_seconds": report["train"]["seconds"],
            "parameters": report["parameters"],
            "trainable_parameters": report["trainable_parameters"],
            "shared_tables": len(report["shared_tables"]),
            "teacher_seen": report["teacher_seen"],
            "progressive": report["progressive"],
            "adapter_eval_calibration": (
                {
                    o: binary_metrics(
                        p.eval[d].labels()[:, i], adapted[:, i]
                    ).calibration
                    for i, o in enumerate(TRAINING_OBJECTIVES)
                }
                if adapted is not None
                else None
            ),
        }
    return {
        "val": pooled(p.val, val_probs),
        "eval": pooled(p.eval, eval_probs),
        # Pooled eval click probabilities in DOMAINS order (for the
        # bootstrap; popped before the JSON is written).
        "_eval_click": np.concatenate([eval_probs[d][:, 0] for d in DOMAINS]),
        "epochs_chosen": chosen,
        "domains": reports,
    }


def transfer_ratio(alone: float, method: float, teacher: float) -> float:
    """(NE_alone - NE_method) / (NE_alone - NE_teacher)."""
    return (alone - method) / (alone - teacher) if alone != teacher else math.nan


def run_section(
    name: str,
    teacher_features: Path,
    student_features: Path,
    val_cut: int,
    eval_cut: int,
    args: argparse.Namespace,
    work: Path,
    teacher_args: dict[str, Any],
    truth: Path | None = None,
    target_match_shared: bool = True,
) -> dict[str, Any]:
    # The teacher is the GEM bench_quality measures on the same data.
    config = bench_config(args.max_seq_len, target_match_shared)
    started = time.perf_counter()
    data = ExampleDataset(teacher_features, max_seq_len=args.max_seq_len)
    ckpt = train_teacher(data, config, work / "teacher", seed=args.seed, **teacher_args)
    teacher_s = time.perf_counter() - started
    teacher_examples = len(data)
    print(
        f"{name}: teacher on {teacher_examples} examples, {teacher_s:.0f} s", flush=True
    )
    del data
    summary = teacher_outputs.run(
        student_features, ckpt, work / "teacher_outputs", max_seq_len=args.max_seq_len
    )
    print(f"{name}: teacher outputs {summary}", flush=True)
    outputs = read_teacher_outputs(work / "teacher_outputs")
    period = student_period(student_features, outputs, val_cut, eval_cut)
    state = read_checkpoint(ckpt)
    tables = teacher_tables(state)
    dim, cap = config.embedding.dim, config.embedding.max_num_embeddings
    base = dataclasses.replace(
        adapter_config(args),
        epochs=args.student_epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
    )
    result: dict[str, Any] = {
        "teacher": {
            "train_examples": teacher_examples,
            "recipe": teacher_args,
            "seconds": teacher_s,
            "step": int(state["step"]),
            "trained_until_ms": int(state["trained_until_ms"]),
            "val": pooled(period.val, teacher_probs(period.val)),
            "eval": pooled(period.eval, teacher_probs(period.eval)),
        },
        "teacher_outputs": summary,
        "sizes": {
            part: {d: len(getattr(period, part)[d]) for d in DOMAINS}
            for part in ("train", "val", "eval")
        },
        "variants": {},
    }
    if truth is not None:
        result["bayes"] = {
            "val": bayes_eval(truth, period.val),
            "eval": bayes_eval(truth, period.eval),
        }
        print(
            f"{name}: teacher val all/click NE "
            f"{result['teacher']['val']['all/click']['ne']:.4f}, Bayes "
            f"{result['bayes']['val']['all/click']['ne']:.4f}",
            flush=True,
        )
    for variant, methods in VARIANTS.items():
        if args.variants and variant not in args.variants:
            continue
        weights = KD_WEIGHTS if variant == "standard" else (1.0,)
        candidates = {}
        for w in weights:
            t0 = time.perf_counter()
            cfg = dataclasses.replace(
                base,
                methods=methods,
                kd_weight=w,
                share_frozen=variant in FROZEN_TABLES,
            )
            candidates[w] = run_variant(cfg, period, dim, cap, tables)
            candidates[w]["kd_weight"] = w
            candidates[w]["seconds"] = time.perf_counter() - t0
        w_best = min(candidates, key=lambda w: candidates[w]["val"]["all/click"]["ne"])
        chosen = candidates[w_best]
        if variant == "standard":
            chosen["kd_weight_val_ne"] = {
                str(w): c["val"]["all/click"]["ne"] for w, c in candidates.items()
            }
        result["variants"][variant] = chosen
        print(
            f"{name}: {variant} eval all/click NE "
            f"{chosen['eval']['all/click']['ne']:.4f}"
            f" ({chosen['seconds']:.0f} s)",
            flush=True,
        )
    result["transfer_ratio"] = ratios(result)
    clicks = {v: r.pop("_eval_click") for v, r in result["variants"].items()}
    if {"alone", "standard", "full"} <= set(clicks):
        labels = np.concatenate([period.eval[d].labels()[:, 0] for d in DOMAINS])
        clicks["teacher"] = np.concatenate(
            [teacher_probs(period.eval)[d][:, 0] for d in DOMAINS]
        )
        np.savez_compressed(work / "eval_click_predictions.npz", y=labels, **clicks)
        result["bootstrap"] = bootstrap_ratios(labels, clicks, seed=args.seed)
        print(f"{name}: bootstrap {json.dumps(result['bootstrap'])}", flush=True)
    result["seconds"] = time.perf_counter() - started
    return result


def _ne_rows(y: np.ndarray, p: np.ndarray) -> np.ndarray:
    """NE of each row of (R, N) resampled labels / probabilities."""
    p = np.clip(p, 1e-7, 1 - 1e-7)
    loss = -(y * np.log(p) + (1 - y) * np.log(1 - p)).mean(1)
    rate = np.clip(y.mean(1), 1e-7, 1 - 1e-7)
    ne: np.ndarray = loss / -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
    return ne


def bootstrap_ratios(
    y: np.ndarray,
    probs: dict[str, np.ndarray],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Paired bootstrap over eval examples (all/click): the spread of the
    standard and full transfer ratios and of full / standard.

    One resample draws the eval examples with replacement and scores every
    model on the *same* draw, so the ratios keep their pairing.
    """
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"resamples": resamples}
    draws: dict[str, list[np.ndarray]] = {}
    for chunk in range(0, resamples, 100):  # bounded memory
        idx = rng.integers(0, len(y), size=(min(100, resamples - chunk), len(y)))
        yy = y[idx].astype(np.float64)
        ne = {k: _ne_rows(yy, p[idx].astype(np.float64)) for k, p in probs.items()}
        gap = ne["alone"] - ne["teacher"]
        for v in ("standard", "full"):
            draws.setdefault(v, []).append((ne["alone"] - ne[v]) / gap)
        draws.setdefault("teacher_gap", []).append(gap)
    std, full = np.concatenate(draws["standard"]), np.concatenate(draws["full"])
    gap = np.concatenate(draws["teacher_gap"])
    for key, values in (
        ("standard", std),
        ("full", full),
        ("full_minus_2x_standard", full - 2 * std),
        ("teacher_gap_ne", gap),
    ):
        lo, mid, hi = np.percentile(values, [5, 50, 95])
        out[key] = {"p5": float(lo), "median": float(mid), "p95": float(hi)}
    out["share_full_at_least_2x_standard"] = float(np.mean(full >= 2 * std))
    out["share_teacher_better_than_alone"] = float(np.mean(gap > 0))
    return out


def ratios(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Transfer ratio of every variant on every click / conversion slice."""
    if "alone" not in result["variants"]:
        return {}
    teacher = result["teacher"]["eval"]
    alone = result["variants"]["alone"]["eval"]
    out: dict[str, dict[str, float]] = {}
    for variant, r in result["variants"].items():
        if variant == "alone":
            continue
        out[variant] = {}
        for key in teacher:
            values = (alone[key]["ne"], r["eval"][key]["ne"], teacher[key]["ne"])
            if any(v is None or not math.isfinite(v) for v in values):
                continue
            out[variant][key] = transfer_ratio(*values)
    return out


def generated_world(args: argparse.Namespace) -> GeneratorConfig:
    """The generated world: ``--click-logit-shift`` raises every domain's click
    intercept (more positives per impression, so that an eval day has enough
    clicks to tell the students apart)."""
    params = ModelParams()
    params = dataclasses.replace(
        params,
        click_base_logit=tuple(
            x + args.click_logit_shift for x in params.click_base_logit
        ),
    )
    return world_config(args, params=params)


def bayes_eval(truth_path: Path, period: dict[str, StudentData]) -> dict[str, Any]:
    """Metrics of the generator's true probabilities on the eval examples: the
    floor no model can beat (pooled like the students' predictions)."""
    truth = pq.read_table(truth_path, columns=["impression_id", "p_click"])
    p_true = dict(
        zip(
            truth.column("impression_id").to_pylist(),
            truth.column("p_click").to_numpy().tolist(),
            strict=True,
        )
    )
    out: dict[str, Any] = {}
    ys, ps = [], []
    for d, data in period.items():
        ids = data.examples.column("example_id").to_pylist()
        p = np.array([p_true[i] for i in ids])
        y = data.labels()[:, 0]
        out[f"{d}/click"] = _metrics(y, p)
        ys.append(y)
        ps.append(p)
    out["all/click"] = _metrics(np.concatenate(ys), np.concatenate(ps))
    return out


def generated(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Days: ``--warmup-days`` of history only | teacher | 2 student days |
    validation | eval.

    The warm-up days are events nobody trains on: they fill the users'
    histories and the 1 d / 7 d counters, so the teacher's examples look like
    the later days' (in a world that starts empty, the counters of the first
    days are a fraction of the last days', and a teacher trained on them is
    out of distribution on the students' days for that reason alone).
    """
    gen = generated_world(args)
    teacher_days = args.days - args.warmup_days - 4
    if teacher_days < 1:
        raise SystemExit("--days must leave at least one teacher day after warm-up")
    generated_features(gen, work / "gen", work / "f", overwrite=True)
    warm_cut = _ms(gen.start + dt.timedelta(days=args.warmup_days))
    student_cut = _ms(gen.start + dt.timedelta(days=args.warmup_days + teacher_days))
    val_cut = _ms(gen.start + dt.timedelta(days=args.days - 2))
    eval_cut = _ms(gen.start + dt.timedelta(days=args.days - 1))
    teacher_end = val_cut if args.teacher_period == "through-students" else student_cut
    # through-students: the teacher also trains on the student days (fresher,
    # more data), so its outputs there are in-sample: kept only to show the
    # leak (README), never a result.
    time_forward_split(work / "f", teacher_end, work / "before_f", work / "unused_f")
    n_warm, n_teacher = time_forward_split(
        work / "before_f", warm_cut, work / "warmup_f", work / "teacher_f"
    )
    _, n_student = time_forward_split(
        work / "f", student_cut, work / "unused_f", work / "student_f"
    )
    print(
        f"generated: warm-up {n_warm}, teacher {n_teacher}, student period {n_student}",
        flush=True,
    )
    result = run_section(
        "generated",
        work / "teacher_f",
        work / "student_f",
        val_cut,
        eval_cut,
        args,
        work,
        {
            "epochs": args.teacher_epochs,
            "batch_size": args.batch_size,
            "lr": args.teacher_lr,
        },
        truth=work / "gen" / "truth.parquet",
    )
    return result | {
        "cuts_ms": [warm_cut, student_cut, val_cut, eval_cut],
        "warmup_examples": n_warm,
    }


def movielens_section(args: argparse.Namespace, work: Path) -> dict[str, Any] | None:
    source = SHARED / "movielens-1m-dev"
    if not (source / "ratings.dat").exists():
        print(f"movielens: {source} absent, section skipped", flush=True)
        return None
    movielens.run(source, work / "ml", overwrite=True)
    reference_features(work / "ml", work / "f", overwrite=True)
    cuts = [cut_at_fraction(work / "f", q) for q in (0.8, 0.88, 0.9)]
    n_teacher, n_student = time_forward_split(
        work / "f", cuts[0], work / "teacher_f", work / "student_f"
    )
    print(f"movielens: teacher {n_teacher}, student period {n_student}", flush=True)
    return run_section(
        "movielens",
        work / "teacher_f",
        work / "student_f",
        cuts[1],
        cuts[2],
        args,
        work,
        {
            "epochs": 1,
            "batch_size": 512,
            "lr": args.teacher_lr,
            "max_steps_per_epoch": args.ml_steps,
        },
        target_match_shared=MOVIELENS_TARGET_MATCH_SHARED,
    ) | {"cuts_ms": cuts}


FRESHNESS_VARIANTS: dict[str, tuple[str, ...]] = {
    "alone": (),
    "standard": ("standard",),
    "full": FULL,
}


def adapter_config(args: argparse.Namespace) -> DistillConfig:
    """The Student Adapter's knobs from the command line (defaults otherwise)."""
    return DistillConfig(
        adapter_lr=args.adapter_lr,
        adapter_tracker=not args.no_adapter_tracker,
        adapter_level_noise=args.adapter_level_noise,
        adapter_slope_noise=args.adapter_slope_noise,
    )


def freshness(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The drift scenario: base rates rise every day, the teacher is frozen at
    day ``--fresh-k``, students keep training (one pass, in time order).

    Calibration per day is progressive (each batch scored before it is
    trained on) and measured against the generator's *true* probabilities
    (sum of predictions / sum of true p): the label-based ratio has a
    sampling error of about 1/sqrt(positives), several % per day here.
    """
    drift = (args.fresh_drift,) * len(DOMAINS)
    params = ModelParams(base_logit_drift_per_day=drift)
    params = dataclasses.replace(
        params,
        click_base_logit=tuple(
            x + args.fresh_click_shift for x in params.click_base_logit
        ),
    )
    gen = GeneratorConfig(
        users=args.fresh_users,
        ads=args.fresh_users // 10,
        days=args.fresh_days,
        seed=args.seed,
        params=params,
    )
    frozen_at = _ms(gen.start + dt.timedelta(days=args.fresh_k))
    # --reuse: the same config's data, teacher and outputs from an earlier run.
    reuse = args.reuse and any((work / "teacher_outputs").glob("*.parquet"))
    if not reuse:
        generated_features(gen, work / "gen", work / "f", overwrite=True)
        time_forward_split(
            work / "f", frozen_at, work / "teacher_f", work / "student_f"
        )
    base = tiny()
    config = dataclasses.replace(
        base,
        embedding=dataclasses.replace(
            base.embedding, max_num_embeddings=TABLE_CAP, max_seq_len=16
        ),
    )
    if reuse:
        ckpt = list_checkpoints(work / "teacher")[-1]
    else:
        teacher_data = ExampleDataset(work / "teacher_f", max_seq_len=16)
        ckpt = train_teacher(
            teacher_data, config, work / "teacher", lr=args.teacher_lr, seed=args.seed
        )
        del teacher_data
        teacher_outputs.run(
            work / "student_f", ckpt, work / "teacher_outputs", max_seq_len=16
        )
    tables = teacher_tables(read_checkpoint(ckpt))
    outputs = read_teacher_outputs(work / "teacher_outputs")
    examples = read_examples(work / "student_f")
    timelines = read_timelines(work / "student_f")
    truth = pq.read_table(work / "gen" / "truth.parquet")
    truth_p = dict(
        zip(
            truth.column("impression_id").to_pylist(),
            truth.column("p_click").to_numpy().tolist(),
            strict=True,
        )
    )
    result: dict[str, Any] = {
        "drift_logit_per_day": args.fresh_drift,
        "teacher_frozen_at_ms": frozen_at,
        "domains": {},
    }
    for d in DOMAINS:
        data = StudentData(examples, timelines, d, outputs)
        days = data.times // 86_400_000
        p_true = np.array(
            [truth_p[i] for i in data.examples.column("example_id").to_pylist()]
        )
        true_sum = {
            str(np.datetime64(int(x), "D")): float(p_true[days == x].sum())
            for x in np.unique(days)
        }
        curves: dict[str, Any] = {"true_click_sum": true_sum}
        for variant, methods in FRESHNESS_VARIANTS.items():
            if args.variants and variant not in args.variants:
                continue
            cfg = dataclasses.replace(
                adapter_config(args),
                methods=methods,
                epochs=1,
                shuffle=False,
                batch_size=args.batch_size,
                lr=args.lr,
                seed=args.seed,
            )
            _, _, report = train_student(
                cfg,
                data,
                dim=config.embedding.dim,
                cap=TABLE_CAP,
                teacher_tables=tables,
            )
            prog = report["progressive"]
            curves[variant] = {
                day: prog[day]["click"]["student_sum"] / true_sum[day] for day in prog
            }
            if "teacher" not in curves:
                curves["teacher"] = {
                    day: prog[day]["click"]["teacher_sum"] / true_sum[day]
                    for day in prog
                }
            if variant == "full":
                curves["adapter"] = {
                    day: prog[day]["click"]["adapter_sum"] / true_sum[day]
                    for day in prog
                }
                curves["positives"] = {
                    day: prog[day]["click"]["positives"] for day in prog
                }
                # The usual (label-based) calibration, progressive: what the
                # adapter can be held to with a day of labels (the day's
                # clicks differ from Σ true p by ~1/sqrt(clicks) themselves).
                curves["adapter_vs_labels"] = {
                    day: prog[day]["click"]["adapter_sum"]
                    / prog[day]["click"]["positives"]
                    for day in prog
                }
                curves["label_calibration_full"] = {
                    day: prog[day]["click"]["student_calibration"] for day in prog
                }
        result["domains"][d] = curves
        print(
            f"freshness {d}: "
            + json.dumps(
                {
                    k: {day: round(v, 3) for day, v in c.items()}
                    for k, c in curves.items()
                    if k in ("teacher", "adapter", "standard", "full")
                }
            ),
            flush=True,
        )
    if args.png:
        plot_freshness(result, args.png)
    return result


def plot_freshness(result: dict[str, Any], path: Path) -> None:
    """Click calibration (vs true probabilities) per day, one panel per domain."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(DOMAINS), figsize=(5 * len(DOMAINS), 3.6))
    labels = {
        "teacher": "raw teacher (frozen)",
        "adapter": "Student Adapter",
        "standard": "student, standard KD",
        "full": "student, full transfer",
        "alone": "student alone",
        "adapter_vs_labels": "Student Adapter, Σ predicted / Σ clicks",
    }
    for ax, d in zip(axes, DOMAINS, strict=True):
        curves = result["domains"][d]
        for key, label in labels.items():
            if key not in curves:  # a variant not run (--variants)
                continue
            days = sorted(curves[key])
            ax.plot(
                range(len(days)),
                [curves[key][x] for x in days],
                marker="o",
                linestyle="--" if key == "adapter_vs_labels" else "-",
                label=label,
            )
        ax.axhspan(0.98, 1.02, color="green", alpha=0.15, label="1.0 ± 2%")
        ax.set_xticks(range(len(days)), [x[5:] for x in days], fontsize="small")
        ax.set_title(f"{d}: click calibration, teacher frozen")
        ax.set_ylabel("Σ predicted / Σ true p (dashed: / Σ clicks)")
        ax.legend(fontsize="x-small")
    save_png(fig, path, dpi=110)


def _f(x: float | None, spec: str = ".4f") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, spec)


def table(result: dict[str, Any], objectives: tuple[str, ...]) -> str:
    """Markdown: rows = teacher and variants, cells = NE / AUC per slice."""
    slices, lines = table_head(objectives, "ratio all/click")
    rows = [("teacher (GEM, frozen)", result["teacher"]["eval"], None)]
    rows += [
        (
            f"student: {v}",
            r["eval"],
            result["transfer_ratio"].get(v, {}).get("all/click"),
        )
        for v, r in result["variants"].items()
    ]
    for label, m, ratio in rows:
        cells = [f"{_f(m[s]['ne'])} / {_f(m[s]['auc'], '.3f')}" for s in slices]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {_f(ratio, '.2f')} |")
    cells = [f"{m[s]['count']} / {m[s]['positives']}" for s in slices]
    lines.append("| count / positives | " + " | ".join(cells) + " | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--section",
        choices=("all", "generated", "movielens", "freshness"),
        default="all",
    )
    p.add_argument("--fresh-users", type=int, default=6000)
    p.add_argument("--fresh-days", type=int, default=8)
    p.add_argument("--fresh-k", type=int, default=2, help="teacher frozen at day k")
    p.add_argument("--fresh-drift", type=float, default=0.15, help="logit per day")
    p.add_argument(
        "--fresh-click-shift",
        type=float,
        default=1.0,
        help="freshness: added to every domain's click intercept",
    )
    p.add_argument("--png", type=Path, default=None, help="freshness curves")
    p.add_argument(
        "--png-from",
        type=Path,
        default=None,
        help="redraw --png from a saved --json result (no run)",
    )
    defaults = DistillConfig()
    p.add_argument("--adapter-lr", type=float, default=defaults.adapter_lr)
    p.add_argument(
        "--adapter-level-noise", type=float, default=defaults.adapter_level_noise
    )
    p.add_argument(
        "--adapter-slope-noise", type=float, default=defaults.adapter_slope_noise
    )
    p.add_argument(
        "--no-adapter-tracker",
        action="store_true",
        help="the adapter without its calibration filter (the first design)",
    )
    p.add_argument(
        "--reuse", action="store_true", help="freshness: reuse data and teacher"
    )
    p.add_argument("--users", type=int, default=4000)
    p.add_argument("--ads", type=int, default=400)
    p.add_argument(
        "--days",
        type=int,
        default=11,
        help="generated: warm-up + teacher days + 2 student days + val + eval",
    )
    p.add_argument(
        "--warmup-days",
        type=int,
        default=3,
        help="generated: first days only fill histories and counters",
    )
    p.add_argument(
        "--click-logit-shift",
        type=float,
        default=1.0,
        help="generated: added to every domain's click intercept",
    )
    p.add_argument(
        "--variants",
        type=lambda t: tuple(t.split(",")),
        default=(),
        help="comma list of student variants (default: all)",
    )
    p.add_argument("--teacher-epochs", type=int, default=2)
    p.add_argument(
        "--teacher-period",
        choices=("before-students", "through-students"),
        default="before-students",
        help="generated: teacher frozen before the student days, or trained "
        "through them (up to the validation day)",
    )
    p.add_argument("--teacher-lr", type=float, default=2e-3)
    p.add_argument("--ml-steps", type=int, default=100)
    p.add_argument("--student-epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--max-seq-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", type=Path, default=Path("/tmp/bench_distill"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.png_from is not None:
        if args.png is None:
            p.error("--png-from needs --png")
        saved = json.loads(args.png_from.read_text())["freshness"]
        plot_freshness(saved, args.png)
        return 0
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": cpu_model(),
    }
    sections = {
        "generated": generated,
        "movielens": movielens_section,
        "freshness": freshness,
    }
    for name, fn in sections.items():
        if args.section not in ("all", name):
            continue
        (args.work / name).mkdir(parents=True, exist_ok=True)
        r = fn(args, args.work / name)
        result[name] = r
        if r is None or name == "freshness":
            continue
        objectives = TRAINING_OBJECTIVES if name == "generated" else ("click",)
        print(f"\n## {name}: eval NE / AUC (transfer ratio on all/click)\n")
        print(table(r, objectives))
        print(
            "\ntransfer ratios:",
            json.dumps(
                {
                    v: {k: round(x, 3) for k, x in d.items()}
                    for v, d in r["transfer_ratio"].items()
                }
            ),
        )
        save_result(result, args.json)  # a crash later keeps what is done
    return finish_run(result, started, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
