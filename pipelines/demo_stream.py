"""``make demo-stream``: the streaming job, Feast pushes and the trainer together.

    python -m pipelines.demo_stream [--users 300 --days 3 --rate 2000]
        [--pause-broker-seconds 3] [--output demo-output/stream]

What runs, on the embedded broker, for a bounded time:

1. a generated world; its first day goes through the batch reference job
   (the historical backfill) so Feast has tables to register; the repository
   is applied (embedded SQLite online store);
2. the generator publishes *every* event to the events topic at a steady
   rate (events in time order, as a live stream), plus a few malformed ones;
3. the streaming job (``python -m pipelines.build --streaming``) reads the
   topic, keeps per-user / per-ad state, pushes fresh counters and sequences
   to Feast, publishes examples once their label window closes, dead-letters
   what is invalid or too late; it stops when the topic has been idle
   (``--stream-idle-seconds``);
4. the trainer daemon (``python -m trainer.daemon``) trains on the examples
   topic as they arrive, until idle;
5. optionally the broker is paused (SIGSTOP) mid-stream and resumed
   (SIGCONT): everyone waits and catches up.

The report: events/s through the job, freshness (event publish -> example on
Kafka beyond the label window, -> Feast online, -> first training step that
used it), counts that add up, and the trainer's progressive NE. Every process
it starts is stopped, also on Ctrl-C or error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.example_messages import decode_example_message
from features.kafka import EmbeddedKafka, KafkaSettings, ensure_topics, topic_records
from pipelines.event_stream import publish_events, publish_raw
from pipelines.streaming.config import LABEL_WINDOW_MS

ROOT = Path(__file__).resolve().parents[1]
GARBAGE = (b"\xff\xfe", b"{not json", b'{"event_id": "no-fields"}')


@dataclass(frozen=True)
class StreamDemoConfig:
    """Sizes and timing of one demo (or benchmark) run."""

    users: int = 300
    ads: int = 60
    days: int = 3
    seed: int = 1
    rate: float = 2000.0
    shards: int = 4
    entity_shards: int = 2
    granularity_ms: int = 3_600_000
    allowed_lateness_ms: int = 60_000
    idle_seconds: float = 3.0
    pause_broker_seconds: float = 0.0
    trainer: bool = True
    output: Path = ROOT / "demo-output" / "stream"


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "n": 0}
    array = np.asarray(values, dtype=np.float64)
    return {
        "p50": round(float(np.percentile(array, 50)) / 1000, 3),
        "p99": round(float(np.percentile(array, 99)) / 1000, 3),
        "n": int(array.size),
    }


def _example_freshness(
    events: pa.Table, event_records: list[Any], example_records: list[Any]
) -> tuple[list[float], dict[str, int]]:
    """Per example: when it reached Kafka minus when its label window closed
    in the stream (the publish time of the first event at or after ``t +
    window + lateness``); examples released by the final drain are skipped
    (their window never closed in the stream)."""
    event_times = np.asarray(
        [json.loads(r.value)["event_time"] for r in event_records if _is_event(r)],
        dtype=np.int64,
    )
    published = np.asarray(
        [r.timestamp for r in event_records if _is_event(r)], dtype=np.int64
    )
    order = np.argsort(event_times, kind="stable")
    event_times, published = event_times[order], published[order]
    # The first publish time at or after each event time (a suffix minimum).
    first_after = np.minimum.accumulate(published[::-1])[::-1]
    ages: list[float] = []
    drained = 0
    for record in example_records:
        decoded = decode_example_message(record.value)
        if decoded.examples is None:
            continue
        times = decoded.examples.column("event_time").cast(pa.int64()).to_numpy()
        closes = times + LABEL_WINDOW_MS
        at = np.searchsorted(event_times, closes, side="left")
        inside = at < event_times.size
        drained += int((~inside).sum())
        ages.extend((record.timestamp - first_after[at[inside]]).tolist())
    return ages, {"examples_released_by_drain": drained}


def _is_event(record: Any) -> bool:
    try:
        value = json.loads(record.value)
    except ValueError:
        return False
    return isinstance(value, dict) and isinstance(value.get("event_time"), int)


def _trainer_freshness(example_records: list[Any], metrics_path: Path) -> list[float]:
    """Per example message: time of the first logged training step whose
    cumulative examples reach it (one partition, so consumption is in
    topic order) minus the message's Kafka time."""
    if not metrics_path.exists():
        return []
    steps = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    if not steps:
        return []
    step_examples = np.asarray([s["examples"] for s in steps], dtype=np.int64)
    step_times = np.asarray([s["time"] * 1000 for s in steps], dtype=np.float64)
    ordered = sorted(example_records, key=lambda r: r.offset)
    ages, total = [], 0
    for record in ordered:
        decoded = decode_example_message(record.value)
        if decoded.examples is None:
            continue
        total += decoded.examples.num_rows
        at = int(np.searchsorted(step_examples, total, side="left"))
        if at < step_examples.size:
            ages.append(float(step_times[at] - record.timestamp))
    return ages


