"""``make demo-stream``: the streaming job, Feast pushes and the trainer together.

    python -m demos.streaming [--users 300 --days 3 --rate 2000]
        [--broker-down-seconds 3] [--no-trainer] [--output demo-output/stream]

What runs, on the embedded broker, for a bounded time:

1. a generated world; its first day goes through the batch reference job
   (the historical backfill) so Feast has tables to register; the repository
   is applied (embedded SQLite online store);
2. the trainer daemon (``python -m trainer.daemon``) and the streaming job
   (``python -m pipelines.build --streaming --runner=DirectRunner``, which
   runs on Prism) start; a few malformed messages go to the events topic
   first, and their dead letters coming out of the job show that it reads;
3. the generator then publishes *every* event to the events topic at a steady
   rate (events in time order, as a live stream); the job keeps per-user /
   per-ad state, pushes fresh counters and sequences to Feast, publishes
   examples once their label window closes, dead-letters what is invalid or
   too late, and stops when the topic has been idle (``--stream-idle-seconds``);
   the trainer trains on the examples topic as they arrive;
4. half-way through the publishing the broker is killed (SIGKILL, as a crash)
   and started again on the same port and data ``--broker-down-seconds``
   later: the publisher, the job and the trainer wait for it and resume,
   and nothing is lost.

At the end one screen: counts that add up (events published = on the topic
= read = valid + dead letters; examples released = on the topic = trained
on, and the topic holds each of the batch job's examples of the same events
exactly once), events/s through the job, freshness p50 / p99 (event ->
example beyond the label window, event -> Feast online value, example ->
first training step), the trainer's progressive NE / AUC per (domain,
objective), and the outage. The figures also go to ``report.json``, and
``freshness.png`` plots the freshness samples and the NE over wall time, the
outage shaded. The exit status is 1 when the counts do not add up. Every
process it starts is stopped, also on Ctrl-C, SIGTERM or error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
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
from typing import IO, Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.example_messages import decode_example_message
from features.kafka import KafkaSettings, ensure_topics, topic_records
from launchers.kafka_broker import EmbeddedKafka
from pipelines.sources.event_stream import publish_events, publish_raw
from pipelines.streaming.config import LABEL_WINDOW_MS

ROOT = Path(__file__).resolve().parents[1]
GARBAGE = (b"\xff\xfe", b"{not json", b'{"event_id": "no-fields"}')
EVENTS_TOPIC: Final = "gem.events"
EXAMPLES_TOPIC: Final = "gem.examples"
DEAD_LETTER_TOPIC: Final = "gem.events.dead-letter"
READY_TIMEOUT_S: Final = 300.0
"""Prism's start-up on a loaded 2-core machine takes tens of seconds."""
JOB_TIMEOUT_S: Final = 1800.0
TRAINER_CATCH_UP_S: Final = 120.0
STOP_GRACE_S: Final = 20.0
MIN_WINDOWS: Final = 3
FRESHNESS = (
    ("event_to_example_beyond_window", "event -> example beyond window"),
    ("event_to_online_feature", "event -> Feast online value"),
    ("example_to_first_training_step", "example -> first training step"),
)


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
    broker_down_seconds: float = 0.0
    """The broker is SIGKILLed half-way through the publishing and started
    again this long after; 0 leaves it up."""
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


def _event_record(record: Any) -> dict[str, Any] | None:
    try:
        value = json.loads(record.value)
    except ValueError:
        return None
    if isinstance(value, dict) and isinstance(value.get("event_time"), int):
        return value
    return None


ExampleRecord = tuple[Any, pa.Table]
"""A message of the examples topic and its decoded examples."""


def _decoded_examples(records: list[Any]) -> list[ExampleRecord]:
    """The examples topic's messages with their examples, in offset order."""
    decoded = []
    for record in sorted(records, key=lambda r: r.offset):
        message = decode_example_message(record.value)
        if message.examples is not None:
            decoded.append((record, message.examples))
    return decoded


