"""The generator's drift option (the freshness scenario): off by default and
exactly the configured logit shift per day when on."""

from __future__ import annotations

import numpy as np

from pipelines import generate as generate_cli
from pipelines.sources.synthetic import GeneratorConfig, ModelParams, generate
from pipelines.sources.synthetic.params import DAY_MS

BASE = {"users": 150, "ads": 30, "days": 3, "seed": 5}


def test_drift_off_by_default_and_zero_drift_changes_nothing() -> None:
    default = generate(GeneratorConfig(**BASE))
    zero = generate(
        GeneratorConfig(
            **BASE, params=ModelParams(base_logit_drift_per_day=(0.0, 0.0, 0.0))
        )
    )
    assert default.events.equals(zero.events)
    assert default.truth.equals(zero.truth)
    args = generate_cli.build_parser().parse_args(
        ["--users", "1", "--ads", "1", "--days", "1"]
    )
    assert generate_cli.config_from_args(args).params == ModelParams()


def test_drift_shifts_every_true_logit_by_rate_times_days() -> None:
    rate = (0.2, 0.1, 0.3)
    base = generate(GeneratorConfig(**BASE))
    drifted = generate(
        GeneratorConfig(**BASE, params=ModelParams(base_logit_drift_per_day=rate))
    )
    # No extra random draws: the same impressions, only probabilities moved.
    imp = base.outcomes.impression
    assert np.array_equal(imp, drifted.outcomes.impression)
    days = (base.base.time_ms[imp] - base.config.start_ms) / DAY_MS
    shift = np.asarray(rate)[base.base.domain[imp].astype(np.int64)] * days

    def logit(p: np.ndarray) -> np.ndarray:
        return np.log(p) - np.log1p(-p)

    got = logit(drifted.outcomes.p_click) - logit(base.outcomes.p_click)
    assert np.allclose(got, shift, atol=1e-6)
    got = logit(drifted.outcomes.p_cvr) - logit(base.outcomes.p_cvr)
    assert np.allclose(got, shift, atol=1e-6)
    assert days.max() > 2  # the last day really moved by ~2-3 days' drift


def test_generate_cli_flag_sets_the_drift() -> None:
    args = generate_cli.build_parser().parse_args(
        ["--users", "1", "--ads", "1", "--days", "1", "--drift-per-day", "0.15"]
    )
    params = generate_cli.config_from_args(args).params
    assert params.base_logit_drift_per_day == (0.15, 0.15, 0.15)
