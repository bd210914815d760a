"""The Bayes-optimal report of the generator's true probabilities."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features import vocab
from features.metrics import binary_metrics
from pipelines.sources import bayes
from pipelines.sources.synthetic import GeneratorConfig

CONFIG = GeneratorConfig(users=12000, ads=1000, days=2, seed=21)


@pytest.fixture(scope="module")
def report(dataset: Path) -> dict[str, Any]:
    return bayes.bayes_optimal_report(dataset)


def test_true_probabilities_beat_the_base_rate_in_every_domain(
    report: dict[str, Any],
) -> None:
    for domain in vocab.DOMAINS:
        click = report["by_domain"][domain]["click"]
        assert click["positives"] > 50, domain
        assert click["ne"] < 1.0, domain
        assert click["auc"] > 0.6, domain
    overall = report["overall"]
    assert overall["click"]["ne"] < 0.95
    assert overall["conversion"]["ne"] < 1.0
    assert overall["conversion"]["auc"] > 0.6


def test_true_probabilities_are_calibrated(report: dict[str, Any]) -> None:
    click = report["overall"]["click"]
    # ~1000 clicks: the calibration's sampling error is ~3%.
    assert click["positives"] > 800
    assert 0.88 < click["calibration"] < 1.12
    conversion = report["overall"]["conversion"]
    assert 0.7 < conversion["calibration"] < 1.3


def test_slices_add_up(report: dict[str, Any], dataset: Path) -> None:
    truth = pq.read_table(dataset / "truth.parquet")
    for objective in ("click", "conversion"):
        slices = [report["by_domain"][d][objective] for d in vocab.DOMAINS]
        assert sum(s["count"] for s in slices) == truth.num_rows
        overall = report["overall"][objective]
        assert sum(s["positives"] for s in slices) == overall["positives"]
        assert overall["base_rate"] == pytest.approx(
            overall["positives"] / overall["count"]
        )


def test_a_model_that_sees_the_label_beats_the_ceiling(dataset: Path) -> None:
    """The docstring's point: beating the Bayes NE means leaking labels."""
    truth = pq.read_table(dataset / "truth.parquet")
    clicked = truth.column("clicked").to_numpy()
    ceiling = binary_metrics(clicked, truth.column("p_click").to_numpy())
    leaky = binary_metrics(clicked, np.where(clicked == 1, 0.5, 0.005))
    assert leaky.ne < ceiling.ne
    assert leaky.auc > ceiling.auc


def test_empty_slices_are_nan_not_errors(tmp_path: Path) -> None:
    truth = pa.table(
        {
            "impression_id": ["a", "b", "c"],
            "domain": ["facebook", "facebook", "instagram"],
            "p_click": [0.4, 0.2, 0.3],
            "p_conversion": [0.01, 0.02, 0.03],
            "clicked": pa.array([1, 0, 0], pa.int8()),
            "converted": pa.array([0, 0, 0], pa.int8()),
        }
    )
    pq.write_table(truth, tmp_path / "truth.parquet")
    report = bayes.bayes_optimal_report(tmp_path)
    assert report["by_domain"]["messaging"]["click"]["count"] == 0
    assert math.isnan(report["by_domain"]["instagram"]["click"]["auc"])
    assert math.isnan(report["overall"]["conversion"]["ne"])
    assert report["overall"]["click"]["auc"] == 1.0


def test_cli_prints_a_table_and_json(
    dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bayes.main(["--input", str(dataset)]) == 0
    text = capsys.readouterr().out
    assert "overall" in text
    assert "messaging" in text
    assert "NE" in text
    assert bayes.main(["--input", str(dataset), "--json"]) == 0
    parsed = json.loads(capsys.readouterr().out)
    assert set(parsed["by_domain"]) == set(vocab.DOMAINS)
    assert parsed["overall"]["click"]["ne"] < 1.0


def test_cli_rejects_a_directory_without_truth(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bayes.main(["--input", str(tmp_path)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1
    assert "truth.parquet not found" in error[0]


def test_pooled_click_is_exact_for_ne_and_pair_weighted_for_auc(
    report: dict[str, Any],
) -> None:
    pooled = bayes.pooled_click(
        {d: report["by_domain"][d]["click"] for d in vocab.DOMAINS}
    )
    overall = report["overall"]["click"]
    # Pooling the domains' losses is exact: the all-domain NE, to rounding.
    assert pooled["ne"] == pytest.approx(overall["ne"], rel=1e-9)
    assert pooled["count"] == overall["count"]
    aucs = [report["by_domain"][d]["click"]["auc"] for d in vocab.DOMAINS]
    assert min(aucs) <= pooled["auc"] <= max(aucs)
