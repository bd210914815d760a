"""How much of the gap to the Bayes-optimal NE a model could close at all.

The Bayes-optimal NE of a generated world (:mod:`pipelines.sources.bayes`)
scores the true click probabilities, which depend on latent variables no
model reads: each user's interests ``theta_u`` and each ad's quality ``q_a``.
A model reads a user's last ``max_seq_len`` events and learns from one train
period. This benchmark puts two references between the Bayes-optimal NE and
the models of a :mod:`benchmarks.bench_rolling` run, on that run's world and
origins (the same train, validation and eval days):

- **information**: the generator's own click model with its true
  coefficients, knowing each ad's true topic, but with ``theta_u[topic]``
  learnt as a function of its Dirichlet posterior mean given the topics of
  the user's organic events in the window, the recent term counted inside
  the window, and ``q_a`` the posterior mode given the train period's
  clicks. What the window and one train period leave of the information.
- **specified**: a logistic regression with exactly the generator's terms,
  built from what a model can observe (the ad's declared category, not its
  true topic): domain x format, age bucket x category, device x format, the
  hour of day, the recent same-category count and the posterior interest,
  each fitted on the origin's train period, with one effect per ad under the
  generator's quality prior. What a correctly specified model learns from
  that much data: a model that must find the form itself should not expect
  more.

Both fit on the train period only (days before the origin's validation
day), as the rolling benchmark's models do. Printed per origin and on
average: click NE of the Bayes-optimal predictor, of each reference at each
window, of each model of the rolling run, and the share of the DLRM -> Bayes
gap each closes (on the mean NEs).

Usage::

    python -m benchmarks.bench_bayes_gap --rolling F.json [--windows 32,128,0]
        [--json OUT]

``F.json`` is ``bench_rolling --section generated --json F.json``'s report;
window 0 is the whole history.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.generated import world_config
from benchmarks.quality_components import (
    EVENT_WEIGHT,
    click_terms,
    organic_counts_in_window,
)
from features.metrics import binary_metrics
from pipelines.sources.synthetic import Generated, generate
from pipelines.sources.synthetic.outcomes import FORMAT_DOMAIN_CLICK
from pipelines.sources.synthetic.params import DAY_MS, HOUR_MS, K_TOPICS

# Knots of the piecewise-linear map from the posterior interest to its logit
# effect: E[sigmoid(z + 2.5 theta)] is not a linear function of E[theta].
INTEREST_KNOTS = (0.05, 0.1, 0.2, 0.4)
N_FORMATS = int(FORMAT_DOMAIN_CLICK.shape[0])
# The click terms the information reference infers instead of being told.
LEARNT_TERMS = ("interest", "recent", "ad quality")


@dataclass(frozen=True)
class Impressions:
    """One row per impression of a regenerated world: outcome, time, the
    generator's terms and what a model observes."""

    data: Generated
    clicked: np.ndarray
    time_ms: np.ndarray
    ad: np.ndarray
    true_topic: np.ndarray
    declared_category: np.ndarray
    # The true logit without its LEARNT_TERMS.
    known_logit: np.ndarray

    @classmethod
    def of(cls, data: Generated) -> Impressions:
        """The impressions of ``data``, in the generator's row order."""
        world, base = data.world, data.base
        imp = data.outcomes.impression
        ad = base.ad[imp]
        terms = click_terms(data)
        return cls(
            data=data,
            clicked=data.outcomes.clicked.astype(np.float64),
            time_ms=base.time_ms[imp],
            ad=ad,
            true_topic=world.ads.topic[ad],
            declared_category=world.ads.creative_category[ad],
            known_logit=sum(v for k, v in terms.items() if k not in LEARNT_TERMS),
        )

    def interest_features(self, topics: np.ndarray, window: int | None) -> np.ndarray:
        """The posterior mean of ``theta_u[topic]`` from the window's organic
        events, in piecewise-linear pieces, alone and times log1p(events)."""
        p, world = self.data.config.params, self.data.world
        same, every = organic_counts_in_window(
            self.data.base, self.data.outcomes.impression, topics, window
        )
        alpha = p.interest_concentration * world.topic_popularity
        mean = (alpha[topics] + EVENT_WEIGHT * same) / (
            p.interest_concentration + EVENT_WEIGHT * every
        )
        pieces = np.stack(
            [mean, *(np.maximum(mean - k, 0.0) for k in INTEREST_KNOTS)], axis=1
        )
        return np.concatenate([pieces, pieces * np.log1p(every)[:, None]], axis=1)

    def recent_count(self, topics: np.ndarray, window: int | None) -> np.ndarray:
        """Organic same-topic events in the generator's recent span, inside
        the window."""
        span = self.data.config.params.recent_window_ms
        same, _ = organic_counts_in_window(
            self.data.base, self.data.outcomes.impression, topics, window, span
        )
        return same

    def observed_terms(self, window: int | None) -> np.ndarray:
        """The specified model's columns: the generator's terms from
        observables (the declared category in place of the true topic)."""
        world, base = self.data.world, self.data.base
        imp = self.data.outcomes.impression
        user, category = base.user[imp], self.declared_category
        fmt = world.ads.ad_format[self.ad]
        domain = base.domain[imp].astype(np.int64)
        hour = 2 * np.pi * ((self.time_ms // HOUR_MS) % 24) / 24
        age, device = world.users.age_bucket[user], world.users.device[user]
        columns = [
            _one_hot(domain * N_FORMATS + fmt),
            _one_hot(age * K_TOPICS + category)[:, 1:],
            _one_hot(device * N_FORMATS + fmt)[:, 1:],
            np.stack(
                [
                    np.cos(hour),
                    np.sin(hour),
                    np.log1p(self.recent_count(category, window)),
                ],
                axis=1,
            ),
            self.interest_features(category, window),
        ]
        return np.concatenate(columns, axis=1)


def _one_hot(codes: np.ndarray) -> np.ndarray:
    """Indicator columns of the codes that occur."""
    _, index = np.unique(codes, return_inverse=True)
    out = np.zeros((codes.size, int(index.max()) + 1))
    out[np.arange(codes.size), index] = 1.0
    return out


def fit_logistic(
    x: np.ndarray, offset: np.ndarray, y: np.ndarray, ridge: float, steps: int = 15
) -> np.ndarray:
    """Coefficients of a logistic regression with a fixed offset (Newton)."""
    coef = np.zeros(x.shape[1])
    penalty = ridge * np.eye(x.shape[1])
    for _ in range(steps):
        prob = 1.0 / (1.0 + np.exp(-(offset + x @ coef)))
        gradient = x.T @ (prob - y) + penalty @ coef
        hessian = (x * (prob * (1.0 - prob))[:, None]).T @ x + penalty
        coef -= np.linalg.solve(hessian, gradient)
    return coef


def fit_ad_effects(
    offset: np.ndarray, y: np.ndarray, ad: np.ndarray, n_ads: int, prior_var: float
) -> np.ndarray:
    """Each ad's effect: the posterior mode under a N(0, prior_var) prior."""
    effect = np.zeros(n_ads)
    for _ in range(20):
        prob = 1.0 / (1.0 + np.exp(-(offset + effect[ad])))
        gradient = np.bincount(ad, prob - y, minlength=n_ads) + effect / prior_var
        curvature = np.bincount(ad, prob * (1 - prob), minlength=n_ads) + 1 / prior_var
        effect -= gradient / curvature
    return effect


def fit_with_ad_effects(
    x: np.ndarray, offset: np.ndarray, rows: Impressions, train: np.ndarray
) -> np.ndarray:
    """Logits of a logistic regression on ``x`` plus one effect per ad, both
    fitted on the ``train`` rows (alternating), for every row."""
    data = rows.data
    prior_var = data.config.params.click_quality**2 * float(
        data.world.ads.quality.var()
    )
    n_ads = data.world.ads.quality.size
    effect = np.zeros(n_ads)
    for _ in range(4):
        coef = fit_logistic(
            x[train], offset[train] + effect[rows.ad[train]], rows.clicked[train], 1.0
        )
        logit = offset + x @ coef
        effect = fit_ad_effects(
            logit[train], rows.clicked[train], rows.ad[train], n_ads, prior_var
        )
    return offset + x @ coef + effect[rows.ad]


def reference_inputs(
    rows: Impressions, window: int | None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each reference's columns and fixed offset at one window: functions of
    the history only, the same for every origin."""
    p = rows.data.config.params
    recent = rows.recent_count(rows.true_topic, window)
    return {
        "information": (
            rows.interest_features(rows.true_topic, window),
            rows.known_logit + p.click_recent * np.log1p(recent),
        ),
        "specified": (rows.observed_terms(window), np.zeros(rows.clicked.size)),
    }


def click_ne(rows: Impressions, logit: np.ndarray, mask: np.ndarray) -> float:
    """Click NE of the logits on the masked rows."""
    return binary_metrics(rows.clicked[mask], 1.0 / (1.0 + np.exp(-logit[mask]))).ne


def origin_bounds(rolling: dict[str, Any]) -> list[tuple[int, int]]:
    """(eval start, eval end) of every origin; the last runs to the end."""
    starts = [int(o["eval_from_ms"]) for o in rolling["origins"]]
    return list(zip(starts, [*starts[1:], 2**62], strict=True))


def references(
    rows: Impressions, rolling: dict[str, Any], windows: Sequence[int]
) -> list[dict[str, float]]:
    """Click NE per origin: Bayes, each reference at each window, each model."""
    true_logit = np.log(rows.data.outcomes.p_click / (1 - rows.data.outcomes.p_click))
    inputs = {window: reference_inputs(rows, window or None) for window in windows}
    table = []
    for origin, (start, end) in zip(
        rolling["origins"], origin_bounds(rolling), strict=True
    ):
        train = rows.time_ms < start - DAY_MS  # before the validation day
        evaluated = (rows.time_ms >= start) & (rows.time_ms < end)
        ne = {"bayes": click_ne(rows, true_logit, evaluated)}
        reported = origin["bayes"]["all/click"]["ne"]
        if not math.isclose(ne["bayes"], reported, abs_tol=1e-6):
            raise SystemExit(
                f"the regenerated world is not the rolling run's: Bayes NE "
                f"{ne['bayes']:.6f} against {reported:.6f}"
            )
        for window, by_reference in inputs.items():
            for name, (x, offset) in by_reference.items():
                logit = fit_with_ad_effects(x, offset, rows, train)
                ne[f"{name}, {window or 'all'} events"] = click_ne(
                    rows, logit, evaluated
                )
        for model, report in origin["models"].items():
            ne[model] = report["metrics"]["all/click"]["ne"]
        table.append(ne)
    return table


def gap_shares(table: list[dict[str, float]]) -> dict[str, float]:
    """(NE_dlrm - NE_x) / (NE_dlrm - NE_bayes) on the mean NEs, per row."""
    mean = {k: float(np.mean([row[k] for row in table])) for k in table[0]}
    if "dlrm" not in mean:
        return {}
    gap = mean["dlrm"] - mean["bayes"]
    return {k: (mean["dlrm"] - v) / gap for k, v in mean.items()}


def print_table(table: list[dict[str, float]], shares: dict[str, float]) -> None:
    """One line per predictor: NE per origin, mean NE, share of the gap."""
    origins = " | ".join(f"origin {k}" for k in range(len(table)))
    print(f"| click NE | {origins} | mean | share of the DLRM -> Bayes gap |")
    print("|---|" + "---:|" * (len(table) + 2))
    for name in table[0]:
        values = [row[name] for row in table]
        share = f"{shares[name]:.2f}" if name in shares else ""
        cells = " | ".join(f"{v:.4f}" for v in values)
        print(f"| {name} | {cells} | {np.mean(values):.4f} | {share} |")


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rolling", type=Path, required=True, help="bench_rolling's JSON")
    p.add_argument("--windows", default="32,128,0", help="events read; 0: all")
    p.add_argument("--json", type=Path, default=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    args = parser().parse_args(argv)
    rolling = json.loads(args.rolling.read_text())
    run = rolling["args"]
    if run["section"] != "generated":
        raise SystemExit(f"{args.rolling}: a --section generated run is needed")
    if float(run.get("drift", 0.0)):
        raise SystemExit(f"{args.rolling}: worlds with --drift are not modelled here")
    world = argparse.Namespace(
        users=int(run["users"]),
        ads=int(run["ads"]),
        days=int(run["days"]),
        seed=int(run["seed"]),
    )
    rows = Impressions.of(generate(world_config(world)))
    windows = [int(w) for w in args.windows.split(",")]
    table = references(rows, rolling, windows)
    shares = gap_shares(table)
    print_table(table, shares)
    if args.json is not None:
        args.json.write_text(
            json.dumps({"origins": table, "gap_shares": shares}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
