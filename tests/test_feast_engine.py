"""The batch engine's reading and staging, against brute-force answers.

The engine's writes are held to Feast's stock engine in ``test_feast_store``
(SQLite) and ``test_feast_prod`` (Redis); these cover the parts that decide
*which* rows it writes and how batches move between its threads.
"""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.feast import window_rows

RNG = np.random.default_rng(7)
BASE_MS = 1_790_000_000_000


def write_table(
    folder: Path, users: np.ndarray, ms: np.ndarray, parts: int = 1
) -> list[pq.ParquetFile]:
    """A feature table in ``parts`` consecutive part files: key, time, a value
    naming the row (its position in part order) and a list column, in small
    row groups. An entity's rows may span parts."""
    table = pa.table(
        {
            "user_id": pa.array(users, pa.int64()),
            "event_timestamp": pa.array(ms, pa.timestamp("ms", "UTC")),
            "row": pa.array(np.arange(len(users)), pa.int64()),
            "seq": pa.array([[int(i)] * 3 for i in range(len(users))]),
        }
    )
    bounds = np.linspace(0, len(users), parts + 1).astype(int)
    files = []
    for index, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        path = folder / f"part-{index}.parquet"
        pq.write_table(table.slice(lo, hi - lo), path, row_group_size=97)
        files.append(pq.ParquetFile(path))
    return files


def brute_force(
    users: np.ndarray, ms: np.ndarray, start: int, end: int
) -> dict[int, int]:
    """Per user, the position of its latest row with start <= t <= end (ties:
    the last in part order)."""
    best: dict[int, int] = {}
    for i, (user, t) in enumerate(zip(users.tolist(), ms.tolist(), strict=True)):
        if start <= t <= end and (user not in best or t >= ms[best[user]]):
            best[user] = i
    return best


def window(start_ms: int, end_ms: int) -> tuple[dt.datetime, dt.datetime]:
    return (
        dt.datetime.fromtimestamp(start_ms / 1000, dt.UTC),
        dt.datetime.fromtimestamp(end_ms / 1000, dt.UTC),
    )


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("rows_per_batch", [7, 64, 5000])
def test_window_rows_are_each_entitys_latest(
    tmp_path: Path, ordered: bool, rows_per_batch: int, parts: int
) -> None:
    n = 1500
    users = RNG.integers(0, 200, n)
    ms = BASE_MS + RNG.integers(0, 50, n) * 1000  # many ties
    if ordered:  # as the feature job writes: by (entity, time)
        order = np.lexsort((ms, users))
        users, ms = users[order], ms[order]
    parquet = write_table(tmp_path, users, ms, parts)
    for start, end in [(0, 4_000_000_000_000), (BASE_MS + 10_000, BASE_MS + 30_000)]:
        keep = window_rows.latest_rows(
            parquet, "user_id", *window(start, end), "event_timestamp"
        )
        batches = list(
            window_rows.window_batches(
                parquet, ["user_id", "row", "seq"], keep, rows_per_batch
            )
        )
        got = pa.Table.from_batches(batches).to_pydict() if batches else {"row": []}
        want = brute_force(users, ms, start, end)
        assert sorted(got["row"]) == sorted(want.values())
        assert len(set(got["user_id"])) == len(got["user_id"])  # one per entity
        assert all(s == [r] * 3 for r, s in zip(got["row"], got["seq"], strict=True))
        # Filtered pieces are gathered: no batch far below the batch size
        # except the last.
        assert all(b.num_rows >= rows_per_batch // 2 for b in batches[:-1])


def test_an_empty_window_yields_nothing(tmp_path: Path) -> None:
    parquet = write_table(tmp_path, np.arange(10), BASE_MS + np.arange(10))
    keep = window_rows.latest_rows(
        parquet, "user_id", *window(0, BASE_MS - 1), "event_timestamp"
    )
    assert not any(mask.any() for mask in keep)
    assert list(window_rows.window_batches(parquet, ["row"], keep, 4)) == []


def test_batches_hold_about_the_target_bytes(tmp_path: Path) -> None:
    parquet = write_table(tmp_path, np.arange(1000), BASE_MS + np.arange(1000))
    wide = window_rows.batch_rows(parquet, ["user_id", "seq"], 20_000, 4096)
    narrow = window_rows.batch_rows(parquet, ["user_id"], 20_000, 4096)
    assert 64 <= wide < narrow <= 20_000
    assert window_rows.batch_rows(parquet, ["user_id"], 100, 1 << 30) == 100
