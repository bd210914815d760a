"""Several training seeds in ``bench_quality``: choose, average, pair.

A training seed (model init and the epochs' samples; the data stay the same)
moves a model's NE by about as much as an ablation's margin, and the
paired bootstrap over eval impressions does not see it. With ``--seeds``,
every model is trained once per seed (saved under ``WORK/<section>_models/
seed<S>/``) and this module turns those runs into:

- one configuration per model, chosen on the **mean over seeds** of each
  run's best validation click NE (the same rule as one seed, averaged), so
  no seed's luck picks a learning rate;
- a **mean report** per model (every metric of every slice averaged over the
  seeds: the expected result of one training run, not an ensemble's);
- the all/click NE **per seed**, and each model's difference from the
  reference **paired per seed** (the same seed's samples and init stream).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

Report = dict[str, Any]
Predictions = dict[str, np.ndarray]


def seed_dir(root: Path, seed: int) -> Path:
    """Where one seed's runs are saved (``LABEL@lrR.json`` + ``.npz``)."""
    return root / f"seed{seed}"


def best_validation(report: Report) -> float:
    """The lowest per-epoch validation click NE of one run (inf: none)."""
    values = [v for v in report["train"]["epoch_validation_click_ne"] if v is not None]
    return min(values) if values else math.inf


def _saved_runs(root: Path, seed: int, label: str) -> dict[str, Path]:
    """This seed's saved runs of ``label`` by learning-rate string."""
    return {
        f.stem.split("@lr", 1)[1]: f
        for f in sorted(seed_dir(root, seed).glob(f"{label}@lr*.json"))
    }


def select_across_seeds(
    root: Path, seeds: Sequence[int], label: str
) -> tuple[list[Report], list[Predictions], dict[str, float]] | None:
    """Per seed, ``label``'s run at the rate with the best mean validation NE.

    Only rates saved for every seed compete. Returns the chosen run's report
    and predictions per seed (in ``seeds`` order) and the grid of mean best
    validation NE by rate; None when no rate was run on every seed.
    """
    by_seed = [_saved_runs(root, s, label) for s in seeds]
    common = set(by_seed[0]).intersection(*by_seed[1:])
    if not common:
        return None
    reports = {
        lr: [json.loads(runs[lr].read_text()) for runs in by_seed] for lr in common
    }
    grid = {
        lr: float(np.mean([best_validation(r) for r in reports[lr]])) for lr in common
    }
    chosen = min(sorted(common, key=float), key=lambda lr: grid[lr])
    predictions = []
    for runs in by_seed:
        with np.load(runs[chosen].with_suffix(".npz")) as saved:
            predictions.append(dict(saved))
    return reports[chosen], predictions, grid


def _mean(values: list[float | None]) -> float | None:
    """The mean, or None when any seed has no value (a slice without positives)."""
    if any(v is None or math.isnan(v) for v in values):
        return None
    return float(np.mean(values))


def _mean_metrics(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(per_seed[0])  # count / positives: the same eval set on every seed
    for key in ("ne", "auc", "calibration"):
        out[key] = _mean([m[key] for m in per_seed])
    return out


def mean_report(reports: list[Report], grid: dict[str, float]) -> Report:
    """The seeds' reports averaged slice by slice, plus the per-seed NE.

    Shaped like one run's report (``overall``, ``by_task``, ``train``) so the
    tables and the gap computation read it unchanged.
    """
    first = reports[0]
    return {
        "overall": {
            o: _mean_metrics([r["overall"][o] for r in reports])
            for o in first["overall"]
        },
        "by_task": {
            k: _mean_metrics([r["by_task"][k] for r in reports])
            for k in first["by_task"]
        },
        "train": {
            "examples_per_s": _mean(
                [r["train"].get("examples_per_s") for r in reports]
            ),
        },
        "seeds": len(reports),
        "per_seed_click_ne": [r["overall"]["click"]["ne"] for r in reports],
        "per_seed_selected_epoch": [r["train"].get("selected_epoch") for r in reports],
        "selected_lr": first["config"]["fit"]["lr"],
        "lr_grid_mean_validation": grid,
    }


def combine(
    root: Path, seeds: Sequence[int], labels: Sequence[str]
) -> tuple[dict[str, Report], dict[str, list[Predictions]]]:
    """Mean reports and per-seed predictions of every label run on all seeds.

    A label missing a seed is left out (and said so), not averaged over
    fewer seeds: its mean would not be comparable.
    """
    reports: dict[str, Report] = {}
    predictions: dict[str, list[Predictions]] = {}
    for label in labels:
        found = select_across_seeds(root, seeds, label)
        if found is None:
            have = [s for s in seeds if _saved_runs(root, s, label)]
            if have:
                print(f"  {label}: saved for seeds {have} only, left out", flush=True)
            continue
        runs, predictions[label], grid = found
        reports[label] = mean_report(runs, grid)
    return reports, predictions


def paired_by_seed(
    reports: dict[str, Report], reference: str = "gem"
) -> dict[str, dict[str, Any]]:
    """Each model's all/click NE minus the reference's, seed by seed.

    ``reference_better``: on how many seeds the reference has the lower NE.
    """
    if reference not in reports:
        return {}
    ref = reports[reference]["per_seed_click_ne"]
    out = {}
    for name, r in reports.items():
        if name == reference:
            continue
        diffs = [float(a - b) for a, b in zip(r["per_seed_click_ne"], ref, strict=True)]
        out[name] = {
            "per_seed": diffs,
            "mean": float(np.mean(diffs)),
            "reference_better": sum(d > 0 for d in diffs),
            "seeds": len(diffs),
        }
    return out


def seed_table(
    reports: dict[str, Report],
    paired: dict[str, dict[str, Any]],
    bootstrap: dict[str, Any],
    seeds: Sequence[int],
) -> str:
    """Markdown: all/click NE per seed, mean, spread, and the paired figures."""
    lines = [
        "| model | "
        + " | ".join(f"seed {s}" for s in seeds)
        + " | mean | spread | mean − GEM's [95 %, eval sample] | GEM better on |",
        "|---|" + "---:|" * (len(seeds) + 3) + "---:|",
    ]
    for name, r in reports.items():
        ne = r["per_seed_click_ne"]
        cells = [f"{x:.4f}" for x in ne]
        spread = f"{max(ne) - min(ne):.4f}"
        if name in paired:
            b = bootstrap.get(name, {})
            diff = f"{paired[name]['mean']:+.4f}" + (
                f" [{b['lo']:+.4f}, {b['hi']:+.4f}]" if b else ""
            )
            better = f"{paired[name]['reference_better']} / {paired[name]['seeds']}"
        else:
            diff = better = ""
        mean = r["overall"]["click"]["ne"]
        lines.append(
            f"| {name} | "
            + " | ".join(cells)
            + f" | {mean:.4f} | {spread} | {diff} | {better} |"
        )
    return "\n".join(lines)