def _example_freshness(
    event_records: list[Any], example_records: list[ExampleRecord]
) -> tuple[list[tuple[float, float]], int]:
    """Per example, ``(wall time ms, age ms)``: when it reached Kafka, minus
    when its label window closed in the stream (the publish time of the first
    event at or after ``t + window``); and how many examples the final drain
    released (their window never closed in the stream, so they have no age)."""
    parsed = [(_event_record(r), r.timestamp) for r in event_records]
    pairs = [(value["event_time"], ts) for value, ts in parsed if value is not None]
    if not pairs:
        return [], 0
    event_times = np.asarray([t for t, _ in pairs], dtype=np.int64)
    published = np.asarray([ts for _, ts in pairs], dtype=np.int64)
    order = np.argsort(event_times, kind="stable")
    event_times, published = event_times[order], published[order]
    # The first publish time at or after each event time (a suffix minimum).
    first_after = np.minimum.accumulate(published[::-1])[::-1]
    samples: list[tuple[float, float]] = []
    drained = 0
    for record, examples in example_records:
        times = examples.column("event_time").cast(pa.int64()).to_numpy()
        at = np.searchsorted(event_times, times + LABEL_WINDOW_MS, side="left")
        inside = at < event_times.size
        drained += int((~inside).sum())
        ages = record.timestamp - first_after[at[inside]]
        samples.extend((float(record.timestamp), float(age)) for age in ages)
    return samples, drained


def _trainer_freshness(
    example_records: list[ExampleRecord], steps: list[dict[str, Any]]
) -> list[tuple[float, float]]:
    """Per example message: ``(wall time ms, age ms)`` of the first logged
    training step whose cumulative examples reach it (one partition, so the
    trainer consumes in topic order), the age counted from the message's
    Kafka time."""
    if not steps:
        return []
    step_examples = np.asarray([s["examples"] for s in steps], dtype=np.int64)
    step_times = np.asarray([s["time"] * 1000 for s in steps], dtype=np.float64)
    samples, total = [], 0
    for record, examples in example_records:
        total += examples.num_rows
        at = int(np.searchsorted(step_examples, total, side="left"))
        if at < step_examples.size:
            samples.append((step_times[at], step_times[at] - record.timestamp))
    return samples


def _online_rate(
    pushes: list[dict[str, Any]], events: int, first_publish: float
) -> float | None:
    """Events per second from the first publish to the last push of a
    freshly read event: what the job sustained while the stream was live
    (its start and the bounded run's idle tail left out)."""
    last = max((p["time"] for p in pushes if p["freshness_ms"]), default=None)
    if last is None or last <= first_publish:
        return None
    return round(events / (last - first_publish), 1)


def _feast_freshness(path: Path) -> list[tuple[float, float]]:
    """``(wall time ms of the push, age ms)`` of each sampled event."""
    if not path.exists():
        return []
    samples: list[tuple[float, float]] = []
    for line in path.read_text().splitlines():
        push = json.loads(line)
        samples.extend((push["time"] * 1000, age) for age in push["freshness_ms"])
    return samples


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def job_runner(summary: dict[str, Any]) -> dict[str, str | None]:
    """Which runner ran the job, and its Prism binary, from its summary."""
    return {"name": summary.get("runner", "unknown"), "prism": summary.get("prism")}


