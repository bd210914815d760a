"""The Bayes-optimal report: how good the *true* probabilities are.

The generator samples every click and conversion from probabilities it knows
(``truth.parquet``: ``p_click`` and ``p_conversion`` per impression). Scoring
those probabilities against the realised outcomes gives, for each
(domain, training objective), the best NE, AUC and calibration any model can
expect on this data:

- The outcome of an impression is a coin flip with probability ``p``. Given
  everything that happened before the impression (the user, the ad, the
  history), ``p`` is the exact conditional probability, so no function of
  those inputs has a lower expected log loss (log loss is a proper scoring
  rule, minimised in expectation by the true probability), and no ranking of
  impressions separates clicks from non-clicks better in expectation than
  ranking by ``p``.
- The remaining loss is irreducible noise: the coin flip itself.

So the numbers below are a ceiling. A model whose NE is clearly *below* the
Bayes NE (or AUC clearly above) on a decent sample is not better than optimal:
it is seeing the outcome, i.e. leaking labels (a click event, a conversion or
a post-impression feature in its inputs). Small samples fluctuate around the
ceiling by a few percent, which is why the counts are printed too.

Usage::

    python -m pipelines.sources.bayes --input out/synthetic [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features import vocab
from features.cli import CommandError, CommandParser, run_command
from features.config_flags import config_fields, flag, flag_field
from features.json_report import json_safe

if TYPE_CHECKING:
    import numpy as np

# Training objective -> (true probability column, realised outcome column).
_COLUMNS = {
    "click": ("p_click", "clicked"),
    "conversion": ("p_conversion", "converted"),
}


def _metrics(labels: np.ndarray, probs: np.ndarray) -> dict[str, Any]:
    """Count, positives, base rate, NE, AUC and calibration of one slice."""
    from features.metrics import binary_metrics

    if labels.size == 0:
        return {
            "count": 0,
            "positives": 0,
            "base_rate": math.nan,
            "ne": math.nan,
            "auc": math.nan,
            "calibration": math.nan,
        }
    m = binary_metrics(labels, probs)
    return {
        "count": m.count,
        "positives": m.positives,
        "base_rate": m.positives / m.count,
        "ne": m.ne,
        "auc": m.auc,
        "calibration": m.calibration,
    }


def bayes_optimal_report(input_dir: Path | str) -> dict[str, Any]:
    """NE, AUC and calibration of the true probabilities, per slice.

    Args:
        input_dir: a generator output directory (with ``truth.parquet``).

    Returns:
        ``{"by_domain": {domain: {objective: metrics}}, "overall": {objective:
        metrics}}`` where metrics has ``count``, ``positives``, ``base_rate``,
        ``ne``, ``auc`` and ``calibration`` (NaN where undefined, e.g. a slice
        with no positive).
    """
    import pyarrow.parquet as pq

    truth = pq.read_table(Path(input_dir) / "truth.parquet")
    domains = truth.column("domain").to_numpy(zero_copy_only=False)
    report: dict[str, Any] = {"by_domain": {}, "overall": {}}
    for objective, (prob_col, label_col) in _COLUMNS.items():
        probs = truth.column(prob_col).to_numpy()
        labels = truth.column(label_col).to_numpy()
        report["overall"][objective] = _metrics(labels, probs)
        for domain in vocab.DOMAINS:
            mask = domains == domain
            report["by_domain"].setdefault(domain, {})[objective] = _metrics(
                labels[mask], probs[mask]
            )
    return report


def format_report(report: dict[str, Any]) -> str:
    """The report as a fixed-width text table."""
    header = (
        f"{'domain':<10} {'objective':<10} {'count':>10} {'positives':>9} "
        f"{'base_rate':>9} {'NE':>7} {'AUC':>7} {'calib':>7}"
    )
    lines = [header, "-" * len(header)]
    rows = [
        (domain, objective, metrics)
        for domain, by_objective in report["by_domain"].items()
        for objective, metrics in by_objective.items()
    ] + [("overall", o, m) for o, m in report["overall"].items()]
    for domain, objective, m in rows:
        lines.append(
            f"{domain:<10} {objective:<10} {m['count']:>10} {m['positives']:>9} "
            f"{m['base_rate']:>9.5f} {m['ne']:>7.4f} {m['auc']:>7.4f} "
            f"{m['calibration']:>7.4f}"
        )
    return "\n".join(lines)


def pooled_click(by_domain: dict[str, dict[str, Any]]) -> dict[str, float]:
    """One click figure over every domain, from per-domain slices alone.

    What the trainer's progressive tables give (per domain, no scores), so
    the same pooling puts a model and the ceiling side by side:

    - ``ne``: exact. Each slice's log loss is ``ne * count * H(base rate)``;
      their sum over ``count * H(pooled base rate)``.
    - ``auc``: over the (click, non-click) pairs *within* a domain, i.e. the
      per-domain AUCs weighted by their pairs (how ads are ranked: within a
      surface, never across).

    Args:
        by_domain: ``{domain: {"count", "positives", "ne", "auc", ...}}``;
            slices without both outcomes are left out.

    Returns:
        ``{"count", "positives", "base_rate", "ne", "auc"}`` (NaN: no slice).

    Example:
        >>> one = {"count": 100, "positives": 10, "ne": 0.9, "auc": 0.7}
        >>> pooled = pooled_click({"a": one, "b": one})
        >>> round(pooled["ne"], 6), round(pooled["auc"], 6)
        (0.9, 0.7)
    """
    count = positives = loss = pairs = ranked = 0.0
    for m in by_domain.values():
        n, p = float(m["count"]), float(m["positives"])
        if not 0 < p < n or not math.isfinite(m["ne"]) or not math.isfinite(m["auc"]):
            continue
        count, positives = count + n, positives + p
        loss += m["ne"] * n * _entropy(p / n)
        pairs += p * (n - p)
        ranked += m["auc"] * p * (n - p)
    if count == 0:
        nan = math.nan
        return {"count": 0, "positives": 0, "base_rate": nan, "ne": nan, "auc": nan}
    rate = positives / count
    return {
        "count": count,
        "positives": positives,
        "base_rate": rate,
        "ne": loss / (count * _entropy(rate)),
        "auc": ranked / pairs,
    }


def _entropy(rate: float) -> float:
    """Log loss per example of always predicting ``rate`` (nats)."""
    return -(rate * math.log(rate) + (1 - rate) * math.log1p(-rate))


@dataclasses.dataclass(frozen=True, kw_only=True)
class BayesConfig:
    """What ``python -m pipelines.sources.bayes`` is told."""

    input: str = field(
        metadata=flag("generator output directory (truth.parquet)", metavar="DIR")
    )
    as_json: bool = flag_field(
        False, "print the report as JSON, not a table", name="--json"
    )


def _print_report(args: argparse.Namespace) -> int:
    config = BayesConfig(**config_fields(args, BayesConfig))
    path = Path(config.input) / "truth.parquet"
    if not path.is_file():
        raise CommandError(
            f"{path} not found",
            "--input must be a generator output directory (python -m "
            "pipelines.generate writes one)",
        )
    report = bayes_optimal_report(config.input)
    if config.as_json:
        json.dump(json_safe(report), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(format_report(report))
    return 0


def build_parser() -> CommandParser:
    """The command's flags (:class:`BayesConfig`'s)."""
    return CommandParser(
        "pipelines.sources.bayes",
        "NE / AUC / calibration of the generator's true probabilities:\n"
        "the ceiling for any model on that data.",
        configs=[BayesConfig],
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Print the Bayes-optimal report of a generated data set."""
    return run_command(build_parser(), _print_report, argv)


if __name__ == "__main__":
    sys.exit(main())
