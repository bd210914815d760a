"""One streaming demo run, from the generated world to its report (see
:mod:`demos.streaming`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from demos.stream import freshness as fresh
from demos.stream import report as figures
from demos.stream.config import (
    DEAD_LETTER_TOPIC,
    EVENTS_TOPIC,
    EXAMPLES_TOPIC,
    GARBAGE,
    JOB_TIMEOUT_S,
    StreamDemoConfig,
)
from demos.stream.freshness import ExampleRecord
from demos.stream.plot import plot
from demos.stream.processes import (
    Processes,
    Publisher,
    demo_job_command,
    kill_and_restart,
    stop_trainer_when_caught_up,
    trainer_command,
    wait_for_records,
)
from features.kafka import ensure_topics, topic_records
from launchers.kafka_broker import EmbeddedKafka
from pipelines.sources.event_stream import publish_raw


@dataclass(frozen=True)
class _World:
    """The generated world of a run, its backfill applied to Feast."""

    events: pa.Table
    """Every event, in event-time order."""
    dimensions: tuple[pa.Table, pa.Table, pa.Table]
    """The users, ads and contents tables."""
    now: int
    feast_state: Path
    project: str


@dataclass(frozen=True)
class _Topics:
    """What the live part of a run left behind: the job's summary and the
    records of the three topics."""

    summary: dict[str, Any]
    events: list[Any]
    examples: list[ExampleRecord]
    dead_letters: list[Any]


def run_stream_demo(config: StreamDemoConfig) -> dict[str, Any]:
    """Run everything (see :mod:`demos.streaming`); returns the report."""
    out = config.output
    world = _prepare(config)
    report: dict[str, Any] = {
        "events": world.events.num_rows,
        "malformed": len(GARBAGE),
        "rate": config.rate,
        "users": config.users,
        "days": config.days,
    }
    started_wall = time.time()
    topics = _run_live(config, world, report, started_wall)
    _measure(report, topics, world, config, started_wall)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _prepare(config: StreamDemoConfig) -> _World:
    """Generate the world, build its first day with the batch reference job
    (the historical backfill) and apply the Feast repository on it."""
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
    generated = GeneratorConfig(
        users=config.users, ads=config.ads, days=config.days, seed=config.seed
    )
    now = validation_now_ms(generated)
    generate_dataset(generated, out / "gen")
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
    return _World(events, (users, ads, contents), now, feast_state, project)


def _run_live(
    config: StreamDemoConfig,
    world: _World,
    report: dict[str, Any],
    started_wall: float,
) -> _Topics:
    """The broker, the trainer and the streaming job; the publishing, with
    the outage half-way; then what the topics hold. Adds the publishing's and
    the job's timing to ``report``."""
    out, events = config.output, world.events
    shutil.rmtree(out / "kafka", ignore_errors=True)  # this run's topics only
    with EmbeddedKafka(home=out / "kafka") as broker, Processes() as procs:
        settings = broker.settings
        ensure_topics(
            settings, {EVENTS_TOPIC: 4, EXAMPLES_TOPIC: 1, DEAD_LETTER_TOPIC: 1}
        )
        trainer = (
            procs.start(trainer_command(settings, out), out / "trainer.log")
            if config.trainer
            else None
        )
        job_started = time.monotonic()
        job = procs.start(
            demo_job_command(
                settings, out, config, world.now, world.feast_state, world.project
            ),
            out / "job.log",
        )
        # The malformed messages go first: their dead letters show the job
        # reads, so publish times measure the job rather than its start-up.
        publish_raw(GARBAGE, settings, EVENTS_TOPIC, key=b"0")
        wait_for_records(settings, DEAD_LETTER_TOPIC, len(GARBAGE), job, out)
        report["job_ready_seconds"] = round(time.monotonic() - job_started, 2)
        publisher = Publisher(events, settings, config.rate)
        publisher.start()
        if config.broker_down_seconds > 0:
            time.sleep(events.num_rows / config.rate / 2)
            report["broker_outage"] = kill_and_restart(
                broker, settings, config.broker_down_seconds, started_wall
            )
        report["published"] = publisher.result(
            timeout=events.num_rows / config.rate + config.broker_down_seconds + 300
        )
        report["published"]["started_at_s"] = round(
            publisher.started_wall - started_wall, 2
        )
        report["published_rate"] = report["published"]["rate"]
        _wait_for_job(job, out)
        report["job_seconds"] = round(time.monotonic() - job_started, 2)
        report["job_seconds_from_first_publish"] = round(
            time.monotonic() - publisher.started, 2
        )
        summary = json.loads((out / "job" / "stream_summary.json").read_text())
        if trainer is not None:
            stop_trainer_when_caught_up(
                trainer,
                out / "trainer.jsonl",
                summary["counts"].get("examples_published", 0),
            )
        return _Topics(
            summary,
            list(topic_records(settings, EVENTS_TOPIC)),
            fresh.decoded_examples(list(topic_records(settings, EXAMPLES_TOPIC))),
            list(topic_records(settings, DEAD_LETTER_TOPIC)),
        )


def _wait_for_job(job: subprocess.Popen[bytes], out: Path) -> None:
    """Until the bounded streaming job exits; its failing is an error."""
    try:
        code = job.wait(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"streaming job still running after {JOB_TIMEOUT_S:.0f} s; "
            f"see {out / 'job.log'}"
        ) from None
    if code != 0:
        raise RuntimeError(f"streaming job failed; see {out / 'job.log'}")


def _measure(
    report: dict[str, Any],
    topics: _Topics,
    world: _World,
    config: StreamDemoConfig,
    started_wall: float,
) -> None:
    """Add the counts, the examples against the batch job's, the rates, the
    freshness, the trainer's figures, the checks and the plot to ``report``."""
    from pipelines.core.reference import build_reference

    out = config.output
    counts = topics.summary["counts"]
    steps = fresh.jsonl(out / "trainer.jsonl")
    pushes = fresh.jsonl(out / "freshness.jsonl")
    report["runner"] = figures.job_runner(topics.summary)
    report["counts"] = counts
    report["dead_letters"] = len(topics.dead_letters)
    report["events_on_topic"] = len(topics.events)
    reference = build_reference(world.events, *world.dimensions, now_ms=world.now)
    expected = set(reference.examples.column("example_id").to_pylist())
    report.update(figures.examples_report(topics.examples, expected))
    report["events_per_second"] = round(
        counts.get("events_read", 0) / max(report["job_seconds"], 1e-9), 1
    )
    report["online_events_per_second"] = fresh.online_rate(
        pushes,
        counts.get("events_valid", 0),
        started_wall + report["published"]["started_at_s"],
    )
    samples, drained = figures.freshness_samples(
        topics.events, topics.examples, pushes, steps
    )
    report["examples_released_by_drain"] = drained
    report["freshness_s"] = figures.freshness_report(samples)
    trainer = figures.trainer_report(steps)
    if trainer is not None:
        report["trainer"] = trainer
    report["checks"] = figures.checks(report, config.trainer)
    report["plot"] = str(
        plot(out / "freshness.png", started_wall, samples, steps, report)
    )
