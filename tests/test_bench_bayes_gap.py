"""The references between the Bayes-optimal NE and the models: what a
model reading a window of events could reach."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import bench_bayes_gap, bench_rolling
from benchmarks.bench_bayes_gap import Impressions, references
from benchmarks.generated import world_config
from features.metrics import binary_metrics
from pipelines.sources.synthetic import generate
from pipelines.sources.synthetic.params import DAY_MS


def test_each_reference_sits_between_bayes_and_what_it_cannot_see() -> None:
    """Knowing the generator's coefficients beats learning them from one
    train period; the whole history beats a 16-event window; nothing beats
    the true probabilities."""
    config = world_config(argparse.Namespace(users=3000, ads=300, days=4, seed=2))
    rows = Impressions.of(generate(config))
    eval_from = config.start_ms + 3 * DAY_MS
    last_day = rows.time_ms >= eval_from
    bayes = binary_metrics(rows.clicked[last_day], rows.data.outcomes.p_click[last_day])
    rolling = {
        "origins": [
            {
                "eval_from_ms": eval_from,
                "models": {},
                "bayes": {"all/click": {"ne": bayes.ne}},
            }
        ]
    }
    (ne,) = references(rows, rolling, [16, 0])
    assert ne["bayes"] == bayes.ne
    assert ne["bayes"] < ne["information, 16 events"] < ne["specified, 16 events"] < 1
    assert ne["information, all events"] < ne["information, 16 events"]


def test_it_reads_a_rolling_run_and_refuses_another_world(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rolling = tmp_path / "rolling.json"
    argv = ["--users", "150", "--ads", "30", "--days", "3", "--cuts", "1"]
    argv += ["--models", "dlrm", "--recipe", "default", "--steps", "2"]
    argv += ["--max-seq-len", "8", "--bootstrap", "10"]
    argv += ["--work", str(tmp_path / "w"), "--json", str(rolling)]
    assert bench_rolling.main(argv) == 0
    out = tmp_path / "gap.json"
    argv = ["--rolling", str(rolling), "--windows", "8", "--json", str(out)]
    assert bench_bayes_gap.main(argv) == 0
    report = json.loads(out.read_text())
    (ne,) = report["origins"]
    (origin,) = json.loads(rolling.read_text())["origins"]
    assert ne["dlrm"] == origin["models"]["dlrm"]["metrics"]["all/click"]["ne"]
    assert set(ne) == {"bayes", "information, 8 events", "specified, 8 events", "dlrm"}
    assert report["gap_shares"]["dlrm"] == 0.0
    assert report["gap_shares"]["bayes"] == 1.0
    assert "| specified, 8 events |" in capsys.readouterr().out

    another = json.loads(rolling.read_text())
    another["args"]["seed"] = "1"
    rolling.write_text(json.dumps(another))
    with pytest.raises(SystemExit, match="not the rolling run's"):
        bench_bayes_gap.main(["--rolling", str(rolling)])
