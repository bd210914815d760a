"""The demo's learning check and its PNG, on metrics records in the daemon's
format (``trainer.metrics.reporting.Reporter``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from demos import learning as demo_learning


def _slice(count: int, positives: int, ne: float, auc: float) -> dict[str, float]:
    return {
        "count": count,
        "positives": positives,
        "ne": ne,
        "auc": auc,
        "calibration": 1.0,
    }


def _record(time: float, window_ne: float, auc: float) -> dict[str, Any]:
    table = {
        "facebook/click": _slice(2000, 30, window_ne, auc),
        "facebook/conversion": _slice(2000, 3, 2.0, 0.1),
        # The same base rate in both: their pooled NE is their own.
        "messaging/click": _slice(2000, 30, window_ne, auc),
    }
    return {"time": time, "window": table, "lifetime": table}


def test_learnt_only_when_both_thresholds_hold() -> None:
    good = demo_learning.verdict(_record(0, 0.93, 0.7), max_ne=0.95, min_auc=0.65)
    assert good.learnt
    assert good.line().startswith("the model learnt: last-window click NE 0.9300")
    flat = demo_learning.verdict(_record(0, 0.99, 0.7), max_ne=0.95, min_auc=0.65)
    assert not flat.learnt
    assert flat.line().startswith("the model did NOT learn:")
    unranked = demo_learning.verdict(_record(0, 0.9, 0.6), max_ne=0.95, min_auc=0.65)
    assert not unranked.learnt


def test_no_clicks_is_not_learnt() -> None:
    empty = {"time": 0.0, "window": {}, "lifetime": {}}
    check = demo_learning.verdict(empty, max_ne=0.95, min_auc=0.65)
    assert math.isnan(check.window_ne)
    assert not check.learnt


def test_pooling_ignores_conversions() -> None:
    pooled = demo_learning.pooled_model_click(_record(0, 0.9, 0.7)["window"])
    assert pooled["count"] == 4000
    assert pooled["ne"] == pytest.approx(0.9)


def test_pooled_ne_counts_the_domains_base_rates() -> None:
    # Knowing the domain alone is information: two slices at NE 1 with
    # different base rates pool below 1.
    table = {
        "facebook/click": _slice(2000, 20, 1.0, 0.5),
        "messaging/click": _slice(2000, 80, 1.0, 0.5),
    }
    pooled = demo_learning.pooled_model_click(table)
    assert pooled["ne"] < 0.99
    assert pooled["base_rate"] == pytest.approx(0.025)


def test_the_png_is_written(tmp_path: Path) -> None:
    records = [_record(100.0 + t, 1.0 - t / 100, 0.7) for t in range(5)]
    png = demo_learning.plot_learning(
        records, bayes_ne=0.83, path=tmp_path / "curve.png", title="t"
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    none = demo_learning.plot_learning(
        [], bayes_ne=math.nan, path=tmp_path / "empty.png", title="t"
    )
    assert none.is_file()
