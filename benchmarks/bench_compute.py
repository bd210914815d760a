"""Worth its cost: every model's eval NE against its training compute.

Usage::

    python -m benchmarks.bench_compute [--section generated|movielens]
        [--users 1000 --ads 100 --days 8] [--models gem,dlrm,dcnv2]
        [--budgets 0.125,0.25,0.5,1,2] [--batch-size 256] [--max-seq-len 32]
        [--lr 2e-3] [--model-lrs dlrm=4e-3,dcnv2=4e-3] [--threads 1]
        [--work DIR] [--reuse] [--json FILE] [--plot FILE]

One train / validation / eval split, written by
:mod:`benchmarks.bench_quality` (generated: eval = the last day, validation =
the day before; movielens: eval = the last 10 % of impressions, validation
= the last 10 % of the rest). Each
model (the registry's, GEM's ablations, or a
:data:`benchmarks.bench_quality.GEM_VARIANTS` name) is trained once, by
:class:`~trainer.training.fit_trainer.FitTrainer`, on the epochs' seeded
random orders of the train period (the same batches for every model), and
stopped at every ``--budgets`` point (in epochs of the train period) to be
scored on validation and eval (:func:`trainer.training.evaluation.evaluate_dataset`).
The learning rate is constant, so the model at a point is the one a run of
that length would end with; each model has its own rate (``--model-lrs``,
defaults: the rates ``bench_quality``'s grid kept).

At each point: examples seen; training FLOPs = matmul FLOPs per example of
one forward + backward on the run's first batch
(``torch.utils.flop_counter.FlopCounterMode``) times examples seen, a lower
bound (gathers, softmax and elementwise ops are not counted; GEM's attention
cost follows its history lengths, measured on that batch only); this
process's CPU seconds (``time.process_time``) and wall seconds spent in
training steps and batch building (scoring excluded; batches are built in
the training thread so their CPU time is counted); eval NE / AUC /
calibration over all domains.

Where GEM pays: for each GEM point, the cheapest point of every other model
whose eval click NE reaches GEM's there ("never in this run" when none does).
GEM pays at a point when reaching its NE costs the other model more CPU
seconds than GEM spent, or cannot be bought within the run's budgets.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import bench_quality
from benchmarks.bench_quality import (
    GEM_VARIANTS,
    MOVIELENS_TARGET_MATCH_SHARED,
    add_movielens_argument,
    add_training_arguments,
    bayes_on,
    bench_config,
    save_result,
)
from benchmarks.generated import add_world_arguments
from benchmarks.machine import cpu_model
from features.json_report import json_safe
from trainer.data.batch import Batch
from trainer.data.feature_output import ExampleDataset
from trainer.models.config import ModelConfig
from trainer.models.registry import MODEL_NAMES
from trainer.training.device import autocast_for
from trainer.training.evaluation import evaluate_dataset
from trainer.training.fit import base_rate_logits, resolved_model_config
from trainer.training.fit_trainer import FitTrainer
from trainer.training.run_config import FitConfig

REFERENCE = "gem"
NEVER = "never in this run"
PLOT_NE_CEILING = 1.1


@dataclasses.dataclass(frozen=True)
class Split:
    """The three periods' feature dirs, the data set's model config, and the
    Bayes-optimal eval metrics where the data was generated (None on MovieLens)."""

    train: Path
    validation: Path
    evals: Path
    config: ModelConfig
    bayes: dict[str, Any] | None


def prepare_split(args: argparse.Namespace) -> Split:
    """The section's split, as ``bench_quality --prepare-only`` writes it."""
    quality_args = argparse.Namespace(**vars(args), prepare_only=True)
    work = args.work
    if args.section == "generated":
        bench_quality.generated(quality_args, work)
        prefix, bayes = "gen", bayes_on(work / "gen_eval", work / "gen/truth.parquet")
        config = bench_config(args.max_seq_len)
    else:
        if bench_quality.movielens_section(quality_args, work) is None:
            raise SystemExit(f"{args.movielens}: no ratings.dat")
        prefix, bayes = "ml", None
        config = bench_config(args.max_seq_len, MOVIELENS_TARGET_MATCH_SHARED)
    train, validation, evals = (
        work / f"{prefix}_{period}" for period in ("train", "validation", "eval")
    )
    return Split(train, validation, evals, config, bayes)


