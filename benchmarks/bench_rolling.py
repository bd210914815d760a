"""Rolling-origin model quality: every model judged on periods no choice saw.

Usage::

    python -m benchmarks.bench_rolling [--section generated|movielens]
        [--cuts 4] [--users 4000 --ads 400 --days 8] [--drift 0.0]
        [--fractions 0.8,0.85,0.9,0.95]
        [--models gem,dlrm,...] [--recipe search|default] [--no-recalibrate]
        [--lrs 1e-3,3e-3] [--epochs 3] [--patience 1]
        [--steps N] [--batch-size 256] [--max-seq-len 32] [--bootstrap 200]
        [--work DIR] [--json FILE]

One feature-job output, then ``--cuts`` consecutive origins. At origin
``k`` the model trains on everything before the period just before it,
chooses its learning rate (``--lrs``) and epoch (``--epochs`` with
``--patience``) on that period, and is evaluated on the period from the
origin to the next one; later periods are left out
(:func:`trainer.data.feature_files.split_periods`). The next origin is where
this one's eval period ends, so each period is evaluated once, and chosen on
once, by a model trained on its past only.

Periods: on **generated** data (``pipelines.sources.synthetic``: the users'
histories and sessions move on day by day, and with ``--drift`` every base
rate rises by that many logits a day), the last ``--cuts`` UTC days, each an
eval day and the day before it its validation day; on **movielens**
(``movielens-1m-dev``), eval periods start at the ``--fractions`` of the
time-ordered impressions (the last runs to the end), and the first validation
period is as long as the step between the first two fractions.

Reported per origin and as the mean over origins: NE, AUC and calibration
per (domain, objective) for every model; a paired bootstrap over each eval
period's impressions of every model's overall click NE minus GEM's; on
generated data the Bayes-optimal metrics of the true probabilities and the
share of the DLRM -> Bayes click NE gap GEM closes; and every model's click
NE on slices of the eval impressions of all origins pooled
(:mod:`benchmarks.slices`: new and seen users and ads, history length,
domain, hours since the origin). Every model gets the same
budget and the same search, so each has its own best recipe from it; with
``--recipe default`` each gets ``trainer.fit``'s defaults instead (up to 8
epochs, the plateau schedule and patience 2 on the origin's validation
period), what a user who tunes nothing would run. Either way every model is
recalibrated on the origin's validation period and its epochs are chosen
after that shift, as ``trainer.fit`` does unless told ``--no-recalibrate``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_quality import (
    SHARED,
    bayes_on,
    bayes_probs_aligned,
    bench_config,
    bootstrap_vs_gem,
    gap_closed,
    run_models,
)
from benchmarks.generated import generated_features, reference_features, world_config
from benchmarks.slices import slice_keys, slice_metrics, slice_table
from features.vocab import DOMAINS, TRAINING_OBJECTIVES
from trainer.data.feature_output import cut_at_fraction, read_examples, split_periods
from trainer.models.registry import MODEL_NAMES
from trainer.training.run_config import OPTIMIZERS, FitConfig

TASKS = [f"{d}/{o}" for d in DOMAINS for o in TRAINING_OBJECTIVES]
FIT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(FitConfig)}


def generated_world_dir(args: argparse.Namespace, work: Path) -> Path:
    """Where the generated world's events and true probabilities go: one
    folder per world, so that a ``--work`` reused with other flags does not
    hand back another world (its features: the same name with ``_f``)."""
    name = f"{args.users}u-{args.ads}a-{args.days}d-seed{args.seed}-drift{args.drift:g}"
    return work / f"gen-{name}"


def generated_origins(args: argparse.Namespace, work: Path) -> tuple[Path, list[int]]:
    """The generated world's features and its period bounds: the starts of
    the last ``--cuts + 1`` UTC days (the first validation day onwards)."""
    from pipelines.sources.synthetic import ModelParams

    drift = (args.drift,) * len(DOMAINS)
    world = world_config(args, params=ModelParams(base_logit_drift_per_day=drift))
    events = generated_world_dir(args, work)
    features = events.with_name(events.name + "_f")
    if not features.exists():
        generated_features(world, events, features, overwrite=True)

    def day_start(offset: int) -> int:
        day = world.start + dt.timedelta(days=args.days + offset)
        return int(dt.datetime.combine(day, dt.time(), dt.UTC).timestamp() * 1000)

    return features, [day_start(-args.cuts - 1 + i) for i in range(args.cuts + 1)]


def movielens_origins(args: argparse.Namespace, work: Path) -> tuple[Path, list[int]]:
    """MovieLens features and its period bounds: the first validation
    period's start, then the eval periods' starts at ``--fractions``."""
    from pipelines.sources import movielens

    features = work / "ml_f"
    if not features.exists():
        movielens.run(args.movielens, work / "ml", overwrite=True)
        reference_features(work / "ml", features, overwrite=True)
    fractions = [float(f) for f in args.fractions.split(",")]
    if len(fractions) != args.cuts or fractions != sorted(fractions):
        raise SystemExit(f"--fractions: {args.cuts} increasing fractions, one per cut")
    step = fractions[1] - fractions[0] if len(fractions) > 1 else 1 - fractions[0]
    bounds = [max(fractions[0] - step, 0.0), *fractions]
    return features, [cut_at_fraction(features, f) for f in bounds]


def split_origin(
    features: Path, bounds: list[int], k: int, work: Path
) -> tuple[Path, Path, Path, dict[str, int]]:
    """Origin ``k``: train before ``bounds[k]``, validation up to
    ``bounds[k + 1]``, eval up to ``bounds[k + 2]`` (or the end); later
    examples left out. Returns the dirs and the examples of each period."""
    cuts = bounds[k : k + 3]
    dirs = [work / f"origin{k}" / name for name in ("train", "validation", "eval")]
    targets: list[Path | None] = [*dirs]
    if len(cuts) == 3:
        targets.append(None)
    counts = split_periods(features, cuts, targets)
    if len(cuts) == 2:
        counts.append(0)  # the last origin's eval period runs to the end
    names = ("train", "validation", "eval", "left_out")
    return dirs[0], dirs[1], dirs[2], dict(zip(names, counts, strict=True))


def recipe_args(args: argparse.Namespace) -> dict[str, Any]:
    """What each model is given to choose with: the search (``--lrs``,
    ``--epochs``, ``--patience`` at a constant rate) or, under ``--recipe
    default``, trainer.fit's defaults alone (rate, epochs, patience and the
    plateau schedule), the origin's validation period their only input."""
    if args.recipe == "default":
        return {"lrs": None, "lr": FIT_DEFAULTS["lr"]}
    lrs = tuple(float(x) for x in args.lrs.split(","))
    return {
        "lrs": lrs,
        "lr": lrs[0],
        "epochs": args.epochs,
        "patience": args.patience,
        "lr_schedule": "constant",
    }


