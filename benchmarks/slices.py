"""Where one model gains on another: eval click NE by slice of the eval period.

Each eval impression falls in one value of every slice:

- ``user`` / ``ad``: ``seen`` when the id has an example in the train
  period, else ``new`` (the cold start a model meets after its cut);
- ``history``: the user's events before the impression (``timeline_cut``,
  uncapped), in buckets around the model's window;
- ``domain``: the app the impression was shown in;
- ``since_origin``: hours from the eval period's start (how far from its
  training data the model is asked to reach).

:func:`slice_metrics` scores every model on each value with
:func:`features.metrics.binary_metrics`; rolling-origin runs pool the
origins' impressions first, so each slice's NE is over all eval periods.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.metrics import binary_metrics
from features.vocab import DOMAINS
from trainer.data.feature_output import event_time_ms

HISTORY_BUCKETS = (0, 1, 8, 32, 128)
"""Lower bounds of the history-length buckets (events before the impression)."""

HOURS_SINCE_ORIGIN = (0, 6, 12, 24)
"""Lower bounds of the time-since-origin buckets, in hours."""

HOUR_MS = 3_600_000


def _bucket_names(bounds: tuple[int, ...], unit: str = "") -> list[str]:
    """``(0, 1, 8)`` -> ``["0", "1-7", "8+"]``: one name per bucket."""
    names = []
    for i, low in enumerate(bounds):
        if i + 1 == len(bounds):
            names.append(f"{low}+{unit}")
        elif bounds[i + 1] - low == 1:
            names.append(f"{low}{unit}")
        else:
            names.append(f"{low}-{bounds[i + 1] - 1}{unit}")
    return names


def _bucketed(
    values: np.ndarray, bounds: tuple[int, ...], unit: str = ""
) -> np.ndarray:
    names = np.array(_bucket_names(bounds, unit))
    return names[np.searchsorted(np.array(bounds), values, side="right") - 1]


def _seen(ids: pa.ChunkedArray, known: pa.ChunkedArray) -> np.ndarray:
    return np.where(pc.is_in(ids, value_set=pc.unique(known)).to_numpy(), "seen", "new")


def slice_keys(
    evals: pa.Table, train: pa.Table, origin_ms: int
) -> dict[str, np.ndarray]:
    """Each slice's value for every eval row, in ``evals``' row order (that of
    the models' predictions)."""
    hours = (event_time_ms(evals) - origin_ms) / HOUR_MS
    return {
        "user": _seen(evals.column("user_id"), train.column("user_id")),
        "ad": _seen(evals.column("ad_id"), train.column("ad_id")),
        "history": _bucketed(evals.column("timeline_cut").to_numpy(), HISTORY_BUCKETS),
        # Vocabulary ids: 0 is the unknown value, then DOMAINS in order.
        "domain": np.array(["unknown", *DOMAINS])[evals.column("domain").to_numpy()],
        "since_origin": _bucketed(hours, HOURS_SINCE_ORIGIN, "h"),
    }


def _in_order(name: str, values: set[str]) -> list[str]:
    """A slice's values as a reader scans them: buckets low to high, the
    rest alphabetically."""
    buckets = {
        "history": _bucket_names(HISTORY_BUCKETS),
        "since_origin": _bucket_names(HOURS_SINCE_ORIGIN, "h"),
    }.get(name)
    if buckets is None:
        return sorted(values)
    return [b for b in buckets if b in values]


def slice_metrics(
    keys: dict[str, np.ndarray],
    clicks: np.ndarray,
    probs: dict[str, np.ndarray],
) -> dict[str, dict[str, Any]]:
    """Per slice and value: its impressions, clicks and each model's click NE
    and AUC (None where the value holds no click)."""
    out: dict[str, dict[str, Any]] = {}
    for name, values in keys.items():
        out[name] = {}
        for value in _in_order(name, set(values.tolist())):
            rows = values == value
            scores = {
                m: binary_metrics(clicks[rows], p[rows]) for m, p in probs.items()
            }
            first = next(iter(scores.values()))
            out[name][value] = {
                "examples": first.count,
                "clicks": first.positives,
                "ne": {m: _finite(s.ne) for m, s in scores.items()},
                "auc": {m: _finite(s.auc) for m, s in scores.items()},
            }
    return out


def slice_table(
    sliced: dict[str, dict[str, Any]], model: str, reference: str = "gem"
) -> str:
    """Markdown: per slice value, the reference's click NE, ``model``'s, and
    the reference's lead (positive: the reference is better)."""
    lines = [
        f"| slice | value | examples | clicks | {reference} NE | {model} NE "
        f"| {reference} lead |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, values in sliced.items():
        for value, got in values.items():
            ours, theirs = got["ne"][reference], got["ne"][model]
            lead = "n/a" if ours is None or theirs is None else f"{theirs - ours:+.4f}"
            lines.append(
                f"| {name} | {value} | {got['examples']:,} | {got['clicks']:,} "
                f"| {_fmt(ours)} | {_fmt(theirs)} | {lead} |"
            )
    return "\n".join(lines)


def _finite(x: float) -> float | None:
    # NE and AUC are NaN on a value without clicks: None in the JSON.
    return float(x) if np.isfinite(x) else None


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"