def _feast_freshness(path: Path) -> list[float]:
    if not path.exists():
        return []
    ages: list[float] = []
    for line in path.read_text().splitlines():
        ages.extend(json.loads(line)["freshness_ms"])
    return ages


def run_stream_demo(config: StreamDemoConfig) -> dict[str, Any]:
    """Run everything (see the module docstring); returns the report."""
    from feast import FeatureStore

    from pipelines import feast_ops
    from pipelines.reference import build_reference, read_input, write_output
    from pipelines.synthetic import GeneratorConfig, generate_dataset, validation_now_ms

    out = config.output
    out.mkdir(parents=True, exist_ok=True)
    world = GeneratorConfig(
        users=config.users, ads=config.ads, days=config.days, seed=config.seed
    )
    now = validation_now_ms(world)
    generate_dataset(world, out / "gen")
    events, users, ads, contents = read_input(out / "gen")
    events = events.sort_by([("event_time", "ascending")])
    first_day_end = pc.min(events.column("event_time")).cast(pa.int64()).as_py()
    first_day_end += 86_400_000
    backfill = events.filter(
        pc.less(events.column("event_time").cast(pa.int64()), first_day_end)
    )
    history = build_reference(backfill, users, ads, contents, now_ms=now)
    write_output(history, out / "history", now_ms=now)
    project = f"stream{uuid.uuid4().hex[:6]}"
    feast_state = out / "feast"
    store = FeatureStore(
        config=feast_ops.repo_config("local", state_dir=feast_state, project=project)
    )
    feast_ops.apply(store, out / "history")
    for name in ("freshness.jsonl", "trainer.jsonl"):
        (out / name).unlink(missing_ok=True)

    report: dict[str, Any] = {"events": events.num_rows, "rate": config.rate}
    shutil.rmtree(out / "kafka", ignore_errors=True)  # this run's topics only
    with EmbeddedKafka(home=out / "kafka") as broker:
        settings = broker.settings
        ensure_topics(settings, {"gem.events": 4, "gem.examples": 1})
        procs: list[subprocess.Popen[bytes]] = []
        try:
            started = time.monotonic()
            publisher = threading.Thread(
                target=_publish,
                args=(events, settings, config.rate, report),
                daemon=True,
            )
            publisher.start()
            if config.trainer:
                procs.append(_start_trainer(settings, out))
            job = _start_job(settings, out, config, now, feast_state, project)
            procs.append(job)
            if config.pause_broker_seconds > 0:
                time.sleep(min(5.0, events.num_rows / config.rate / 3))
                os.kill(broker.pid, signal.SIGSTOP)
                time.sleep(config.pause_broker_seconds)
                os.kill(broker.pid, signal.SIGCONT)
                report["broker_paused_seconds"] = config.pause_broker_seconds
            publisher.join()
            if job.wait(timeout=3600) != 0:
                raise RuntimeError(f"streaming job failed; see {out / 'job.log'}")
            report["job_seconds"] = round(time.monotonic() - started, 2)
            published = json.loads((out / "job" / "stream_summary.json").read_text())
            if config.trainer:
                _stop_trainer_when_caught_up(
                    procs[0],
                    out / "trainer.jsonl",
                    published["counts"].get("examples_published", 0),
                )
            event_records = list(topic_records(settings, "gem.events"))
            example_records = list(topic_records(settings, "gem.examples"))
            dead = list(topic_records(settings, "gem.events.dead-letter"))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        proc.kill()
    summary = json.loads((out / "job" / "stream_summary.json").read_text())
    counts = summary["counts"]
    report["counts"] = counts
    report["dead_letters"] = len(dead)
    report["events_per_second"] = round(
        counts["events_read"] / max(report["job_seconds"], 1e-9), 1
    )
    ages, extra = _example_freshness(events, event_records, example_records)
    report.update(extra)
    report["freshness_s"] = {
        "event_to_example_beyond_window": _percentiles(ages),
        "event_to_online_feature": _percentiles(
            _feast_freshness(out / "freshness.jsonl")
        ),
        "example_to_first_training_step": _percentiles(
            _trainer_freshness(example_records, out / "trainer.jsonl")
        ),
    }
    trainer_lines = (
        (out / "trainer.jsonl").read_text().splitlines()
        if (out / "trainer.jsonl").exists()
        else []
    )
    if trainer_lines:
        last = json.loads(trainer_lines[-1])
        report["trainer"] = {"steps": last["step"], "examples": last["examples"]}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _publish(
    events: pa.Table, settings: KafkaSettings, rate: float, report: dict[str, Any]
) -> None:
    sent = publish_events(events, settings, "gem.events", rate=rate)
    publish_raw(GARBAGE, settings, "gem.events", key=b"0")
    report["published_rate"] = round(sent.rate, 1)