def run_stream_demo(config: StreamDemoConfig) -> dict[str, Any]:
    """Run everything (see the module docstring); returns the report."""
    from feast import FeatureStore

    from pipelines.core.reference import build_reference, read_input, write_output
    from pipelines.feast import ops as feast_ops
    from pipelines.sources.synthetic import (
        GeneratorConfig,
        generate_dataset,
        validation_now_ms,
    )

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
    # A checkpoint holds the offsets of an earlier run's examples topic.
    shutil.rmtree(out / "ckpt", ignore_errors=True)

    report: dict[str, Any] = {
        "events": events.num_rows,
        "malformed": len(GARBAGE),
        "rate": config.rate,
        "users": config.users,
        "days": config.days,
    }
    started_wall = time.time()
    shutil.rmtree(out / "kafka", ignore_errors=True)  # this run's topics only
    with EmbeddedKafka(home=out / "kafka") as broker, _Processes() as procs:
        settings = broker.settings
        ensure_topics(
            settings, {EVENTS_TOPIC: 4, EXAMPLES_TOPIC: 1, DEAD_LETTER_TOPIC: 1}
        )
        trainer = _start_trainer(settings, out, procs) if config.trainer else None
        job_started = time.monotonic()
        job = _start_job(settings, out, config, now, feast_state, project, procs)
        # The malformed messages go first: their dead letters show the job
        # reads, so publish times measure the job rather than its start-up.
        publish_raw(GARBAGE, settings, EVENTS_TOPIC, key=b"0")
        _wait_for_records(settings, DEAD_LETTER_TOPIC, len(GARBAGE), job, out)
        report["job_ready_seconds"] = round(time.monotonic() - job_started, 2)
        publisher = _Publisher(events, settings, config.rate)
        publisher.start()
        if config.broker_down_seconds > 0:
            time.sleep(events.num_rows / config.rate / 2)
            report["broker_outage"] = _kill_and_restart(
                broker, settings, config.broker_down_seconds, started_wall
            )
        report["published"] = publisher.result(
            timeout=events.num_rows / config.rate + config.broker_down_seconds + 300
        )
        report["published"]["started_at_s"] = round(
            publisher.started_wall - started_wall, 2
        )
        report["published_rate"] = report["published"]["rate"]
        try:
            code = job.wait(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"streaming job still running after {JOB_TIMEOUT_S:.0f} s; "
                f"see {out / 'job.log'}"
            ) from None
        if code != 0:
            raise RuntimeError(f"streaming job failed; see {out / 'job.log'}")
        report["job_seconds"] = round(time.monotonic() - job_started, 2)
        report["job_seconds_from_first_publish"] = round(
            time.monotonic() - publisher.started, 2
        )
        summary = json.loads((out / "job" / "stream_summary.json").read_text())
        if trainer is not None:
            _stop_trainer_when_caught_up(
                trainer,
                out / "trainer.jsonl",
                summary["counts"].get("examples_published", 0),
            )
        event_records = list(topic_records(settings, EVENTS_TOPIC))
        example_records = _decoded_examples(
            list(topic_records(settings, EXAMPLES_TOPIC))
        )
        dead = list(topic_records(settings, DEAD_LETTER_TOPIC))
    counts = summary["counts"]
    steps = _jsonl(out / "trainer.jsonl")
    report["runner"] = job_runner(summary)
    report["counts"] = counts
    report["dead_letters"] = len(dead)
    report["events_on_topic"] = len(event_records)
    # The batch job's examples of the same events: the stream must end with
    # each of them on the topic exactly once.
    reference = build_reference(events, users, ads, contents, now_ms=now)
    expected = set(reference.examples.column("example_id").to_pylist())
    ids = [i for _, ex in example_records for i in ex.column("example_id").to_pylist()]
    report["examples_on_topic"] = len(ids)
    report["examples_distinct"] = len(set(ids))
    report["examples_reference"] = len(expected)
    report["examples_missing"] = len(expected - set(ids))
    report["examples_not_in_reference"] = len(set(ids) - expected)
    report["events_per_second"] = round(
        counts.get("events_read", 0) / max(report["job_seconds"], 1e-9), 1
    )
    report["online_events_per_second"] = _online_rate(
        _jsonl(out / "freshness.jsonl"),
        counts.get("events_valid", 0),
        started_wall + report["published"]["started_at_s"],
    )
    released, drained = _example_freshness(event_records, example_records)
    report["examples_released_by_drain"] = drained
    online = _feast_freshness(out / "freshness.jsonl")
    trained = _trainer_freshness(example_records, steps)
    freshness = {
        "event -> Feast online value": online,
        "example -> first training step": trained,
    }
    report["freshness_s"] = {
        "event_to_example_beyond_window": _percentiles([a for _, a in released]),
        "event_to_online_feature": _percentiles([age for _, age in online]),
        "example_to_first_training_step": _percentiles([age for _, age in trained]),
    }
    if steps:
        last = steps[-1]
        report["trainer"] = {
            "steps": last["step"],
            "examples": last["examples"],
            # NaN (no positives yet) is not JSON: null instead.
            "lifetime": {
                key: {k: None if math.isnan(v) else v for k, v in values.items()}
                for key, values in last["lifetime"].items()
            },
        }
    report["checks"] = _checks(report, config.trainer)
    report["plot"] = str(
        _plot(
            out / "freshness.png",
            started_wall,
            {"event -> example beyond window": released, **freshness},
            steps,
            report,
        )
    )
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


