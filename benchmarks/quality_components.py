"""Which parts of the generator's true click logit does each model capture?

The generated world's click logit is a sum of known terms
(:func:`pipelines.sources.synthetic.outcomes.simulate_outcomes`): the domain x format
intercept, long-term interest ``2.5 theta_u[topic]``, recent same-topic
activity ``0.8 log1p(recent)``, ad quality, age x category, device x format
and an hour-of-day wave. Regressing a model's eval-period click logits on
those terms (least squares, with an intercept) says how much of each the model
has learned: a coefficient of 1 is the Bayes predictor's, 0 means the model
ignores the term. This is the "why" behind an NE gap: which signal a model
misses, not only by how much.

After the table, a **history oracle**: the Bayes predictor with one term
replaced, ``theta_u[topic]`` estimated from what a sequence model could see:
the user's organic events before the impression (all of them, or only those
among the last 128 / 32 events of any kind, as ``max_seq_len`` truncates),
as a Dirichlet posterior mean under the generator's own prior, each event
counted as a quarter of an independent draw because a session's events share
its intent topic. It knows the ad's true topic (the declared category is
right 85 % of the time), so it is an upper bound. Its NE says how much of the
gap to Bayes a history of that length can close; its interest coefficient
(the same regression as the table's) is what a model could capture; with the
prior mean alone, what the interest term is worth.

The terms are recomputed by re-running the generator from the manifest's
arguments (deterministic, seconds at the benchmark's size); rows are matched
to the eval examples through the impression ids.

Usage::

    python -m benchmarks.quality_components --work W [--models gem,dlrm,...]

``W`` is a :mod:`benchmarks.bench_quality` work dir whose ``gen_models`` holds
saved runs (``LABEL@lrR.npz`` eval predictions, written with ``--reuse``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from features.metrics import binary_metrics
from pipelines.sources.synthetic import Generated, GeneratorConfig, generate
from pipelines.sources.synthetic.assemble import time_order
from pipelines.sources.synthetic.outcomes import FORMAT_DOMAIN_CLICK, HOUR_MS
from pipelines.sources.synthetic.params import K_TOPICS
from pipelines.sources.synthetic.timelines import BaseEvents
from trainer.data.feature_output import read_examples

# The manifest arguments that are GeneratorConfig fields.
_CONFIG_FIELDS = ("users", "ads", "days", "seed", "events_per_user_day", "contents")
# Weight of one organic event in the history oracle's posterior: events of a
# session share its intent topic, so they are not independent draws from
# theta_u. Of the weights 1, 0.5, 0.25 and 0.1, this one gives the estimate
# closest to theta_u on the train days of the benchmark's world.
EVENT_WEIGHT = 0.25
# History windows (events of any kind) the oracle is scored at; None: all.
ORACLE_WINDOWS = (None, 128, 32)


def organic_counts_in_window(
    events: BaseEvents,
    rows: np.ndarray,
    topics: np.ndarray,
    window: int | None,
    within_ms: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(same-topic, all) organic events of each row's user before its time.

    ``window``: only among the user's last ``window`` events of any kind
    (what a model truncating histories to ``max_seq_len`` keeps); None: all.
    ``within_ms``: only those less than that long before the row. Vectorized
    as ``searchsorted`` on (user, time) and (user, topic, time) keys packed
    into int64.
    """
    t0 = int(events.time_ms.min())
    span = int(events.time_ms.max()) - t0 + 1
    user = events.user.astype(np.int64)
    time = events.time_ms - t0
    every = np.sort(user * span + time)
    row_user, row_time = user[rows] * span, time[rows]
    end = np.searchsorted(every, row_user + row_time)
    first = np.searchsorted(every, row_user)
    begin = first if window is None else np.maximum(end - window, first)
    # The window's oldest event time (the row's own time for an empty one).
    since = np.where(
        begin < end, every[np.minimum(begin, every.size - 1)] - row_user, row_time
    )
    if within_ms is not None:
        since = np.maximum(since, row_time - within_ms)
    organic = np.flatnonzero(events.content >= 0)
    by_user = np.sort(user[organic] * span + time[organic])
    n_all = np.searchsorted(by_user, row_user + row_time) - np.searchsorted(
        by_user, row_user + since
    )
    topic_key = (user[organic] * K_TOPICS + events.topic[organic]) * span
    by_topic = np.sort(topic_key + time[organic])
    row_topic = (user[rows] * K_TOPICS + topics) * span
    n_same = np.searchsorted(by_topic, row_topic + row_time) - np.searchsorted(
        by_topic, row_topic + since
    )
    return n_same, n_all


