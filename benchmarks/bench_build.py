"""Throughput of the Beam feature job next to the single-process reference.

For each scale (0.5 M, 1 M and 2 M raw events by default, to check that time
grows linearly), one data set is generated, then on the same files:

- **beam**: ``python -m pipelines.build --runner=FnApiRunner`` (16 user
  shards, one SDK worker: the embedded default);
- **reference**: ``python -m pipelines.reference`` (pyarrow / pandas / numpy
  in one process), the peer the ratio is taken against.

Each runs in its own subprocess, so the peak resident memory
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``, reported by the child) is
that job's alone; the wall time is measured around the subprocess, so it
includes interpreter start and imports: what a user waits for. The best of
``--repeat`` runs is the headline; both jobs' outputs are compared (counts).

Usage::

    python -m benchmarks.bench_build [--scales 0.5,1,2] [--repeat 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_generator import hardware
from pipelines.synthetic import GeneratorConfig, generate_dataset

ROOT = Path(__file__).resolve().parents[1]
# About 40.7 raw events per user at 10 base events per user-day over 4 days.
USERS_PER_MILLION = 25_000

_CHILD = """
import json, resource, sys, time
kind, source, out = sys.argv[1:4]
start = time.perf_counter()
if kind == "beam":
    from pipelines import build
    counts = build.run(["--runner=FnApiRunner", "--input", source, "--output", out])[
        "counts"]
else:
    from pipelines import reference
    reference.main(["--input", source, "--output", out, "--overwrite"])
    counts = json.load(open(out + "/summary.json"))["counts"]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"job_s": time.perf_counter() - start, "peak_mb": peak,
                  "counts": counts}))
"""


def _run_child(kind: str, source: Path, out: Path) -> dict[str, Any]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, str(source), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall
    return result


def measure(millions: float, repeat: int, workdir: Path) -> dict[str, Any]:
    """Generate one data set of about ``millions`` M events; time both jobs."""
    users = int(USERS_PER_MILLION * millions)
    config = GeneratorConfig(users=users, ads=max(users // 10, 1), days=4, seed=0)
    source = workdir / f"data-{millions}"
    data, _ = generate_dataset(config, source)
    events = data.events.num_rows
    runs: dict[str, list[dict[str, Any]]] = {"beam": [], "reference": []}
    for _ in range(repeat):
        for kind in runs:
            runs[kind].append(_run_child(kind, source, workdir / f"out-{kind}"))
    best = {kind: min(r, key=lambda x: x["wall_s"]) for kind, r in runs.items()}
    same = best["beam"]["counts"] == best["reference"]["counts"]
    return {
        "events": events,
        "users": users,
        "counts_equal": same,
        "beam": best["beam"],
        "reference": best["reference"],
        "beam_events_per_s": events / best["beam"]["wall_s"],
        "reference_events_per_s": events / best["reference"]["wall_s"],
        "ratio": best["reference"]["wall_s"] / best["beam"]["wall_s"],
    }


def format_table(results: list[dict[str, Any]]) -> str:
    """Markdown table of the measurements."""
    lines = [
        "| events | Beam wall s | Beam events/s | Beam peak MB | reference wall s "
        "| reference events/s | reference peak MB | Beam / reference speed |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['events']:,} | {r['beam']['wall_s']:.2f} "
            f"| {r['beam_events_per_s']:,.0f} | {r['beam']['peak_mb']:,.0f} "
            f"| {r['reference']['wall_s']:.2f} | {r['reference_events_per_s']:,.0f} "
            f"| {r['reference']['peak_mb']:,.0f} | {r['ratio']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default="0.5,1,2", help="millions of events")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    scales = [float(s) for s in args.scales.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
        results = [measure(m, args.repeat, Path(tmp)) for m in scales]
    report = {"hardware": hardware(), "load": os.getloadavg(), "results": results}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        hw = report["hardware"]
        print(
            f"hardware: {hw['cpu']}, {hw['usable_cores']} usable cores, "
            f"Python {hw['python']}, pyarrow {hw['pyarrow']}; load average "
            f"{report['load'][0]:.1f}"
        )
        print(format_table(results))
        if not all(r["counts_equal"] for r in results):
            print("WARNING: Beam and reference counts differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