def task_metrics(report: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """NE, AUC and calibration per (domain, objective), and over all domains."""
    out = {
        task: {k: report["by_task"][task][k] for k in ("ne", "auc", "calibration")}
        for task in TASKS
    }
    for o in TRAINING_OBJECTIVES:
        overall = report["overall"][o]
        out[f"all/{o}"] = {k: overall[k] for k in ("ne", "auc", "calibration")}
    return out


@dataclasses.dataclass
class PooledEval:
    """Every origin's eval impressions, for the slices: each slice's value,
    the click label and each model's click probability, row by row."""

    keys: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)
    clicks: list[np.ndarray] = dataclasses.field(default_factory=list)
    probs: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)

    def add(
        self, train: Path, evals: Path, origin_ms: int, predictions: dict[str, Any]
    ) -> None:
        self.keys.append(
            slice_keys(read_examples(evals), read_examples(train), origin_ms)
        )
        click = TRAINING_OBJECTIVES.index("click")
        first = next(iter(predictions.values()))
        self.clicks.append(first["labels"][:, click])
        self.probs.append({m: p["probs"][:, click] for m, p in predictions.items()})

    def sliced(self) -> dict[str, dict[str, Any]]:
        """:func:`benchmarks.slices.slice_metrics` over all origins."""
        keys = {
            name: np.concatenate([k[name] for k in self.keys]) for name in self.keys[0]
        }
        probs = {m: np.concatenate([p[m] for p in self.probs]) for m in self.probs[0]}
        return slice_metrics(keys, np.concatenate(self.clicks), probs)


