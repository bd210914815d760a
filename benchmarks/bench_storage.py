"""Storage of sequences: timelines + cuts vs windows materialized per example.

Usage::

    python -m benchmarks.bench_storage [--users 50000 --ads 5000 --days 4]
        [--batch 4096] [--sample 20000] [--json]

On one generated data set, after the reference feature job:

- **timelines**: the bytes of the timelines' list columns (values + offsets)
  in memory, and the timelines' Parquet file on disk, plus the 8-byte
  ``timeline_cut`` each example carries;
- **materialized** at ``max_seq_len`` 256 and 4096: what the same ``seq_*``
  columns would take on every example (``training_example_schema(
  with_sequences=True)``), computed arithmetically from the window lengths
  ``min(cut, L)`` (no 4096-wide copies are made), and, for 256, the Parquet
  size of ``--sample`` examples with their windows, scaled to all examples;
- **reader throughput**: examples windowed per second at L = 256 by
  :func:`features.windows.example_windows` (jagged), in batches of
  ``--batch``, against a padded peer in the same run: a numpy ``[B, 256]``
  gather with a mask for every sequence column (what a dense-padded reader
  does);
- the hardware.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.generated import add_world_arguments, generated_tables, world_config
from benchmarks.machine import machine_line
from features.examples import TIMELINE_SCHEMA, training_example_schema
from features.registry import time_bucket
from features.windows import (
    SEQUENCE_COLUMNS,
    TIMELINE_SEQUENCE_COLUMNS,
    attach_windows,
    example_windows,
)

LENGTHS = (256, 4096)


def hardware() -> str:
    """CPU model and cores, as /proc/cpuinfo names them, and the versions."""
    return machine_line(np, pa)


def list_bytes(table: pa.Table, names: tuple[str, ...]) -> int:
    """Bytes of list columns' values + offsets (what a jagged tensor holds)."""
    total = 0
    for name in names:
        lists = table.column(name).combine_chunks()
        total += lists.offsets.nbytes + lists.flatten().nbytes
    return total


def event_bytes() -> int:
    """Bytes of one window event across the materialized seq_* columns."""
    schema = training_example_schema(with_sequences=True)
    return sum(schema.field(n).type.value_type.byte_width for n in SEQUENCE_COLUMNS)


def materialized_bytes(cuts: np.ndarray, max_seq_len: int) -> int:
    """The seq_* columns of every example at L, from window lengths alone."""
    events = int(np.minimum(cuts, max_seq_len).sum())
    offsets = len(SEQUENCE_COLUMNS) * 4 * (cuts.size + 1)  # int32 offsets
    return events * event_bytes() + offsets