class _Processes:
    """The child processes of a run, each in its own session, stopped in
    reverse order on the way out (also on error or Ctrl-C): SIGTERM to the
    whole group (the job's Prism and SDK workers with it), then SIGKILL."""

    def __init__(self) -> None:
        self._running: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []

    def start(self, command: list[str], log: Path) -> subprocess.Popen[bytes]:
        """Start ``command`` with its output in ``log``."""
        file = open(log, "wb")
        try:
            proc = subprocess.Popen(
                command,
                cwd=ROOT,
                stdout=file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            file.close()
            raise
        self._running.append((proc, file))
        return proc

    def __enter__(self) -> _Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc, file in reversed(self._running):
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            # What it started may outlive it (Prism under a killed job).
            _signal_group(proc, signal.SIGKILL)
            file.close()
        self._running = []


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


class _Publisher:
    """The events at a steady rate, on a thread; its error is re-raised by
    :meth:`result` rather than lost with the thread."""

    def __init__(self, events: pa.Table, settings: KafkaSettings, rate: float):
        self._events, self._settings, self._rate = events, settings, rate
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._report: dict[str, Any] | None = None
        self._error: BaseException | None = None
        self.started = 0.0
        self.started_wall = 0.0

    def start(self) -> None:
        """Begin publishing."""
        self.started, self.started_wall = time.monotonic(), time.time()
        self._thread.start()

    def _run(self) -> None:
        try:
            sent = publish_events(
                self._events, self._settings, EVENTS_TOPIC, rate=self._rate
            )
            self._report = {
                "messages": sent.messages,
                "seconds": round(sent.seconds, 2),
                "rate": round(sent.rate, 1),
            }
        except BaseException as error:
            self._error = error

    def result(self, timeout: float) -> dict[str, Any]:
        """Wait for every event to be acknowledged; what was sent."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the publisher did not finish within {timeout:.0f} s")
        if self._error is not None:
            raise RuntimeError("the publisher failed") from self._error
        assert self._report is not None
        return self._report


def _wait_for_records(
    settings: KafkaSettings,
    topic: str,
    count: int,
    job: subprocess.Popen[bytes],
    out: Path,
) -> None:
    """Until ``topic`` holds ``count`` records (the job exiting or
    ``READY_TIMEOUT_S`` passing first is an error)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**settings.consumer_config(group_id=None))
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            partitions = consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            if tps and sum(consumer.end_offsets(tps).values()) >= count:
                return
            if job.poll() is not None:
                raise RuntimeError(
                    f"streaming job exited ({job.returncode}) before reading; "
                    f"see {out / 'job.log'}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"streaming job read nothing within {READY_TIMEOUT_S:.0f} s; "
                    f"see {out / 'job.log'}"
                )
            time.sleep(0.25)
    finally:
        consumer.close()