def checkpoint_steps(budgets: list[float], examples: int, batch_size: int) -> list[int]:
    """The step count at each budget (epochs of ``examples``), at least 1.

    Example:
        >>> checkpoint_steps([0.5, 1, 2], 1000, 256)
        [2, 4, 8]
    """
    steps = [max(1, math.ceil(b * examples / batch_size)) for b in budgets]
    if any(b <= a for a, b in itertools.pairwise(steps)):
        raise ValueError(f"budgets {budgets} do not give increasing step counts")
    return steps


def endless_batches(
    data: ExampleDataset, batch_size: int, seed: int
) -> Iterator[Batch]:
    """Epoch after epoch in ``fit``'s seeded orders, built in the caller's
    thread (``prefetch=0``) so the training clock sees their CPU time."""
    epoch = 0
    while True:
        yield from data.batches(
            batch_size, shuffle=True, seed=seed, epoch=epoch, prefetch=0
        )
        epoch += 1


def train_flops_per_example(trainer: FitTrainer, batch: Batch) -> float:
    """Matmul FLOPs of one forward + backward on ``batch``, per example.

    Counted on a copy with the RNG forked, so the run itself is unchanged.
    """
    model = copy.deepcopy(trainer.model).train()
    with torch.random.fork_rng(), FlopCounterMode(display=False) as counter:
        loss, _ = model(batch)
        loss.backward()
    return counter.get_total_flops() / batch.size


@dataclasses.dataclass
class TrainingClock:
    """CPU and wall seconds accumulated over the ``with`` blocks."""

    cpu_s: float = 0.0
    wall_s: float = 0.0

    def __enter__(self) -> TrainingClock:
        self._cpu, self._wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *_: object) -> None:
        self.cpu_s += time.process_time() - self._cpu
        self.wall_s += time.perf_counter() - self._wall


def model_runs(labels: list[str]) -> list[tuple[str, str]]:
    """(label, registry model) of each label: a registry name or a GEM variant."""
    known = {*MODEL_NAMES, *GEM_VARIANTS}
    if unknown := [label for label in labels if label not in known]:
        raise SystemExit(f"unknown --models {unknown}; known: {sorted(known)}")
    return [(label, "gem" if label in GEM_VARIANTS else label) for label in labels]


