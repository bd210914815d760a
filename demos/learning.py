"""Did the demo's model learn? Its click figures beside the ceiling, and a PNG.

The trainer daemon reports progressive-validation metrics per (domain,
objective); the demo's question is one click figure over every domain,
set against the base rate (NE 1) and the generator's Bayes-optimal NE on the
same examples (:func:`pipelines.sources.bayes.pooled_click` pools both sides the same
way). The PNG is that click NE over training time, the ceiling drawn as a
line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.sources.bayes import pooled_click

CLICK = "click"


@dataclass(frozen=True)
class LearningVerdict:
    """The demo's learning check: last-window NE and whole-run AUC of clicks.

    Args:
        window_ne: pooled click NE of the last closed window of each domain.
        window_auc: its AUC (pairs within a domain).
        lifetime_ne: pooled click NE over the whole run.
        lifetime_auc: its AUC.
        max_ne: the highest last-window NE that counts as learnt.
        min_auc: the lowest whole-run AUC that counts as learnt.
    """

    window_ne: float
    window_auc: float
    lifetime_ne: float
    lifetime_auc: float
    max_ne: float
    min_auc: float

    @property
    def learnt(self) -> bool:
        """Both thresholds met (NaN, i.e. no click seen, is not learnt)."""
        return self.window_ne <= self.max_ne and self.lifetime_auc >= self.min_auc

    def line(self) -> str:
        """The sentence the demo prints."""
        figures = (
            f"last-window click NE {self.window_ne:.4f} (at most {self.max_ne}), "
            f"whole-run click AUC {self.lifetime_auc:.4f} (at least {self.min_auc})"
        )
        if self.learnt:
            return f"the model learnt: {figures}"
        return f"the model did NOT learn: {figures}"


def click_slices(table: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The ``"domain/click"`` entries of a daemon metrics table, by domain."""
    return {
        key.split("/")[0]: metrics
        for key, metrics in table.items()
        if key.split("/")[1] == CLICK
    }


def pooled_model_click(table: dict[str, dict[str, float]]) -> dict[str, float]:
    """The daemon's per-domain click metrics pooled into one figure."""
    return pooled_click(click_slices(table))


def verdict(last: dict[str, Any], *, max_ne: float, min_auc: float) -> LearningVerdict:
    """The learning check on the daemon's final metrics record."""
    window = pooled_model_click(last["window"])
    lifetime = pooled_model_click(last["lifetime"])
    return LearningVerdict(
        window_ne=window["ne"],
        window_auc=window["auc"],
        lifetime_ne=lifetime["ne"],
        lifetime_auc=lifetime["auc"],
        max_ne=max_ne,
        min_auc=min_auc,
    )


def read_records(metrics_jsonl: Path) -> list[dict[str, Any]]:
    """The daemon's metrics records, one per log interval, in order."""
    return [json.loads(line) for line in metrics_jsonl.read_text().splitlines() if line]


def plot_learning(
    records: list[dict[str, Any]],
    *,
    bayes_ne: float,
    path: Path,
    title: str,
) -> Path:
    """PNG of pooled click NE over training seconds, the ceiling as a line.

    Args:
        records: the daemon's metrics records (:func:`read_records`).
        bayes_ne: the generator's Bayes-optimal pooled click NE.
        path: where the PNG goes.
        title: the figure's title.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    from trainer.metrics.reporting import save_png

    start = records[0]["time"] if records else 0.0
    fig, ax = plt.subplots(figsize=(7, 4))
    for scope, label, style in (
        ("window", "model, last window", "-"),
        ("lifetime", "model, whole run so far", "--"),
    ):
        points = [
            (r["time"] - start, pooled_model_click(r[scope])["ne"]) for r in records
        ]
        points = [(t, ne) for t, ne in points if math.isfinite(ne)]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, style, marker=".", label=label)
    ax.axhline(1.0, color="grey", linewidth=1, label="base rate (NE 1)")
    floor = 1.0
    if math.isfinite(bayes_ne):  # NaN: no click in the data
        floor = min(bayes_ne, 1.0)
        ax.axhline(
            bayes_ne, color="green", linewidth=1, label="Bayes-optimal (ceiling)"
        )
    # The first batches, scored by an untrained model, can sit far above 1;
    # the range that matters is between the ceiling and the base rate.
    ax.set_ylim(floor - 0.05, 1.25)
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("click NE, all domains")
    ax.set_title(title)
    ax.legend(fontsize="small")
    return save_png(fig, path)