def padded_windows(
    user_row_start: np.ndarray,
    first: np.ndarray,
    lengths: np.ndarray,
    now_ms: np.ndarray,
    flat: dict[str, np.ndarray],
    max_seq_len: int,
) -> dict[str, np.ndarray]:
    """The padded peer: [B, L] gathers with a mask (0 = padding)."""
    steps = np.arange(max_seq_len)
    mask = steps[None, :] < lengths[:, None]
    index = np.where(mask, (user_row_start + first)[:, None] + steps[None, :], 0)
    out = {}
    for name in TIMELINE_SEQUENCE_COLUMNS:
        out[name] = np.where(mask, flat[name][index], 0)
    seconds = (now_ms[:, None] - flat["event_time"][index]) / 1000.0
    out["seq_time_bucket"] = np.where(mask, time_bucket(seconds), 0)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Generate, build the reference and measure (see the module docstring)."""
    tables = generated_tables(world_config(args))
    started = time.perf_counter()
    out = tables.reference()
    reference_s = time.perf_counter() - started
    examples, timelines = out.examples, out.timelines
    cuts = examples["timeline_cut"].to_numpy()
    timeline_names = tuple(f.name for f in TIMELINE_SCHEMA if f.name != "user_id")
    timeline_memory = list_bytes(timelines, timeline_names)
    cut_bytes = 8 * examples.num_rows
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "timelines.parquet"
        pq.write_table(timelines, path)
        timeline_disk = path.stat().st_size
        rng = np.random.default_rng(0)
        sample_rows = np.sort(
            rng.choice(examples.num_rows, min(args.sample, examples.num_rows), False)
        )
        sample = attach_windows(examples.take(pa.array(sample_rows)), timelines, 256)
        sample_path = Path(tmp) / "windows.parquet"
        pq.write_table(sample.select(list(SEQUENCE_COLUMNS)), sample_path)
        sample_disk = sample_path.stat().st_size * examples.num_rows / sample.num_rows

    storage = {
        "events": tables.events.num_rows,
        "examples": examples.num_rows,
        "timeline_events": out.counts["timeline_events"],
        "timelines_memory_bytes": timeline_memory,
        "timelines_parquet_bytes": timeline_disk,
        "cut_bytes": cut_bytes,
    }
    for length in LENGTHS:
        size = materialized_bytes(cuts, length)
        storage[f"materialized_{length}_memory_bytes"] = size
        storage[f"materialized_{length}_vs_timelines"] = size / (
            timeline_memory + cut_bytes
        )
        storage[f"mean_window_{length}"] = float(np.minimum(cuts, length).mean())
        # Dense-padded [B, L] columns (no offsets): every example pays L.
        padded = examples.num_rows * length * event_bytes()
        storage[f"padded_{length}_memory_bytes"] = int(padded)
        storage[f"padded_{length}_vs_timelines"] = padded / (
            timeline_memory + cut_bytes
        )
    storage["materialized_256_parquet_bytes_est"] = int(sample_disk)
    storage["materialized_256_parquet_vs_timelines"] = sample_disk / timeline_disk

    # Throughput at L = 256, batches of --batch examples in example_id order.
    batches = [
        examples.slice(i, args.batch) for i in range(0, examples.num_rows, args.batch)
    ]
    jagged_s = padded_s = float("inf")
    flat = {
        name: timelines.column(name).combine_chunks().flatten().to_numpy()
        for name in TIMELINE_SEQUENCE_COLUMNS
    }
    flat["event_time"] = (
        timelines["event_time"].combine_chunks().flatten().cast(pa.int64()).to_numpy()
    )
    offsets = timelines["event_time"].combine_chunks().offsets.to_numpy()
    users = timelines["user_id"].to_numpy()
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        for batch in batches:
            example_windows(batch, timelines, 256)
        jagged_s = min(jagged_s, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for batch in batches:
            # The padded peer gets the user lookup for free (same searchsorted).
            b_cuts = batch["timeline_cut"].to_numpy()
            row = np.searchsorted(users, batch["user_id"].to_numpy())
            lengths = np.minimum(b_cuts, 256)
            padded_windows(
                offsets[row].astype(np.int64),
                b_cuts - lengths,
                lengths,
                batch["event_time"].cast(pa.int64()).to_numpy(),
                flat,
                256,
            )
        padded_s = min(padded_s, time.perf_counter() - t0)
    n = examples.num_rows
    throughput = {
        "batch": args.batch,
        "jagged_examples_per_s": n / jagged_s,
        "padded_examples_per_s": n / padded_s,
        "jagged_vs_padded": padded_s / jagged_s,
    }
    return {
        "arguments": vars(args),
        "hardware": hardware(),
        "reference_seconds": reference_s,
        "reference_events_per_s": tables.events.num_rows / reference_s,
        "storage": storage,
        "throughput_256": throughput,
    }


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def report(result: dict[str, Any]) -> str:
    """Human-readable summary."""
    s, t = result["storage"], result["throughput_256"]
    lines = [
        f"hardware: {result['hardware']}",
        f"events {s['events']:,}, examples {s['examples']:,}, "
        f"reference job {result['reference_seconds']:.1f} s "
        f"({result['reference_events_per_s'] / 1e3:,.0f}k events/s)",
        f"timelines: {_mib(s['timelines_memory_bytes'])} in memory "
        f"(+ cuts {_mib(s['cut_bytes'])}), {_mib(s['timelines_parquet_bytes'])} "
        "Parquet",
    ]
    for length in LENGTHS:
        lines.append(
            f"materialized L={length}: {_mib(s[f'materialized_{length}_memory_bytes'])}"
            f" in memory = {s[f'materialized_{length}_vs_timelines']:.0f}x timelines"
            f" + cuts (mean window {s[f'mean_window_{length}']:.0f} events); padded"
            f" [B, {length}]: {_mib(s[f'padded_{length}_memory_bytes'])} ="
            f" {s[f'padded_{length}_vs_timelines']:.0f}x"
        )
    lines.append(
        f"materialized L=256 Parquet (sampled, scaled): "
        f"{_mib(s['materialized_256_parquet_bytes_est'])} = "
        f"{s['materialized_256_parquet_vs_timelines']:.0f}x timelines Parquet"
    )
    lines.append(
        f"reader L=256, batch {t['batch']}: jagged "
        f"{t['jagged_examples_per_s'] / 1e3:,.0f}k examples/s, padded peer "
        f"{t['padded_examples_per_s'] / 1e3:,.0f}k examples/s "
        f"(jagged {t['jagged_vs_padded']:.2f}x the padded peer's speed)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_world_arguments(parser, users=50_000, ads=5_000, days=4)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--sample", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=2) if args.json else report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
