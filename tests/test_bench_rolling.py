"""The rolling-origin benchmark's periods and its summary over origins."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.bench_rolling import (
    generated_origins,
    main,
    split_origin,
    summarize,
)
from trainer.data.feature_output import event_time_ms, read_examples

DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int], Path]:
    """A 5-day generated world's features and the bounds of 3 origins."""
    work = tmp_path_factory.mktemp("rolling")
    args = argparse.Namespace(users=200, ads=40, days=5, seed=3, cuts=3, drift=0.0)
    features, bounds = generated_origins(args, work)
    return features, bounds, work


def _daily_click_rates(features: Path) -> list[float]:
    examples = read_examples(features)
    day = (event_time_ms(examples) - event_time_ms(examples).min()) // DAY_MS
    clicks = examples.column("label_click").to_numpy()
    return [float(clicks[day == d].mean()) for d in range(int(day.max()) + 1)]


def test_drift_raises_the_base_rates_day_by_day(
    world: tuple[Path, list[int], Path], tmp_path: Path
) -> None:
    args = argparse.Namespace(users=200, ads=40, days=5, seed=3, cuts=3, drift=0.5)
    drifted, _ = generated_origins(args, tmp_path)
    steady = _daily_click_rates(world[0])
    rates = _daily_click_rates(drifted)
    assert rates[-1] > 3 * rates[0]
    assert rates[-1] > 3 * steady[-1]


def test_each_origin_trains_on_its_past_and_is_judged_on_the_next_day(
    world: tuple[Path, list[int], Path],
) -> None:
    features, bounds, work = world
    assert np.diff(bounds).tolist() == [DAY_MS] * 3
    times = event_time_ms(read_examples(features))
    for k in range(3):
        train, validation, evals, counts = split_origin(features, bounds, k, work)
        validation_from, eval_from = bounds[k], bounds[k + 1]
        assert event_time_ms(read_examples(train)).max() < validation_from
        got = event_time_ms(read_examples(validation))
        assert validation_from <= got.min()
        assert got.max() < eval_from
        got = event_time_ms(read_examples(evals))
        assert got.min() >= eval_from
        # Each eval period is one day; what follows it is counted, not written.
        assert got.max() < eval_from + DAY_MS
        assert counts["left_out"] == int((times >= eval_from + DAY_MS).sum())
        assert sum(counts.values()) == times.size
    # The last origin's eval period runs to the end: nothing left out.
    assert counts["left_out"] == 0


def _origin(gem: float, dlrm: float) -> dict:
    def metrics(ne: float) -> dict:
        tasks = ["all/click", "all/conversion", "facebook/click"]
        return {
            "metrics": {t: {"ne": ne, "auc": 0.7, "calibration": 1.0} for t in tasks}
        }

    return {"models": {"gem": metrics(gem), "dlrm": metrics(dlrm)}}


def test_the_summary_averages_origins_and_counts_where_gem_leads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("benchmarks.bench_rolling.TASKS", ["facebook/click"])
    summary = summarize([_origin(0.80, 0.82), _origin(0.85, 0.84), _origin(0.81, 0.83)])
    assert summary["mean"]["gem"]["all/click"]["ne"] == pytest.approx(0.82)
    assert summary["mean"]["dlrm"]["all/click"]["ne"] == pytest.approx(0.83)
    assert summary["gem_ahead_on_cuts"] == {"dlrm": 2}
    assert summary["gem_lead_click_ne"]["dlrm"] == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("recipe", "extra", "expected"),
    [
        (
            "default",
            [],
            {"epochs": 8, "patience": 2, "lr_schedule": "plateau", "recalibrate": True},
        ),
        (
            "search",
            ["--no-recalibrate"],
            {
                "epochs": 2,
                "patience": 1,
                "lr_schedule": "constant",
                "recalibrate": False,
            },
        ),
    ],
)
def test_each_recipe_reaches_the_fit_of_every_origin(
    recipe: str, extra: list[str], expected: dict, tmp_path: Path
) -> None:
    """--recipe default leaves every choice to trainer.fit's defaults, on the
    origin's validation period; the search fixes its grid and a constant rate;
    both recalibrate unless told not to."""
    out = tmp_path / "rolling.json"
    argv = ["--users", "150", "--ads", "30", "--days", "3", "--cuts", "1"]
    argv += ["--models", "dlrm", "--steps", "2", "--max-seq-len", "8"]
    argv += ["--recipe", recipe, "--lrs", "2e-3", "--epochs", "2", *extra]
    argv += ["--bootstrap", "10", "--work", str(tmp_path / "w"), "--json", str(out)]
    assert main(argv) == 0
    (origin,) = json.loads(out.read_text())["origins"]
    dlrm = origin["models"]["dlrm"]
    assert {k: dlrm["recipe"][k] for k in expected} == expected
    assert dlrm["lr"] == (1e-3 if recipe == "default" else 2e-3)
    assert dlrm["recipe"]["validation"] == "given"
    assert 1 <= dlrm["epochs_run"] <= expected["epochs"]
    # Every eval impression is in one value of each slice.
    for values in json.loads(out.read_text())["slices"].values():
        assert sum(v["examples"] for v in values.values()) == origin["examples"]["eval"]
