"""Streaming job: sustained events/s with the trainer beside it, and freshness.

    python -m benchmarks.bench_streaming [--users 300 --days 3 --rate 2000]

One run of :func:`pipelines.demo_stream.run_stream_demo` (generator at a
steady rate -> streaming job with Feast pushes -> trainer daemon, all on the
embedded broker), and its peer in the same run: the batch feature job
(``pipelines.build --runner=FnApiRunner``) on the same events from files.
Printed as one JSON object (and the table row of ``benchmarks/README.md``):
events/s of both and their ratio, and freshness p50 / p99 (event -> example
on Kafka beyond the label window, event -> Feast online value, example ->
first training step), with the hardware and the load average (the machine is
shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from benchmarks.machine import cpu_model
from pipelines.demo_stream import StreamDemoConfig, run_stream_demo


def batch_peer(data: Path, out: Path) -> dict[str, Any]:
    """The batch job on the same events: events/s."""
    from pipelines import build

    started = time.monotonic()
    summary = build.run(
        [f"--input={data}", f"--output={out}", "--runner=FnApiRunner", "--shards=4"]
    )
    seconds = time.monotonic() - started
    events = summary["counts"]["events_read"]
    return {
        "events": events,
        "seconds": round(seconds, 2),
        "events_per_second": round(events / seconds, 1),
    }


def main() -> int:
    """Run the benchmark once and print its figures."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_streaming")
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--pause-broker-seconds", type=float, default=0.0)
    parser.add_argument("--output", type=Path, default=Path("demo-output/bench-stream"))
    args = parser.parse_args()
    shutil.rmtree(args.output, ignore_errors=True)
    config = StreamDemoConfig(
        users=args.users,
        days=args.days,
        rate=args.rate,
        pause_broker_seconds=args.pause_broker_seconds,
        output=args.output,
    )
    stream = run_stream_demo(config)
    peer = batch_peer(args.output / "gen", args.output / "batch")
    result = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 1),
        "events": stream["events"],
        "rate_asked": args.rate,
        "streaming_events_per_second": stream["events_per_second"],
        "batch_events_per_second": peer["events_per_second"],
        "ratio_streaming_to_batch": round(
            stream["events_per_second"] / peer["events_per_second"], 3
        ),
        "freshness_s": stream["freshness_s"],
        "counts": stream["counts"],
        "trainer": stream.get("trainer"),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