def compute_curve(
    label: str,
    name: str,
    split: Split,
    data: dict[str, ExampleDataset],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Train ``label`` once, scoring it at every budget (module docstring)."""
    base = split.config
    if label in GEM_VARIANTS:
        base = GEM_VARIANTS[label](base)
    lr = args.model_lrs.get(label, args.lr)
    cfg = FitConfig(
        train=split.train,
        eval=split.evals,
        validation=split.validation,
        model=name,
        lr=lr,
        optimizer=args.optimizer,
        lr_schedule="constant",
        epochs=1,
        batch_size=args.batch_size,
        seed=args.seed,
        threads=args.threads,
        device="cpu",
    )
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    steps_at = checkpoint_steps(args.budgets, len(data["train"]), args.batch_size)
    trainer = FitTrainer(
        cfg,
        resolved_model_config(cfg, base),
        base_rate_logits(data["train"]),
        device,
        autocast_for(device, "fp32"),
        total_steps=steps_at[-1],
    )
    batches = endless_batches(data["train"], args.batch_size, args.seed)
    first = next(batches)
    flops = train_flops_per_example(trainer, first)
    batches = itertools.chain([first], batches)
    clock, seen, points = TrainingClock(), 0, []
    for budget, steps in zip(args.budgets, steps_at, strict=True):
        with clock:
            while trainer.steps < steps:
                batch = next(batches)
                trainer.step(batch)
                seen += batch.size
        scores = {
            k: evaluate_dataset(trainer.model, data[k]) for k in ("eval", "validation")
        }
        points.append(
            {
                "budget_epochs": budget,
                "steps": steps,
                "examples": seen,
                "train_gflops": flops * seen / 1e9,
                "cpu_s": clock.cpu_s,
                "wall_s": clock.wall_s,
                "eval": scores["eval"]["overall"],
                "validation_click_ne": scores["validation"]["overall"]["click"]["ne"],
            }
        )
        click = points[-1]["eval"]["click"]
        print(
            f"  {label} {budget:g} epochs ({seen} examples): {clock.cpu_s:.1f} CPU s, "
            f"eval click NE {_ne(click['ne'])}",
            flush=True,
        )
    return {
        "lr": lr,
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
        "train_flops_per_example": flops,
        "points": points,
    }


def _click_ne(point: dict[str, Any]) -> float:
    """A point's eval click NE; NaN without clicks."""
    ne = point["eval"]["click"]["ne"]
    return math.nan if ne is None else ne


def where_gem_pays(curves: dict[str, Any]) -> list[dict[str, Any]]:
    """For each GEM point, every other model's cheapest point at GEM's NE."""
    if REFERENCE not in curves:
        return []
    rows = []
    for point in curves[REFERENCE]["points"]:
        if not math.isfinite(_click_ne(point)):
            continue  # an eval period without clicks has no NE to reach
        row: dict[str, Any] = {"gem": point, "peers": {}}
        for label, curve in curves.items():
            if label == REFERENCE:
                continue
            # Points of one run cost more the later they are: the first suffices.
            reached = next(
                (p for p in curve["points"] if _click_ne(p) <= _click_ne(point)), None
            )
            row["peers"][label] = {
                "reached_at": reached,
                "gem_pays": reached is None or reached["cpu_s"] > point["cpu_s"],
            }
        rows.append(row)
    return rows


def _ne(x: float | None, spec: str = ".4f") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, spec)


