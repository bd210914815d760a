"""The serving benchmark's percentiles and its table beside the Feast peer."""

from __future__ import annotations

import math

from benchmarks.bench_serving import Cell, markdown_table, percentile


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 0.999) == 100.0
    assert percentile([7.0], 0.999) == 7.0
    assert math.isnan(percentile([], 0.5))


def test_the_table_divides_by_the_peer_of_the_same_cell() -> None:
    server = Cell("serving", "sqlite", "student", 50, 4, [4.0] * 99 + [9.0], 1, 2.0)
    peer = Cell("feast", "sqlite", "feast", 50, 4, [3.0] * 100, 0, 1.0)
    alone = Cell("serving", "redis", "gem", 1, 1, [1.0], 0, 1.0)
    lines = markdown_table(
        [server.summary(), peer.summary(), alone.summary()]
    ).splitlines()
    assert len(lines) == 4  # header, rule, and the two server rows
    assert lines[2] == (
        "| sqlite | student | 50 | 4 | 100 | 50 | 4.0 | 4.0 | 9.0 | 1 | 3.0 | 1.33 |"
    )
    assert lines[3].endswith("| 0 | - | - |")
