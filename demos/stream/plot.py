"""``freshness.png``: one streaming demo run's freshness samples and the
trainer's progressive NE over wall time, the publishing and the outage shaded."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from demos.stream.freshness import Sample
from demos.stream.report import FRESHNESS

MIN_WINDOWS = 3


def ne_series(steps: list[dict[str, Any]]) -> tuple[str, dict[str, list[Any]]]:
    """NE per (domain, objective) over the records: the closed windows where
    every key has closed at least ``MIN_WINDOWS`` of them, else the lifetime
    figures (a small run closes few or none)."""

    def series(scope: str) -> dict[str, list[tuple[float, float]]]:
        found: dict[str, list[tuple[float, float]]] = {}
        for step in steps:
            for key, values in step[scope].items():
                if not math.isnan(values["ne"]):
                    found.setdefault(key, []).append((step["time"], values["ne"]))
        return found

    lifetime, window = series("lifetime"), series("window")
    closed = {key: len({ne for _, ne in points}) for key, points in window.items()}
    if lifetime and all(closed.get(key, 0) >= MIN_WINDOWS for key in lifetime):
        return "window", window
    return "lifetime", lifetime


def plot(
    path: Path,
    started_wall: float,
    samples: dict[str, list[Sample]],
    steps: list[dict[str, Any]],
    report: dict[str, Any],
) -> Path:
    """Freshness samples (at the time each was measured, by their key in
    :data:`~demos.stream.report.FRESHNESS`) and progressive NE over wall time
    since the broker started, with the publishing and the broker outage
    shaded in both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainer.metrics.reporting import save_png

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7.5), sharex=True)
    for (key, label), marker in zip(FRESHNESS, "+.x", strict=True):
        if samples[key]:
            xs = [t / 1000 - started_wall for t, _ in samples[key]]
            ys = [age / 1000 for _, age in samples[key]]
            top.plot(xs, ys, marker, markersize=4, alpha=0.5, label=label)
    top.set_ylabel("freshness, s")
    top.set_title("freshness samples, at the time each was measured")
    _plot_ne(bottom, steps, started_wall)
    _shade(top, bottom, report)
    return save_png(fig, path, dpi=90)


def _plot_ne(ax: Any, steps: list[dict[str, Any]], started_wall: float) -> None:
    """Progressive NE per (domain, objective): a colour per domain, the
    click line solid and the other dashed."""
    import matplotlib.pyplot as plt

    scope, series = ne_series(steps)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    domains = sorted({key.split("/")[0] for key in series})
    for key in sorted(series):
        domain, objective = key.split("/")
        ax.plot(
            [t - started_wall for t, _ in series[key]],
            [ne for _, ne in series[key]],
            "-" if objective == "click" else "--",
            color=colors[domains.index(domain) % len(colors)],
            label=key,
        )
    ax.set_ylabel(f"progressive NE ({scope})")
    ax.set_xlabel("wall time since the broker started, s")
    ax.set_title("trainer: progressive NE per domain / objective")


def _shade(top: Any, bottom: Any, report: dict[str, Any]) -> None:
    """The publishing and the outage shaded in both panels."""
    sent, outage = report["published"], report.get("broker_outage")
    for ax in (top, bottom):
        # Labelled once: the top panel's legend explains both.
        ax.axvspan(
            sent["started_at_s"],
            sent["started_at_s"] + sent["seconds"],
            color="grey",
            alpha=0.12,
            label="events being published" if ax is top else None,
        )
        if outage:
            ax.axvspan(
                outage["killed_at_s"],
                outage["back_at_s"],
                color="red",
                alpha=0.15,
                label="broker down" if ax is top else None,
            )
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small", loc="upper left")
