"""The slices of an eval period: each impression in one value of each."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from benchmarks.slices import slice_keys, slice_metrics, slice_table
from features.metrics import normalized_entropy

ORIGIN_MS = 1_790_000_000_000
HOUR_MS = 3_600_000


def _examples(users: list[int], ads: list[int], **columns: list[int]) -> pa.Table:
    return pa.table({"user_id": users, "ad_id": ads, **columns})


def test_every_eval_row_gets_its_value_of_every_slice() -> None:
    train = _examples([1, 2], [10, 11])
    hours = [0.5, 7, 13, 30]
    evals = _examples(
        [1, 3, 2, 4],
        [12, 10, 10, 13],
        timeline_cut=[0, 5, 40, 200],
        domain=[1, 2, 3, 1],
    ).append_column(
        "event_time",
        pa.array([int(ORIGIN_MS + h * HOUR_MS) for h in hours], pa.timestamp("ms")),
    )
    keys = slice_keys(evals, train, ORIGIN_MS)
    assert keys["user"].tolist() == ["seen", "new", "seen", "new"]
    assert keys["ad"].tolist() == ["new", "seen", "seen", "new"]
    assert keys["history"].tolist() == ["0", "1-7", "32-127", "128+"]
    assert keys["domain"].tolist() == ["facebook", "instagram", "messaging", "facebook"]
    assert keys["since_origin"].tolist() == ["0-5h", "6-11h", "12-23h", "24+h"]


def test_each_value_is_scored_on_its_own_rows() -> None:
    keys = {"user": np.array(["new", "seen", "new", "seen", "new", "seen"])}
    clicks = np.array([1, 0, 0, 1, 0, 0])
    gem = np.array([0.6, 0.2, 0.3, 0.5, 0.2, 0.1])
    dlrm = np.full(6, 0.3)
    sliced = slice_metrics(keys, clicks, {"gem": gem, "dlrm": dlrm})
    new = sliced["user"]["new"]
    assert (new["examples"], new["clicks"]) == (3, 1)
    rows = keys["user"] == "new"
    assert new["ne"]["gem"] == pytest.approx(
        normalized_entropy(clicks[rows], gem[rows])
    )
    assert new["ne"]["gem"] < new["ne"]["dlrm"]
    table = slice_table(sliced, "dlrm")
    lead = new["ne"]["dlrm"] - new["ne"]["gem"]
    assert f"| user | new | 3 | 1 | {new['ne']['gem']:.4f}" in table
    assert f"{lead:+.4f} |" in table


def test_a_value_without_clicks_has_no_ne() -> None:
    sliced = slice_metrics(
        {"ad": np.array(["new", "new"])},
        np.array([0, 0]),
        {"gem": np.array([0.1, 0.2])},
    )
    assert sliced["ad"]["new"]["ne"] == {"gem": None}
    assert "n/a" in slice_table(sliced, "gem")


def test_buckets_are_listed_low_to_high() -> None:
    history = np.array(["128+", "8-31", "1-7", "32-127", "0", "8-31"])
    sliced = slice_metrics(
        {"history": history, "user": np.array(["seen", "new"] * 3)},
        np.array([1, 0, 1, 0, 1, 0]),
        {"gem": np.full(6, 0.4)},
    )
    assert list(sliced["history"]) == ["0", "1-7", "8-31", "32-127", "128+"]
    assert list(sliced["user"]) == ["new", "seen"]