def curve_table(label: str, curve: dict[str, Any]) -> str:
    """Markdown: one row per budget of one model."""
    lines = [
        f"{label} (lr {curve['lr']:g}, "
        f"{curve['train_flops_per_example'] / 1e6:.2f} MFLOP/example fwd+bwd)",
        "",
        "| budget (epochs) | examples | GFLOPs | CPU s | wall s | click NE | AUC "
        "| calibration | validation click NE |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in curve["points"]:
        c = p["eval"]["click"]
        lines.append(
            f"| {p['budget_epochs']:g} | {p['examples']:,} | {p['train_gflops']:,.1f} "
            f"| {p['cpu_s']:.1f} | {p['wall_s']:.1f} | {_ne(c['ne'])} "
            f"| {_ne(c['auc'], '.3f')} | {_ne(c['calibration'], '.2f')} "
            f"| {_ne(p['validation_click_ne'])} |"
        )
    return "\n".join(lines)


def pays_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per GEM budget, where each other model reaches its NE."""
    if not rows:
        return ""
    peers = list(rows[0]["peers"])
    lines = [
        "| GEM budget (epochs) | GEM click NE | GEM GFLOPs | GEM CPU s | "
        + " | ".join(f"{p} reaches it at" for p in peers)
        + " |",
        "|---:|---:|---:|---:|" + "---|" * len(peers),
    ]
    for row in rows:
        gem = row["gem"]
        cells = []
        for peer in peers:
            got = row["peers"][peer]
            p = got["reached_at"]
            cell = (
                NEVER
                if p is None
                else f"{p['budget_epochs']:g} epochs: {p['train_gflops']:,.1f} GFLOPs, "
                f"{p['cpu_s']:.1f} CPU s"
            )
            cells.append(f"**{cell}**" if got["gem_pays"] else cell)
        lines.append(
            f"| {gem['budget_epochs']:g} | {_ne(gem['eval']['click']['ne'])} "
            f"| {gem['train_gflops']:,.1f} | {gem['cpu_s']:.1f} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def plot_curves(result: dict[str, Any], path: Path) -> Path | None:
    """Eval click NE against GFLOPs and against CPU seconds, as a PNG; None
    (and a message) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", flush=True)
        return None
    from trainer.metrics.reporting import save_png

    scored = {
        label: [p for p in curve["points"] if math.isfinite(_click_ne(p))]
        for label, curve in result["models"].items()
    }
    if not any(scored.values()):
        print("no eval click NE (no clicks): no plot", flush=True)
        return None
    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for axis, key, xlabel in (
        (axes[0], "train_gflops", "training GFLOPs (matmuls, a lower bound)"),
        (axes[1], "cpu_s", "training CPU seconds"),
    ):
        for label, points in scored.items():
            axis.plot(
                [p[key] for p in points],
                [_click_ne(p) for p in points],
                marker="o",
                label=label,
            )
        if result["bayes_click_ne"] is not None and math.isfinite(
            result["bayes_click_ne"]
        ):
            axis.axhline(result["bayes_click_ne"], color="0.5", ls="--", label="Bayes")
        axis.set_xscale("log")
        axis.set_xlabel(xlabel)
    # Overfit points (NE far above 1) would flatten every curve that matters.
    axes[0].set_ylim(top=min(axes[0].get_ylim()[1], PLOT_NE_CEILING))
    axes[0].set_ylabel(f"eval click NE (cut at {PLOT_NE_CEILING:g})")
    axes[0].legend()
    return save_png(figure, path, dpi=100)


def parse_model_lrs(text: str) -> dict[str, float]:
    """``dlrm=4e-3,dcnv2=4e-3`` → ``{"dlrm": 0.004, "dcnv2": 0.004}``."""
    pairs = (item.split("=") for item in text.split(",") if item)
    return {label: float(lr) for label, lr in pairs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--section", choices=("generated", "movielens"), default="generated")
    add_world_arguments(p, users=1000, ads=100, days=8)
    p.add_argument("--models", default="gem,dlrm,dcnv2")
    p.add_argument(
        "--budgets",
        type=lambda v: [float(x) for x in v.split(",")],
        default=[0.125, 0.25, 0.5, 1.0, 2.0],
        help="increasing points of one run, in epochs of the train period",
    )
    add_training_arguments(p)
    p.add_argument(
        "--model-lrs",
        type=parse_model_lrs,
        default=parse_model_lrs("dlrm=4e-3,dcnv2=4e-3"),
        help="label=rate pairs overriding --lr",
    )
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    add_movielens_argument(p)
    p.add_argument("--work", type=Path, default=Path("/tmp/bench_compute"))
    p.add_argument("--reuse", action="store_true", help="reuse the split dirs")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None, help="PNG of the curves")
    args = p.parse_args(argv)
    runs = model_runs(args.models.split(","))
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    split = prepare_split(args)
    seq = split.config.embedding.max_seq_len
    data = {
        "train": ExampleDataset(split.train, max_seq_len=seq),
        "validation": ExampleDataset(split.validation, max_seq_len=seq),
        "eval": ExampleDataset(split.evals, max_seq_len=seq),
    }
    curves = {
        label: compute_curve(label, name, split, data, args) for label, name in runs
    }
    bayes = split.bayes["overall"]["click"]["ne"] if split.bayes else None
    result = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "examples": {k: len(v) for k, v in data.items()},
        "bayes_click_ne": bayes,
        "models": curves,
        "where_gem_pays": where_gem_pays(curves),
    }
    print(f"\n## eval click NE against training compute ({result['cpu']})")
    for label, curve in curves.items():
        print(f"\n{curve_table(label, curve)}")
    if bayes is not None:
        print(f"\nBayes-optimal eval click NE {_ne(bayes)}")
    if result["where_gem_pays"]:
        print(
            "\n## where GEM pays (bold: GEM is cheaper or the peer never gets there)\n"
        )
        print(pays_table(result["where_gem_pays"]))
    if args.plot is not None and plot_curves(result, args.plot):
        print(f"\nplot: {args.plot}")
    save_result(json_safe(result), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
