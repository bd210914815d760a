"""Which parts of the generator's true click logit does each model capture?

The generated world's click logit is a sum of known terms
(:func:`pipelines.synthetic.outcomes.simulate_outcomes`): the domain x format
intercept, long-term interest ``2.5 theta_u[topic]``, recent same-topic
activity ``0.8 log1p(recent)``, ad quality, age x category, device x format
and an hour-of-day wave. Regressing a model's eval-period click logits on
those terms (least squares, with an intercept) says how much of each the model
has learned: a coefficient of 1 is the Bayes predictor's, 0 means the model
ignores the term. This is the "why" behind an NE gap: which signal a model
misses, not only by how much.

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

from pipelines.synthetic import GeneratorConfig, generate
from pipelines.synthetic.assemble import time_order
from pipelines.synthetic.outcomes import FORMAT_DOMAIN_CLICK, HOUR_MS
from trainer.data import read_examples

# The manifest arguments that are GeneratorConfig fields.
_CONFIG_FIELDS = ("users", "ads", "days", "seed", "events_per_user_day", "contents")


def true_click_terms(gen_dir: Path) -> tuple[list[str], np.ndarray, list[str]]:
    """(term names, (impressions, terms) values, impression ids), in truth order."""
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
    user, ad = base.user[imp], base.ad[imp]
    domain = base.domain[imp].astype(np.int64)
    topic, fmt = world.ads.topic[ad], world.ads.ad_format[ad]
    hour = (base.time_ms[imp] // HOUR_MS) % 24
    terms = {
        "domain x format": np.asarray(p.click_base_logit)[domain]
        + FORMAT_DOMAIN_CLICK[fmt, domain],
        "interest": p.click_interest * world.users.theta[user, topic],
        "recent": p.click_recent * np.log1p(out.recent),
        "ad quality": p.click_quality * world.ads.quality[ad],
        "age x category": world.click_age_category[world.users.age_bucket[user], topic],
        "device x format": world.click_device_format[world.users.device[user], fmt],
        "hour": p.click_hour_amplitude * np.cos(2 * np.pi * (hour - 21) / 24),
    }
    # The truth table lists impressions in time order (assemble.build_tables).
    number = np.empty(base.time_ms.size, dtype=np.int64)
    number[time_order(base.time_ms)] = np.arange(base.time_ms.size)
    by_time = np.argsort(number[imp])
    values = np.stack([v[by_time] for v in terms.values()], axis=1)
    truth = pq.read_table(
        gen_dir / "truth.parquet", columns=["impression_id", "p_click"]
    )
    if not np.allclose(truth.column("p_click").to_numpy(), out.p_click[by_time]):
        raise ValueError(f"{gen_dir}: the regenerated world differs from its truth")
    return list(terms), values, truth.column("impression_id").to_pylist()


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
    names, terms, ids = true_click_terms(args.work / "gen")
    row_of = {k: i for i, k in enumerate(ids)}
    eval_ids = read_examples(args.work / "gen_eval").column("example_id").to_pylist()
    rows = np.array([row_of[k] for k in eval_ids])
    terms = terms[rows]
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
