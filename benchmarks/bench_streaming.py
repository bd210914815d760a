"""Streaming job: sustained events/s with the trainer beside it, and freshness;
or a soak: memory over a long live stream.

    python -m benchmarks.bench_streaming [--users 300 --days 3 --rate 2000]
        [--broker-down-seconds 3]
    python -m benchmarks.bench_streaming --soak-seconds 600 --rate 300

One run of :func:`demos.stream.run.run_stream_demo` (generator at a
steady rate -> streaming job on Prism with Feast pushes -> trainer daemon,
all on the embedded broker, which ``--broker-down-seconds`` kills half-way
through the publishing and restarts that long after), and its peer in the
same run: the batch feature job (``pipelines.build --runner=FnApiRunner``) on
the same events from files. Printed as one JSON object (and the table row of
``benchmarks/README.md``): the runner of each, events/s of both and their
ratio, and freshness p50 / p99 (event -> example on Kafka beyond the label
window, event -> Feast online value, example -> first training step), the
counts and whether they add up, the outage, with the hardware and the load
average (the machine is shared).

The soak (``--soak-seconds``) publishes a generated stream at ``--rate`` for
that long to the embedded broker while the streaming job reads it (a bounded
run: it ends once the topic is idle), and samples the resident memory of the
job (with its children) and of the broker every 10 s until the job ends.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from benchmarks.machine import machine_and_load
from demos.stream.config import RUN_FLAGS, StreamDemoConfig
from demos.stream.processes import streaming_job_command
from demos.stream.report import job_runner
from demos.stream.run import run_stream_demo
from features.config_flags import add_config_flags, config_fields


def batch_peer(data: Path, out: Path) -> dict[str, Any]:
    """The batch job on the same events: events/s, and the runner that ran it."""
    from pipelines import build

    started = time.monotonic()
    summary = build.run(
        [f"--input={data}", f"--output={out}", "--runner=FnApiRunner", "--shards=4"]
    )
    seconds = time.monotonic() - started
    events = summary["counts"]["events_read"]
    return {
        "runner": summary.get("runner"),
        "events": events,
        "seconds": round(seconds, 2),
        "events_per_second": round(events / seconds, 1),
    }


def _rss_mb(pid: int) -> float:
    """Resident memory of a process and its children, MB (0 once it is gone)."""
    import psutil

    try:
        process = psutil.Process(pid)
        total = process.memory_info().rss
        for child in process.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.Error:
                continue
    except psutil.Error:
        return 0.0
    return total / 2**20


def soak(seconds: float, rate: float, output: Path, days: int) -> dict[str, Any]:
    """Publish for ``seconds`` at ``rate`` while the job runs; RSS every 10 s."""
    import subprocess
    import threading

    from features.kafka import ensure_topics
    from launchers.kafka_broker import EmbeddedKafka
    from pipelines.core.reference import read_input
    from pipelines.sources.event_stream import publish_events
    from pipelines.sources.synthetic import (
        GeneratorConfig,
        generate_dataset,
        validation_now_ms,
    )

    wanted = int(seconds * rate)
    # About 12 events per user and day in the generated world; 20 % spare.
    # The state a stream needs is bounded once its users outgrow the kept
    # tail and its event time the counter horizon: more days, fewer users.
    users = max(100, int(wanted / (12 * days) * 1.2))
    world = GeneratorConfig(users=users, ads=200, days=days)
    generate_dataset(world, output / "gen")
    events = read_input(output / "gen")[0].sort_by([("event_time", "ascending")])
    events = events.slice(0, min(wanted, events.num_rows))
    samples: list[dict[str, Any]] = []
    with EmbeddedKafka(home=output / "kafka") as broker:
        settings = broker.settings
        ensure_topics(settings, {"gem.events": 4, "gem.examples": 4})
        with open(output / "job.log", "wb") as job_log:
            job = subprocess.Popen(
                streaming_job_command(
                    settings,
                    output / "gen",
                    output / "job",
                    topics=("gem.events", "gem.examples"),
                    now_ms=validation_now_ms(world),
                    shards=4,
                    idle_seconds=5,
                ),
                stdout=subprocess.DEVNULL,
                stderr=job_log,
                start_new_session=True,  # its Prism goes with it on a kill
            )
        publisher = threading.Thread(
            target=publish_events,
            args=(events, settings, "gem.events"),
            kwargs={"rate": rate},
        )
        started = time.monotonic()
        publisher.start()
        try:
            while job.poll() is None:
                samples.append(
                    {
                        "t_s": round(time.monotonic() - started, 1),
                        "job_rss_mb": round(_rss_mb(job.pid), 1),
                        "broker_rss_mb": round(_rss_mb(broker.pid), 1),
                        "publishing": publisher.is_alive(),
                    }
                )
                time.sleep(10)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
            publisher.join()
    summary_path = output / "job" / "stream_summary.json"
    if job.returncode != 0 or not summary_path.exists():
        errors = [
            line
            for line in (output / "job.log").read_text(errors="replace").splitlines()
            if "Error" in line
        ]
        summary = {"counts": {}, "error": errors[-1] if errors else "no summary"}
    else:
        summary = json.loads(summary_path.read_text())
    return {
        **machine_and_load(),
        "events": events.num_rows,
        "rate": rate,
        "days": days,
        "users": users,
        "publish_seconds": round(events.num_rows / rate, 1),
        "job_seconds": round(time.monotonic() - started, 1),
        "job_exit": job.returncode,
        "runner": job_runner(summary),
        "peak_job_rss_mb": max(s["job_rss_mb"] for s in samples),
        "counts": summary["counts"],
        "error": summary.get("error"),
        "samples": samples,
    }


def plot_soak(result: dict[str, Any], path: Path) -> Path:
    """Resident memory of the job and the broker over the soak, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainer.metrics.reporting import save_png

    samples = result["samples"]
    times = [s["t_s"] for s in samples]
    figure, axis = plt.subplots(figsize=(8, 4))
    axis.plot(
        times, [s["job_rss_mb"] for s in samples], label="streaming job (+ Prism)"
    )
    axis.plot(times, [s["broker_rss_mb"] for s in samples], label="broker")
    publishing = [s["t_s"] for s in samples if s["publishing"]]
    if publishing:
        axis.axvspan(0, max(publishing), color="0.9", label="publishing")
    axis.set_xlabel("seconds since the stream started")
    axis.set_ylabel("resident memory (MB)")
    axis.set_title(
        f"soak: {result['events']:,} events at {result['rate']:,.0f}/s "
        f"({result['days']} days of event time) on "
        f"{(result.get('runner') or {}).get('name', '?')}"
    )
    axis.legend(loc="upper left")
    axis.set_ylim(bottom=0)
    return save_png(figure, path, dpi=100)