def run_origin(
    args: argparse.Namespace,
    features: Path,
    bounds: list[int],
    k: int,
    work: Path,
    pooled: PooledEval,
) -> dict[str, Any]:
    """Every model at origin ``k``: its chosen recipe and its eval metrics
    (its eval predictions go to ``pooled``)."""
    train, validation, evals, counts = split_origin(features, bounds, k, work)
    print(f"origin {k}: examples {counts}", flush=True)
    predictions: dict[str, dict[str, np.ndarray]] = {}
    reports = run_models(
        train,
        validation,
        evals,
        bench_config(args.max_seq_len),
        predictions,
        models=args.models.split(",") if args.models else None,
        **recipe_args(args),
        optimizer=args.optimizer,
        recalibrate=args.recalibrate,
        batch_size=args.batch_size,
        max_steps_per_epoch=args.steps,
        validation_sample=args.validation_sample,
        train_ne_sample=5_000,
        seed=args.seed,
    )
    result: dict[str, Any] = {
        "eval_from_ms": bounds[k + 1],
        "examples": counts,
        "models": {
            name: {
                "metrics": task_metrics(r),
                "lr": r["selected_lr"],
                "recipe": r["recipe"],
                "epoch": r["train"]["selected_epoch"],
                "epochs_run": r["train"]["epochs_run"],
                "train_seconds": r["train"]["seconds"],
                "examples_per_s": r["train"]["examples_per_s"],
            }
            for name, r in reports.items()
        },
    }
    bayes_probs = None
    if args.section == "generated":
        truth = generated_world_dir(args, work) / "truth.parquet"
        bayes = bayes_on(evals, truth)
        bayes_probs = bayes_probs_aligned(evals, truth)
        result["bayes"] = task_metrics(bayes)
        result["gem_gap_closed"] = gap_closed(reports, bayes, "all/click")
    result["bootstrap_vs_gem"] = bootstrap_vs_gem(
        predictions, bayes_probs, args.bootstrap
    )
    pooled.add(train, evals, bounds[k + 1], predictions)
    if not args.keep_splits:
        shutil.rmtree(work / f"origin{k}")
    return result