def click_terms(data: Generated) -> dict[str, np.ndarray]:
    """The terms of the generator's click logit by name, one value per
    impression in ``data.outcomes.impression`` order; they sum to the logit
    of ``p_click`` (without drift)."""
    p, world, base, out = data.config.params, data.world, data.base, data.outcomes
    imp = out.impression
    user, ad = base.user[imp], base.ad[imp]
    domain = base.domain[imp].astype(np.int64)
    topic, fmt = world.ads.topic[ad], world.ads.ad_format[ad]
    hour = (base.time_ms[imp] // HOUR_MS) % 24
    return {
        "domain x format": np.asarray(p.click_base_logit)[domain]
        + FORMAT_DOMAIN_CLICK[fmt, domain],
        "interest": p.click_interest * world.users.theta[user, topic],
        "recent": p.click_recent * np.log1p(out.recent),
        "ad quality": p.click_quality * world.ads.quality[ad],
        "age x category": world.click_age_category[world.users.age_bucket[user], topic],
        "device x format": world.click_device_format[world.users.device[user], fmt],
        "hour": p.click_hour_amplitude * np.cos(2 * np.pi * (hour - 21) / 24),
    }


def true_click_terms(
    gen_dir: Path,
) -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
    """Term names, (impressions, terms) values, impression ids, and the
    history oracle's (impressions, 2 + windows) columns: clicked, the
    interest estimated per :data:`ORACLE_WINDOWS`, the interest prior; all
    in truth order."""
    manifest = json.loads((gen_dir / "manifest.json").read_text())
    args = manifest["arguments"]
    config = GeneratorConfig(
        **{k: args[k] for k in _CONFIG_FIELDS},
        start=dt.date.fromisoformat(args["start"]),
        duplicate_rate=args["duplicate_rate"],
    )
    data = generate(config)
    p, world, base, out = config.params, data.world, data.base, data.outcomes
    imp = out.impression
    topic = world.ads.topic[base.ad[imp]]
    # The history oracle's interest: a posterior mean from the user's past.
    alpha = p.interest_concentration * world.topic_popularity
    oracle = {"clicked": out.clicked.astype(np.float64)}
    for window in ORACLE_WINDOWS:
        same, every = organic_counts_in_window(base, imp, topic, window)
        oracle[f"interest from history, window {window}"] = (
            p.click_interest
            * (alpha[topic] + EVENT_WEIGHT * same)
            / (p.interest_concentration + EVENT_WEIGHT * every)
        )
    oracle["interest prior"] = (
        p.click_interest * alpha[topic] / p.interest_concentration
    )
    terms = click_terms(data)
    # The truth table lists impressions in time order (assemble.build_tables).
    number = np.empty(base.time_ms.size, dtype=np.int64)
    number[time_order(base.time_ms)] = np.arange(base.time_ms.size)
    by_time = np.argsort(number[imp])
    values = np.stack([v[by_time] for v in terms.values()], axis=1)
    oracle_values = np.stack([v[by_time] for v in oracle.values()], axis=1)
    truth = pq.read_table(
        gen_dir / "truth.parquet", columns=["impression_id", "p_click"]
    )
    if not np.allclose(truth.column("p_click").to_numpy(), out.p_click[by_time]):
        raise ValueError(f"{gen_dir}: the regenerated world differs from its truth")
    ids = truth.column("impression_id").to_pylist()
    return list(terms), values, ids, oracle_values


def capture(logits: np.ndarray, terms: np.ndarray) -> tuple[np.ndarray, float]:
    """Least-squares coefficients of ``logits`` on ``terms`` (+ intercept), R²."""
    design = np.c_[terms, np.ones(len(terms))]
    coef, *_ = np.linalg.lstsq(design, logits, rcond=None)
    residual = logits - design @ coef
    return coef[:-1], float(1.0 - residual.var() / logits.var())


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--models", default=None, help="labels; default: all saved")
    args = parser.parse_args(argv)
    names, terms, ids, oracle = true_click_terms(args.work / "gen")
    row_of = {k: i for i, k in enumerate(ids)}
    eval_ids = read_examples(args.work / "gen_eval").column("example_id").to_pylist()
    rows = np.array([row_of[k] for k in eval_ids])
    terms, oracle = terms[rows], oracle[rows]
    runs = sorted((args.work / "gen_models").glob("*.npz"))
    if args.models:
        wanted = set(args.models.split(","))
        runs = [r for r in runs if r.stem.split("@")[0] in wanted]
    truth = terms.sum(axis=1)
    print("| model | " + " | ".join(names) + " | R² | corr with true logit |")
    print("|---|" + "---:|" * (len(names) + 2))
    print("| Bayes | " + " | ".join("1.00" for _ in names) + " | 1.00 | 1.00 |")
    for run in runs:
        with np.load(run) as saved:
            p = np.clip(saved["probs"][:, 0], 1e-7, 1 - 1e-7)
        logits = np.log(p / (1 - p))
        coef, r2 = capture(logits, terms)
        corr = float(np.corrcoef(logits, truth)[0, 1])
        cells = " | ".join(f"{c:.2f}" for c in coef)
        print(f"| {run.stem} | {cells} | {r2:.2f} | {corr:.2f} |")
    spread = " | ".join(f"{s:.2f}" for s in terms.std(axis=0))
    print(f"| term sd on eval | {spread} | | |")
    print_history_oracle(names, terms, oracle)
    return 0


def print_history_oracle(
    names: list[str], terms: np.ndarray, oracle: np.ndarray
) -> None:
    """Click NE of the Bayes logit with its interest term replaced."""
    clicked, *from_history, prior = oracle.T
    interest = terms[:, names.index("interest")]
    truth = terms.sum(axis=1)

    def ne(logit: np.ndarray) -> float:
        return binary_metrics(clicked, 1.0 / (1.0 + np.exp(-logit))).ne

    print(f"\nclick NE on eval: Bayes {ne(truth):.4f}")
    for window, estimate in zip(ORACLE_WINDOWS, from_history, strict=True):
        seen = "all" if window is None else f"the last {window}"
        logit = truth - interest + estimate
        captured = capture(logit, terms)[0][names.index("interest")]
        print(
            f"history oracle, interest from {seen} events: {ne(logit):.4f} "
            f"(interest captured {captured:.2f}, as in the table; estimate vs "
            f"true term: correlation {np.corrcoef(estimate, interest)[0, 1]:.2f})"
        )
    print(f"interest at its prior mean: {ne(truth - interest + prior):.4f}")


if __name__ == "__main__":
    raise SystemExit(main())
