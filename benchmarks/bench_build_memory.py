"""Peak memory of each process of the Beam feature job as the input grows.

For each layout ``M:S:W`` (``M`` million generated events, ``--shards S``,
``W`` SDK worker processes; ``W`` 1 is the FnApiRunner's embedded worker,
in the job's own process), ``python -m pipelines.build`` runs in a
subprocess on one data set per scale, and every process of its tree is
followed from ``/proc`` until it exits: its high-water resident memory
(``VmHWM``, the kernel's own peak, so the sampling interval only matters
for a process that grows in its last moments). Reported per layout: wall
time, events/s, events per shard and per worker, the job's process (the
runner, and the worker where it is embedded), the largest SDK worker, and
Prism's Go engine where ``--runner prism``, the Flink job server's JVM
where ``--runner flink`` (``launchers.flink_job_server``, Flink's
parallelism ``W``, the worker in the job's process).

Which figure answers which question: a worker's peak at equal events per
worker and a growing input says whether the job's own work is bounded; at a
fixed worker count and a growing input it shows what the runner hands each
worker (``docs/decisions/0023-worker-memory-on-local-runners.md``).

Usage::

    python -m benchmarks.bench_build_memory [--layouts 2:16:2,8:64:2,8:64:8]
        [--runner fnapi|prism|flink] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.bench_build import ROOT, RUNNERS, scale_config
from benchmarks.bench_generator import hardware
from launchers.flink_job_server import FlinkJobServer
from pipelines.sources.synthetic import generate_dataset

SAMPLE_S = 0.1


@dataclass(frozen=True)
class Layout:
    """One measured configuration: ``millions`` of events, ``shards``, ``workers``."""

    millions: float
    shards: int
    workers: int

    @classmethod
    def parse(cls, text: str) -> Layout:
        """``M:S:W`` -> a layout; a clear error for anything else."""
        try:
            millions, shards, workers = text.split(":")
            layout = cls(float(millions), int(shards), int(workers))
        except ValueError:
            raise ValueError(
                f"layout {text!r}: expected MILLIONS:SHARDS:WORKERS, e.g. 8:64:2"
            ) from None
        if layout.millions <= 0 or layout.shards < 1 or layout.workers < 1:
            raise ValueError(f"layout {text!r}: every part must be positive")
        return layout

    def beam_flags(self) -> list[str]:
        """The job's flags for this layout's shards and workers."""
        flags = ["--shards", str(self.shards)]
        if self.workers > 1:
            flags += [
                f"--direct_num_workers={self.workers}",
                "--direct_running_mode=multi_processing",
            ]
        return flags


def descendants(pid: int) -> Iterator[int]:
    """The processes below ``pid`` (Linux ``/proc``), depth first."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                children = [int(c) for c in handle.read().split()]
        except OSError:
            continue
        for child in children:
            yield child
            yield from descendants(child)


