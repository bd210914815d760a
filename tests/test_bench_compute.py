"""The compute benchmark's curves on a small generated world."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from benchmarks.bench_compute import NEVER, main, pays_table, where_gem_pays

BUDGETS = [0.05, 0.1, 0.2]
MODELS = ["gem", "dlrm", "dcnv2"]


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run: 300 users over 3 days (clicks on every period), a few steps."""
    work = tmp_path_factory.mktemp("compute")
    out = work / "compute.json"
    argv = ["--users", "300", "--ads", "40", "--days", "3", "--seed", "1"]
    argv += ["--budgets", ",".join(map(str, BUDGETS)), "--batch-size", "64"]
    argv += ["--models", ",".join(MODELS), "--work", str(work / "w")]
    argv += ["--json", str(out), "--plot", str(work / "curves.png")]
    assert main(argv) == 0
    assert (work / "curves.png").stat().st_size > 0
    return json.loads(out.read_text())


def test_every_model_has_a_point_per_budget(result: dict[str, Any]) -> None:
    assert list(result["models"]) == MODELS
    for curve in result["models"].values():
        assert [p["budget_epochs"] for p in curve["points"]] == BUDGETS
        for p in curve["points"]:
            assert {"ne", "auc", "calibration"} <= p["eval"]["click"].keys()


def test_flops_and_cpu_seconds_grow_with_the_budget(result: dict[str, Any]) -> None:
    for curve in result["models"].values():
        for a, b in itertools.pairwise(curve["points"]):
            assert b["examples"] > a["examples"]
            assert b["train_gflops"] > a["train_gflops"]
            assert b["cpu_s"] > a["cpu_s"]
            assert b["wall_s"] > a["wall_s"]


def test_gem_costs_more_flops_per_example_than_dlrm(result: dict[str, Any]) -> None:
    flops = {k: v["train_flops_per_example"] for k, v in result["models"].items()}
    assert flops["gem"] > flops["dlrm"] > 0


def _curve(*points: tuple[float, float]) -> dict[str, Any]:
    """A model's curve from (click NE, CPU s) points, one budget each."""
    return {
        "points": [
            {
                "budget_epochs": i + 1,
                "train_gflops": cpu,
                "cpu_s": cpu,
                "eval": {"click": {"ne": ne}},
            }
            for i, (ne, cpu) in enumerate(points)
        ]
    }


def test_gem_pays_where_the_peer_needs_more_or_never_gets_there() -> None:
    rows = where_gem_pays(
        {
            "gem": _curve((0.95, 10.0), (0.90, 20.0)),
            "dlrm": _curve((0.96, 2.0), (0.94, 12.0), (0.93, 30.0)),
        }
    )
    first, second = (row["peers"]["dlrm"] for row in rows)
    assert first["reached_at"]["cpu_s"] == 12.0
    assert first["gem_pays"]
    assert second["reached_at"] is None
    assert second["gem_pays"]
    assert NEVER in pays_table(rows)
    cheap = where_gem_pays({"gem": _curve((0.95, 10.0)), "dlrm": _curve((0.95, 3.0))})
    assert not cheap[0]["peers"]["dlrm"]["gem_pays"]
