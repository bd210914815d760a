"""bench_quality over several training seeds: choice, means, pairing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import quality_seeds
from benchmarks.bench_quality import bootstrap_vs_gem

N = 4_000


def _labels() -> np.ndarray:
    rng = np.random.default_rng(0)
    return (rng.random(N) < 0.1).astype(np.float32)


def _save(
    root: Path,
    seed: int,
    label: str,
    lr: float,
    validation: list[float],
    click_ne: float,
    probs: np.ndarray,
) -> None:
    """One saved run as run_models writes it (``LABEL@lrR.json`` + ``.npz``)."""
    metrics = {"ne": click_ne, "auc": 0.7, "calibration": 1.0, "count": N}
    report = {
        "config": {"fit": {"lr": lr}},
        "train": {
            "epoch_validation_click_ne": validation,
            "examples_per_s": 100.0 + seed,
            "selected_epoch": int(np.argmin(validation)),
        },
        "overall": {"click": dict(metrics), "conversion": dict(metrics)},
        "by_task": {"facebook/click": dict(metrics, ne=click_ne + 0.01)},
    }
    d = quality_seeds.seed_dir(root, seed)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{label}@lr{lr:g}.json").write_text(json.dumps(report))
    labels = np.stack([_labels(), _labels()], 1)
    np.savez(d / f"{label}@lr{lr:g}.npz", labels=labels, probs=np.stack([probs] * 2, 1))


def test_rate_is_chosen_on_the_mean_over_seeds(tmp_path: Path) -> None:
    flat = np.full(N, 0.1)
    # Seed 0 alone would keep 1e-3 (0.90 < 0.91); over both seeds 2e-3 wins
    # (mean 0.91 against 0.925).
    _save(tmp_path, 0, "dlrm", 1e-3, [0.92, 0.90], 0.95, flat)
    _save(tmp_path, 1, "dlrm", 1e-3, [0.95], 0.97, flat)
    _save(tmp_path, 0, "dlrm", 2e-3, [0.91], 0.94, flat + 0.01)
    _save(tmp_path, 1, "dlrm", 2e-3, [0.93, 0.91], 0.96, flat + 0.02)
    # A rate run on one seed only does not compete.
    _save(tmp_path, 0, "dlrm", 4e-3, [0.50], 0.50, flat)

    found = quality_seeds.select_across_seeds(tmp_path, [0, 1], "dlrm")
    assert found is not None
    reports, predictions, grid = found
    assert grid == pytest.approx({"0.001": 0.925, "0.002": 0.91})
    assert [r["config"]["fit"]["lr"] for r in reports] == [2e-3, 2e-3]
    assert predictions[1]["probs"][0, 0] == pytest.approx(0.12)

    mean = quality_seeds.mean_report(reports, grid)
    assert mean["per_seed_click_ne"] == [0.94, 0.96]
    assert mean["overall"]["click"]["ne"] == pytest.approx(0.95)
    assert mean["by_task"]["facebook/click"]["ne"] == pytest.approx(0.96)
    assert mean["overall"]["click"]["count"] == N
    assert mean["per_seed_selected_epoch"] == [0, 1]
    assert mean["selected_lr"] == 2e-3


def test_a_model_missing_a_seed_is_left_out(tmp_path: Path) -> None:
    flat = np.full(N, 0.1)
    for seed in (0, 1):
        _save(tmp_path, seed, "gem", 2e-3, [0.88], 0.88 + seed / 100, flat)
    _save(tmp_path, 0, "dcnv2", 2e-3, [0.90], 0.90, flat)
    reports, predictions = quality_seeds.combine(
        tmp_path, [0, 1], ["gem", "dcnv2", "dlrm"]
    )
    assert list(reports) == ["gem"]
    assert len(predictions["gem"]) == 2


def test_pairing_is_per_seed() -> None:
    def report(per_seed: list[float]) -> dict:
        return {"per_seed_click_ne": per_seed}

    paired = quality_seeds.paired_by_seed(
        {
            "gem": report([0.88, 0.90, 0.86]),
            "gem_no_pyramid": report([0.89, 0.89, 0.87]),
        }
    )
    p = paired["gem_no_pyramid"]
    assert p["per_seed"] == pytest.approx([0.01, -0.01, 0.01])
    assert p["mean"] == pytest.approx(0.01 / 3)
    assert (p["reference_better"], p["seeds"]) == (2, 3)


def test_bootstrap_over_seeds_compares_seed_means() -> None:
    rng = np.random.default_rng(1)
    truth = rng.uniform(0.02, 0.3, N)
    labels = (rng.random(N) < truth).astype(np.float32)

    def run(p: np.ndarray) -> dict[str, np.ndarray]:
        return {"labels": np.stack([labels, labels], 1), "probs": np.stack([p, p], 1)}

    noisy = np.clip(truth * rng.uniform(0.7, 1.3, N), 0.01, 0.99)
    flat = np.full(N, labels.mean())
    out = bootstrap_vs_gem(
        {
            "gem": [run(truth), run(noisy)],
            # GEM's two runs in the other order: the same seed mean exactly.
            "swapped": [run(noisy), run(truth)],
            "dlrm": [run(flat), run(flat)],
        },
        bayes_probs=truth,
        resamples=200,
    )
    assert out["swapped"]["lo"] == pytest.approx(0.0, abs=1e-12)
    assert out["swapped"]["hi"] == pytest.approx(0.0, abs=1e-12)
    assert out["dlrm"]["lo"] > 0
    # One of GEM's runs is Bayes itself, the other is not: less than all
    # of the gap, more than none.
    assert 0.5 < out["gap_closed"]["mean"] < 1.0


def test_cli_trains_every_seed_and_combines_them(tmp_path: Path) -> None:
    """``--seeds`` end to end on a tiny generated world: each seed is a real
    training run (seed 0 reproduces a plain ``--seed 0`` run), and
    ``--combine`` tabulates the saved runs to the same figures."""
    from benchmarks.bench_quality import main

    common = [
        "--section", "generated", "--users", "300", "--ads", "40", "--days", "3",
        "--epochs", "1", "--steps", "2", "--batch-size", "64", "--max-seq-len", "8",
        "--validation-sample", "600", "--models", "gem,dlrm", "--device", "cpu",
        "--bootstrap", "50", "--work", str(tmp_path / "w"),
    ]  # fmt: skip
    assert main([*common, "--seeds", "0,1", "--json", str(tmp_path / "a.json")]) == 0
    trained = json.loads((tmp_path / "a.json").read_text())["generated"]
    gem, dlrm = trained["models"]["gem"], trained["models"]["dlrm"]
    assert len(gem["per_seed_click_ne"]) == 2
    assert gem["per_seed_click_ne"][0] != gem["per_seed_click_ne"][1]
    assert gem["overall"]["click"]["ne"] == pytest.approx(
        np.mean(gem["per_seed_click_ne"])
    )
    paired = trained["paired_by_seed"]["dlrm"]
    assert paired["per_seed"] == pytest.approx(
        np.subtract(dlrm["per_seed_click_ne"], gem["per_seed_click_ne"])
    )
    assert len(trained["gap_closed_by_seed"]) == 2
    assert set(trained["bootstrap"]) >= {"dlrm", "gap_closed"}

    args = [*common, "--reuse", "--json", str(tmp_path / "b.json")]
    assert main([*args, "--seeds", "0,1", "--combine"]) == 0
    combined = json.loads((tmp_path / "b.json").read_text())["generated"]
    assert combined["models"] == trained["models"]
    assert combined["bootstrap"] == trained["bootstrap"]

    assert main([*args, "--seed", "0"]) == 0
    alone = json.loads((tmp_path / "b.json").read_text())["generated"]["models"]
    assert alone["gem"]["overall"]["click"]["ne"] == gem["per_seed_click_ne"][0]