def _start_job(
    settings: KafkaSettings,
    out: Path,
    config: StreamDemoConfig,
    now: int,
    feast_state: Path,
    project: str,
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "pipelines.build",
        "--streaming",
        "--runner=DirectRunner",
        f"--input={out / 'gen'}",
        f"--output={out / 'job'}",
        f"--kafka-bootstrap={settings.bootstrap}",
        "--events-topic=gem.events",
        "--examples-topic=gem.examples",
        f"--shards={config.shards}",
        f"--entity-shards={config.entity_shards}",
        f"--release-granularity-ms={config.granularity_ms}",
        f"--allowed-lateness-ms={config.allowed_lateness_ms}",
        # A paused broker does not count as idle (the reader checks it answers).
        f"--stream-idle-seconds={config.idle_seconds}",
        f"--now-ms={now}",
        f"--feast-state-dir={feast_state}",
        f"--feast-project={project}",
        f"--freshness-jsonl={out / 'freshness.jsonl'}",
    ]
    log = open(out / "job.log", "wb")
    return subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def _stop_trainer_when_caught_up(
    trainer: subprocess.Popen[bytes], metrics: Path, examples: int
) -> None:
    """SIGTERM the daemon once it has trained on every published example
    (it checkpoints and exits 0), or after two minutes."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and trainer.poll() is None:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if lines and json.loads(lines[-1])["examples"] >= examples:
            break
        time.sleep(0.5)
    if trainer.poll() is None:
        trainer.send_signal(signal.SIGTERM)
        trainer.wait(timeout=60)


def _start_trainer(settings: KafkaSettings, out: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "trainer.daemon",
        f"--kafka-bootstrap={settings.bootstrap}",
        "--topic=gem.examples",
        "--group=gem-trainer",
        f"--checkpoint-dir={out / 'ckpt'}",
        "--log-every=1",
        f"--metrics-jsonl={out / 'trainer.jsonl'}",
    ]
    log = open(out / "trainer.log", "wb")
    return subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.demo_stream")
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--pause-broker-seconds", type=float, default=3.0)
    parser.add_argument("--no-trainer", action="store_true")
    parser.add_argument("--output", type=Path, default=ROOT / "demo-output" / "stream")
    args = parser.parse_args(argv)
    report = run_stream_demo(
        StreamDemoConfig(
            users=args.users,
            days=args.days,
            rate=args.rate,
            pause_broker_seconds=args.pause_broker_seconds,
            trainer=not args.no_trainer,
            output=args.output,
        )
    )
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