def _kill_and_restart(
    broker: EmbeddedKafka,
    settings: KafkaSettings,
    down_seconds: float,
    started_wall: float,
) -> dict[str, float]:
    """SIGKILL the broker, wait, start it on the same port and data; the
    outage is from the kill until it answers again (the JVM's start-up
    included)."""
    killed = time.time()
    broker.kill()
    time.sleep(down_seconds)
    broker.start()
    back = time.time()
    if broker.bootstrap != settings.bootstrap:
        raise RuntimeError(f"broker came back on {broker.bootstrap}, not its port")
    return {
        "down_asked_seconds": down_seconds,
        "outage_seconds": round(back - killed, 2),
        "killed_at_s": round(killed - started_wall, 2),
        "back_at_s": round(back - started_wall, 2),
    }


def _start_job(
    settings: KafkaSettings,
    out: Path,
    config: StreamDemoConfig,
    now: int,
    feast_state: Path,
    project: str,
    procs: _Processes,
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
        f"--events-topic={EVENTS_TOPIC}",
        f"--examples-topic={EXAMPLES_TOPIC}",
        f"--dead-letter-topic={DEAD_LETTER_TOPIC}",
        f"--shards={config.shards}",
        f"--entity-shards={config.entity_shards}",
        f"--release-granularity-ms={config.granularity_ms}",
        f"--allowed-lateness-ms={config.allowed_lateness_ms}",
        # A broker that does not answer does not count as idle (the reader
        # probes it), so the outage cannot end the run.
        f"--stream-idle-seconds={config.idle_seconds}",
        f"--now-ms={now}",
        f"--feast-state-dir={feast_state}",
        f"--feast-project={project}",
        f"--freshness-jsonl={out / 'freshness.jsonl'}",
    ]
    return procs.start(command, out / "job.log")


def _stop_trainer_when_caught_up(
    trainer: subprocess.Popen[bytes], metrics: Path, examples: int
) -> None:
    """SIGTERM the daemon once it has trained on every published example
    (it checkpoints and exits 0), or after ``TRAINER_CATCH_UP_S``."""
    deadline = time.monotonic() + TRAINER_CATCH_UP_S
    while time.monotonic() < deadline and trainer.poll() is None:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if lines and json.loads(lines[-1])["examples"] >= examples:
            break
        time.sleep(0.5)
    if trainer.poll() is None:
        trainer.send_signal(signal.SIGTERM)
        trainer.wait(timeout=60)


def _start_trainer(
    settings: KafkaSettings, out: Path, procs: _Processes
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "trainer.daemon",
        f"--kafka-bootstrap={settings.bootstrap}",
        f"--topic={EXAMPLES_TOPIC}",
        "--group=gem-trainer",
        f"--checkpoint-dir={out / 'ckpt'}",
        "--preset=tiny",
        "--log-every=1",
        f"--metrics-jsonl={out / 'trainer.jsonl'}",
    ]
    return procs.start(command, out / "trainer.log")


def _checks(report: dict[str, Any], trainer: bool) -> dict[str, bool]:
    """The counts that must add up for "nothing lost"."""
    counts = report["counts"]
    read = counts.get("events_read", 0)
    released = counts.get("examples_published", 0)
    checks = {
        "published == on topic == read": report["published"]["messages"]
        + report["malformed"]
        == report["events_on_topic"]
        == read,
        "read == valid + dead letters": read
        == counts.get("events_valid", 0) + counts.get("events_dead_lettered", 0)
        and counts.get("events_dead_lettered", 0) == report["dead_letters"],
        "released == on topic": released == report["examples_on_topic"],
        "on topic once each": report["examples_distinct"]
        == report["examples_on_topic"],
        "on topic == batch reference": report["examples_missing"]
        == report["examples_not_in_reference"]
        == 0,
    }
    if trainer:
        trained = report.get("trainer", {}).get("examples", 0)
        checks["on topic == trained on"] = report["examples_on_topic"] == trained
    return checks