def summarize(origins: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over origins per model and task, and where GEM leads."""
    models = origins[0]["models"]
    keys = [*TASKS, *(f"all/{o}" for o in TRAINING_OBJECTIVES)]
    mean: dict[str, Any] = {}
    for name in models:
        mean[name] = {}
        for key in keys:
            mean[name][key] = {}
            for metric in ("ne", "auc", "calibration"):
                values = [o["models"][name]["metrics"][key][metric] for o in origins]
                present = [v for v in values if v is not None]
                mean[name][key][metric] = float(np.mean(present)) if present else None
    summary: dict[str, Any] = {"mean": mean}
    if "gem" in models:

        def click_ne(origin: dict[str, Any], name: str) -> float:
            return float(origin["models"][name]["metrics"]["all/click"]["ne"])

        summary["gem_ahead_on_cuts"] = {
            name: sum(click_ne(o, "gem") < click_ne(o, name) for o in origins)
            for name in models
            if name != "gem"
        }
        summary["gem_lead_click_ne"] = {
            name: mean[name]["all/click"]["ne"] - mean["gem"]["all/click"]["ne"]
            for name in models
            if name != "gem"
        }
    if "gem_gap_closed" in origins[0]:
        summary["gem_gap_closed"] = float(
            np.mean([o["gem_gap_closed"] for o in origins])
        )
    return summary


def format_report(report: dict[str, Any]) -> str:
    """Overall click NE per origin and model, the mean, and GEM's leads."""
    origins, summary = report["origins"], report["summary"]
    models = list(summary["mean"])
    head = "| model | " + " | ".join(f"origin {k}" for k in range(len(origins)))
    lines = [head + " | mean |", "|---|" + "---:|" * (len(origins) + 1)]
    for name in models:
        cells = [
            f"{o['models'][name]['metrics']['all/click']['ne']:.4f}" for o in origins
        ]
        mean = summary["mean"][name]["all/click"]["ne"]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {mean:.4f} |")
    if "bayes" in origins[0]:
        cells = [f"{o['bayes']['all/click']['ne']:.4f}" for o in origins]
        mean = np.mean([o["bayes"]["all/click"]["ne"] for o in origins])
        lines.append("| Bayes-optimal | " + " | ".join(cells) + f" | {mean:.4f} |")
    for key in ("gem_ahead_on_cuts", "gem_lead_click_ne", "gem_gap_closed"):
        if key in summary:
            lines.append(f"{key}: {summary[key]}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--section", choices=("generated", "movielens"), default="generated")
    p.add_argument("--cuts", type=int, default=4, help="origins (eval periods)")
    p.add_argument("--users", type=int, default=4000)
    p.add_argument("--ads", type=int, default=400)
    p.add_argument("--days", type=int, default=8)
    p.add_argument("--seed", type=int, default=0, help="the world and the training")
    p.add_argument(
        "--drift",
        type=float,
        default=0.0,
        help="generated: logits added to every base rate per day (0: none)",
    )
    p.add_argument("--movielens", type=Path, default=SHARED / "movielens-1m-dev")
    p.add_argument("--fractions", default="0.8,0.85,0.9,0.95")
    p.add_argument("--models", default=",".join(MODEL_NAMES))
    p.add_argument(
        "--recipe",
        choices=("search", "default"),
        default="search",
        help="search: --lrs x --epochs with --patience at a constant rate; "
        "default: trainer.fit's own recipe, no flag tuned",
    )
    p.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default=FIT_DEFAULTS["optimizer"],
        help="trainer.fit's --optimizer, for every model",
    )
    p.add_argument(
        "--no-recalibrate",
        dest="recalibrate",
        action="store_false",
        help="trainer.fit's --no-recalibrate, for every model",
    )
    p.add_argument("--lrs", default="1e-3,3e-3", help="the search: rates per model")
    p.add_argument("--epochs", type=int, default=3, help="the search: most per rate")
    p.add_argument("--patience", type=int, default=1, help="the search's patience")
    p.add_argument("--steps", type=int, default=None, help="batches per epoch, at most")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--max-seq-len", type=int, default=32)
    p.add_argument("--validation-sample", type=int, default=None)
    p.add_argument("--bootstrap", type=int, default=200)
    p.add_argument("--work", type=Path, default=Path("out/bench-rolling"))
    p.add_argument("--keep-splits", action="store_true")
    p.add_argument("--json", type=Path, default=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    args = build_parser().parse_args(argv)
    if args.cuts < 1:
        raise SystemExit("--cuts: at least 1")
    work = args.work / args.section
    work.mkdir(parents=True, exist_ok=True)
    if args.section == "generated":
        if args.days < args.cuts + 2:
            raise SystemExit(f"--days {args.days}: --cuts {args.cuts} need 2 more")
        features, bounds = generated_origins(args, work)
    else:
        if not (args.movielens / "ratings.dat").exists():
            raise SystemExit(f"--movielens {args.movielens}: no ratings.dat there")
        features, bounds = movielens_origins(args, work)
    print(f"{read_examples(features).num_rows} examples; bounds {bounds}", flush=True)
    pooled = PooledEval()
    origins = [
        run_origin(args, features, bounds, k, work, pooled) for k in range(args.cuts)
    ]
    report = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "origins": origins,
        "summary": summarize(origins),
        "slices": pooled.sliced(),
    }
    print(format_report(report))
    for name in origins[0]["models"]:
        if name != "gem" and "gem" in origins[0]["models"]:
            print(f"\n## eval click NE by slice, all origins: gem against {name}\n")
            print(slice_table(report["slices"], name))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
