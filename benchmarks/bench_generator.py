"""Throughput of the synthetic event generator, next to a write-only peer.

Times, ``--repeat`` times each:

- **generate + write**: :func:`pipelines.sources.synthetic.generate` followed by
  :func:`pipelines.sources.synthetic.write_dataset` (events partitioned by day as
  Parquet, plus the users / ads / contents / truth tables and the manifest):
  everything ``python -m pipelines.generate`` does;
- **write only** (the peer): ``pyarrow.parquet.write_table`` of the very same,
  already built event table into one file with Arrow's defaults.

The ratio of the two says how much generating costs on top of merely
writing the bytes out: a ratio of 3 means generation is twice the cost of the
Parquet write itself. The best run of each is reported (the usual choice for
throughput: slower runs measure interference, not the code), with the median
alongside.

Usage::

    python -m benchmarks.bench_generator [--users 50000 --ads 5000 --days 4]
        [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.generated import add_world_arguments, world_config
from benchmarks.machine import cpu_model
from pipelines.sources.synthetic import GeneratorConfig, generate, write_dataset


def hardware() -> dict[str, Any]:
    """CPU model, core counts and library versions of this machine."""
    model = cpu_model()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 1
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pyarrow": pa.__version__,
    }


def run(config: GeneratorConfig, repeat: int, workdir: Path) -> dict[str, Any]:
    """Time generate+write and the write-only peer ``repeat`` times each.

    Args:
        config: what to generate.
        repeat: runs of each measurement.
        workdir: scratch directory for the files.

    Returns:
        Timings (seconds per run), event count and derived rates.
    """
    generate_s: list[float] = []
    write_s: list[float] = []
    total_s: list[float] = []
    events: pa.Table | None = None
    for i in range(repeat):
        start = time.perf_counter()
        data = generate(config)
        generated = time.perf_counter()
        write_dataset(data, workdir / f"run-{i}")
        done = time.perf_counter()
        generate_s.append(generated - start)
        write_s.append(done - generated)
        total_s.append(done - start)
        events = data.events
    assert events is not None
    peer_s: list[float] = []
    for i in range(repeat):
        start = time.perf_counter()
        pq.write_table(events, workdir / f"peer-{i}.parquet")
        peer_s.append(time.perf_counter() - start)
    n = events.num_rows
    best, peer = min(total_s), min(peer_s)
    return {
        "events": n,
        "repeat": repeat,
        "seconds": {
            "generate_and_write": total_s,
            "generate": generate_s,
            "write_dataset": write_s,
            "write_only_peer": peer_s,
        },
        "events_per_s": {
            "generate_and_write": n / best,
            "generate_and_write_median": n / statistics.median(total_s),
            # The first run also pays for the process's first large allocations
            # (page faults), as a one-off CLI run does.
            "generate_and_write_first": n / total_s[0],
            "write_only_peer": n / peer,
            "write_only_peer_median": n / statistics.median(peer_s),
        },
        "ratio_generate_and_write_to_write_only": best / peer,
    }


def format_result(result: dict[str, Any], config: GeneratorConfig) -> str:
    """Human-readable summary."""
    hw = result["hardware"]
    rates, secs = result["events_per_s"], result["seconds"]
    lines = [
        f"hardware: {hw['cpu']}, {hw['usable_cores']} usable of {hw['cores']} "
        f"cores; Python {hw['python']}, numpy {hw['numpy']}, "
        f"pyarrow {hw['pyarrow']}",
        f"scale: --users {config.users} --ads {config.ads} --days {config.days} "
        f"--events-per-user-day {config.events_per_user_day:g}: "
        f"{result['events']:,} events, best of {result['repeat']}",
        "",
        f"{'measurement':<34}{'best s':>9}{'events/s':>14}{'median ev/s':>14}",
        f"{'generate + write (all files)':<34}{min(secs['generate_and_write']):>9.3f}"
        f"{rates['generate_and_write']:>14,.0f}"
        f"{rates['generate_and_write_median']:>14,.0f}",
        f"{'  first (cold) run':<34}{secs['generate_and_write'][0]:>9.3f}"
        f"{rates['generate_and_write_first']:>14,.0f}",
        f"{'  of which generate':<34}{min(secs['generate']):>9.3f}",
        f"{'  of which write_dataset':<34}{min(secs['write_dataset']):>9.3f}",
        f"{'write only (pq.write_table peer)':<34}{min(secs['write_only_peer']):>9.3f}"
        f"{rates['write_only_peer']:>14,.0f}{rates['write_only_peer_median']:>14,.0f}",
        "",
        "ratio generate+write / write-only: "
        f"{result['ratio_generate_and_write_to_write_only']:.2f}",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the result."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_generator",
        description="Generator throughput vs. a plain Parquet write of its events.",
    )
    add_world_arguments(parser, users=50_000, ads=5_000, days=4)
    parser.add_argument("--events-per-user-day", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--workdir", type=Path, help="scratch dir (default: a temp dir)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    config = world_config(args, events_per_user_day=args.events_per_user_day)
    with tempfile.TemporaryDirectory(dir=args.workdir) as scratch:
        result = run(config, args.repeat, Path(scratch))
    result["hardware"] = hardware()
    result["config"] = {
        "users": config.users,
        "ads": config.ads,
        "days": config.days,
        "events_per_user_day": config.events_per_user_day,
        "seed": config.seed,
    }
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_result(result, config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