def _ne_series(steps: list[dict[str, Any]]) -> tuple[str, dict[str, list[Any]]]:
    """NE per (domain, objective) over the records: the closed windows where
    every key has closed at least ``MIN_WINDOWS`` of them, else the lifetime
    figures (a small run closes few or none)."""

    def series(scope: str) -> dict[str, list[tuple[float, float]]]:
        found: dict[str, list[tuple[float, float]]] = {}
        for step in steps:
            for key, values in step[scope].items():
                if not math.isnan(values["ne"]):
                    found.setdefault(key, []).append((step["time"], values["ne"]))
        return found

    lifetime, window = series("lifetime"), series("window")
    closed = {key: len({ne for _, ne in points}) for key, points in window.items()}
    if lifetime and all(closed.get(key, 0) >= MIN_WINDOWS for key in lifetime):
        return "window", window
    return "lifetime", lifetime


def _plot(
    path: Path,
    started_wall: float,
    freshness: dict[str, list[tuple[float, float]]],
    steps: list[dict[str, Any]],
    report: dict[str, Any],
) -> Path:
    """Freshness samples (at the time each was measured) and progressive NE
    over wall time since the broker started, with the publishing and the
    broker outage shaded in both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7.5), sharex=True)
    for (label, samples), marker in zip(freshness.items(), "+.x", strict=False):
        if samples:
            xs = [t / 1000 - started_wall for t, _ in samples]
            ys = [age / 1000 for _, age in samples]
            top.plot(xs, ys, marker, markersize=4, alpha=0.5, label=label)
    top.set_ylabel("freshness, s")
    top.set_title("freshness samples, at the time each was measured")
    scope, series = _ne_series(steps)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    domains = sorted({key.split("/")[0] for key in series})
    for key in sorted(series):
        domain, objective = key.split("/")
        bottom.plot(
            [t - started_wall for t, _ in series[key]],
            [ne for _, ne in series[key]],
            "-" if objective == "click" else "--",
            color=colors[domains.index(domain) % len(colors)],
            label=key,
        )
    bottom.set_ylabel(f"progressive NE ({scope})")
    bottom.set_xlabel("wall time since the broker started, s")
    bottom.set_title("trainer: progressive NE per domain / objective")
    sent, outage = report["published"], report.get("broker_outage")
    for ax in (top, bottom):
        # Labelled once: the top panel's legend explains both.
        ax.axvspan(
            sent["started_at_s"],
            sent["started_at_s"] + sent["seconds"],
            color="grey",
            alpha=0.12,
            label="events being published" if ax is top else None,
        )
        if outage:
            ax.axvspan(
                outage["killed_at_s"],
                outage["back_at_s"],
                color="red",
                alpha=0.15,
                label="broker down" if ax is top else None,
            )
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small", loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render(report: dict[str, Any], output: Path) -> str:
    """The one screen printed at the end (``report.json`` has everything)."""
    counts = report["counts"]
    checks = report["checks"]
    sent = report["published"]
    trained = report.get("trainer")
    read = counts.get("events_read", 0)

    def row(label: str, value: int, note: str = "", *names: str) -> str:
        verdict = "ok" if all(checks[n] for n in names) else "MISMATCH"
        return (
            f"  {label:<22}{value:>8,}  {note:<36}{verdict if names else ''}".rstrip()
        )

    lines = [
        f"demo-stream: {report['events']:,} events ({report['users']} users, "
        f"{report['days']} days) at {report['rate']:,.0f}/s; job on "
        f"{report['runner']['name']}",
    ]
    outage = report.get("broker_outage")
    if outage:
        lines.append(
            f"broker outage {outage['outage_seconds']:.1f} s: SIGKILL at "
            f"{outage['killed_at_s']:.1f} s, down {outage['down_asked_seconds']:g} s, "
            f"answering again at {outage['back_at_s']:.1f} s"
        )
    else:
        lines.append("broker: no outage (--broker-down-seconds 0)")
    lines += [
        "",
        "counts (nothing lost)",
        row(
            "events published",
            sent["messages"] + report["malformed"],
            f"{sent['messages']:,} + {report['malformed']} malformed, "
            f"acked in {sent['seconds']:.1f} s",
        ),
        row(
            "on the events topic",
            report["events_on_topic"],
            "= published = read",
            "published == on topic == read",
        ),
        row(
            "read by the job",
            read,
            f"= {counts.get('events_valid', 0):,} valid "
            f"+ {counts.get('events_dead_lettered', 0):,} dead letters",
            "read == valid + dead letters",
        ),
        row("examples released", counts.get("examples_published", 0)),
        row(
            "on the examples topic",
            report["examples_on_topic"],
            "= released",
            "released == on topic",
        ),
        row(
            "distinct examples",
            report["examples_distinct"],
            f"= on the topic = batch job's {report['examples_reference']:,}",
            "on topic once each",
            "on topic == batch reference",
        ),
    ]
    twice = report["examples_on_topic"] - report["examples_distinct"]
    if twice or report["examples_missing"] or report["examples_not_in_reference"]:
        lines.append(
            f"{'':>34}{twice:,} more than once, {report['examples_missing']:,} "
            f"missing, {report['examples_not_in_reference']:,} not the batch job's"
        )
    if trained:
        lines.append(
            row(
                "trained on",
                trained["examples"],
                f"= on the topic ({trained['steps']} steps)",
                "on topic == trained on",
            )
        )
    lines += [
        row("Feast rows pushed", counts.get("feast_rows_pushed", 0)),
        "",
        f"job: {report['events_per_second']:,.1f} events/s ({read:,} in "
        f"{report['job_seconds']:.1f} s, start to exit; "
        f"{report['job_seconds_from_first_publish']:.1f} s after the first event)",
        f"     {_rate(report['online_events_per_second'])} events/s while live "
        "(first publish -> last event online)",
        "",
        f"{'freshness, s':<33}{'p50':>6}  {'p99':>6}  {'samples':>7}",
    ]
    for key, label in FRESHNESS:
        figures = report["freshness_s"][key]
        lines.append(
            f"  {label:<31}{_seconds(figures['p50']):>6}  "
            f"{_seconds(figures['p99']):>6}  {figures['n']:>7,}"
        )
    if trained:
        lines += [
            "",
            f"{'lifetime NE / AUC, step ' + str(trained['steps']):<32}"
            f"{'examples':>8}{'NE':>8}{'AUC':>8}",
        ]
        for key, values in sorted(trained["lifetime"].items()):
            lines.append(
                f"  {key:<30}{values['count']:>8,.0f}{_figure(values['ne']):>8}"
                f"{_figure(values['auc']):>8}"
            )
    lines += ["", f"report {output / 'report.json'}", f"plot   {report['plot']}"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m demos.streaming")
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument(
        "--broker-down-seconds",
        type=float,
        default=3.0,
        help="SIGKILL the broker half-way through the publishing and start it "
        "again this long after (0: no outage)",
    )
    parser.add_argument("--no-trainer", action="store_true")
    parser.add_argument("--output", type=Path, default=ROOT / "demo-output" / "stream")
    args = parser.parse_args(argv)
    # A SIGTERM unwinds like Ctrl-C, so the children (each in its own
    # session) and the broker are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    report = run_stream_demo(
        StreamDemoConfig(
            users=args.users,
            days=args.days,
            rate=args.rate,
            broker_down_seconds=args.broker_down_seconds,
            trainer=not args.no_trainer,
            output=args.output,
        )
    )
    print(render(report, args.output))
    return 0 if all(report["checks"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