def high_water_mb(pid: int) -> int | None:
    """``VmHWM`` of ``pid`` in MB, or None once it has gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) >> 10
    except OSError:
        return None
    return None


def process_role(pid: int) -> str | None:
    """``engine`` for Prism's Go process, ``worker`` for a Python one,
    None for anything else (the shells that start workers)."""
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return None
    if exe == "prism":
        return "engine"
    return "worker" if exe.startswith("python") else None


def follow_peaks(process: subprocess.Popen[bytes]) -> dict[str, int]:
    """Wait for ``process``; the peak MB of it (``job``) and of the largest
    of its ``worker`` and ``engine`` descendants (absent when none ran)."""
    seen: dict[int, tuple[str, int]] = {}
    while process.poll() is None:
        for pid, role in [(process.pid, "job")] + [
            (child, process_role(child)) for child in descendants(process.pid)
        ]:
            peak = high_water_mb(pid) if role else None
            if role and peak is not None:
                seen[pid] = (role, peak)  # a high-water mark: the last read is the peak
        time.sleep(SAMPLE_S)
    peaks: dict[str, int] = {}
    for role, peak in seen.values():
        peaks[role] = max(peak, peaks.get(role, 0))
    return peaks


def measure(layout: Layout, runner: str, workdir: Path) -> dict[str, Any]:
    """Run the job once on this layout's data; its time and memory. On
    ``flink`` a job server of its own runs beside it (``W`` is Flink's
    parallelism) and its JVM's peak is the ``engine``'s."""
    source = workdir / f"data-{layout.millions:g}"
    if not source.exists():
        generate_dataset(scale_config(layout.millions), source)
    if runner != "flink":
        flags, expected = RUNNERS[runner]
        flags = [*flags, *layout.beam_flags()]
        return _run_job(layout, source, workdir, flags, expected)
    with FlinkJobServer() as server:
        flags = [*server.beam_flags(layout.workers), "--shards", str(layout.shards)]
        result = _run_job(layout, source, workdir, flags, "PortableRunner")
        assert server.process is not None
        engine = high_water_mb(server.process.pid)
    if engine is not None:
        result["peak_mb"]["engine"] = engine
    # The LOOPBACK worker runs in the job's process; a Python child seen
    # here is Beam's stager listing the environment (pip freeze).
    result["peak_mb"].pop("worker", None)
    return result


def _run_job(
    layout: Layout, source: Path, workdir: Path, flags: list[str], expected: str
) -> dict[str, Any]:
    out = workdir / "out"
    command = [
        sys.executable,
        "-m",
        "pipelines.build",
        "--input",
        str(source),
        "--output",
        str(out),
        *flags,
    ]
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    peaks = follow_peaks(process)
    wall = time.perf_counter() - start
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {process.returncode}")
    summary = json.loads((out / "summary.json").read_text())
    if summary["runner"] != expected:
        ran = summary["runner"]
        raise RuntimeError(f"the job ran on {ran}, not {expected}")
    events = summary["counts"]["events_read"]
    return {
        "layout": asdict(layout),
        "runner": summary["runner"],
        "events": events,
        "events_per_shard": events / layout.shards,
        "events_per_worker": events / layout.workers,
        "wall_s": wall,
        "events_per_s": events / wall,
        "peak_mb": peaks,
    }


def format_table(results: list[dict[str, Any]]) -> str:
    """Markdown table: one row per layout."""
    lines = [
        "| events | `--shards` | workers | events per shard | events per worker "
        "| wall s | events/s | job MB | largest worker MB | engine MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        layout, peaks = r["layout"], r["peak_mb"]
        cells = [peaks.get(role) for role in ("job", "worker", "engine")]
        lines.append(
            f"| {r['events']:,} | {layout['shards']} | {layout['workers']} "
            f"| {r['events_per_shard'] / 1e3:,.0f} k "
            f"| {r['events_per_worker'] / 1e3:,.0f} k | {r['wall_s']:.1f} "
            f"| {r['events_per_s']:,.0f} | "
            + " | ".join("-" if mb is None else f"{mb:,}" for mb in cells)
            + " |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--layouts",
        default="2:16:2,8:64:2,8:64:8",
        help="MILLIONS:SHARDS:WORKERS, comma-separated",
    )
    parser.add_argument("--runner", choices=sorted(RUNNERS), default="fnapi")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        layouts = [Layout.parse(text) for text in args.layouts.split(",")]
    except ValueError as error:
        parser.error(str(error))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-build-memory-") as tmp:
        results = [measure(layout, args.runner, Path(tmp)) for layout in layouts]
    hw = hardware()
    if args.json:
        report = {"hardware": hw, "load_before": load_before, "load": os.getloadavg()}
        print(json.dumps({**report, "results": results}, indent=2))
        return 0
    print(
        f"hardware: {hw['cpu']}, {hw['usable_cores']} usable cores; "
        f"runner {args.runner}; load average "
        f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