def main() -> int:
    """Run the benchmark once and print its figures."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_streaming")
    add_config_flags(parser, StreamDemoConfig, only=RUN_FLAGS)
    # The throughput figures are of a run without an outage, unless asked.
    parser.set_defaults(
        broker_down_seconds=0.0, output=Path("demo-output/bench-stream")
    )
    parser.add_argument(
        "--soak-seconds",
        type=float,
        help="soak instead: publish this long at --rate, sample RSS every 10 s",
    )
    args = parser.parse_args()
    shutil.rmtree(args.output, ignore_errors=True)
    if args.soak_seconds:
        args.output.mkdir(parents=True)
        result = soak(args.soak_seconds, args.rate, args.output, args.days)
        result["plot"] = str(plot_soak(result, args.output / "soak_rss.png"))
        print(json.dumps(result, indent=2))
        return 0
    stream = run_stream_demo(StreamDemoConfig(**config_fields(args, StreamDemoConfig)))
    peer = batch_peer(args.output / "gen", args.output / "batch")
    result = {
        **machine_and_load(),
        "streaming_runner": stream["runner"],
        "batch_runner": peer["runner"],
        "events": stream["events"],
        "rate_asked": args.rate,
        "streaming_events_per_second": stream["events_per_second"],
        "streaming_events_per_second_live": stream["online_events_per_second"],
        "batch_events_per_second": peer["events_per_second"],
        "ratio_streaming_to_batch": round(
            stream["events_per_second"] / peer["events_per_second"], 3
        ),
        "ratio_live_to_batch": round(
            (stream["online_events_per_second"] or 0) / peer["events_per_second"], 3
        ),
        "freshness_s": stream["freshness_s"],
        "counts": stream["counts"],
        "checks": stream["checks"],
        "broker_outage": stream.get("broker_outage"),
        "trainer": stream.get("trainer"),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
