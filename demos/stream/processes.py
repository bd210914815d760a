"""What one streaming demo run starts: the feature job and the trainer as
child processes, the publisher on a thread, and the broker outage."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from demos.stream.config import (
    DEAD_LETTER_TOPIC,
    EVENTS_TOPIC,
    EXAMPLES_TOPIC,
    READY_TIMEOUT_S,
    ROOT,
    STOP_GRACE_S,
    TRAINER_CATCH_UP_S,
    StreamDemoConfig,
)
from features.kafka import KafkaSettings
from launchers.kafka_broker import EmbeddedKafka
from pipelines.sources.event_stream import publish_events


class Processes:
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

    def __enter__(self) -> Processes:
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


class Publisher:
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


def wait_for_records(
    settings: KafkaSettings,
    topic: str,
    count: int,
    job: subprocess.Popen[bytes],
    out: Path,
) -> None:
    """Until ``topic`` holds ``count`` records (the job exiting or
    ``READY_TIMEOUT_S`` passing first is an error)."""
    from kafka import TopicPartition

    consumer = settings.consumer(group_id=None)
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


def kill_and_restart(
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


def streaming_job_command(
    settings: KafkaSettings,
    data: Path,
    out: Path,
    *,
    topics: tuple[str, str],
    now_ms: int,
    shards: int,
    idle_seconds: float,
    entity_shards: int = 2,
    granularity_ms: int = 3_600_000,
    extra: Sequence[str] = (),
) -> list[str]:
    """``python -m pipelines.build --streaming`` (DirectRunner, which runs it
    on Prism) from the ``(events, examples)`` topics on ``settings``' broker,
    the dimension tables of ``data`` and its output in ``out``; ``extra``
    flags last. A bounded run: it stops once the topic is ``idle_seconds``
    idle."""
    return [
        sys.executable,
        "-m",
        "pipelines.build",
        "--streaming",
        "--runner=DirectRunner",
        f"--input={data}",
        f"--output={out}",
        f"--kafka-bootstrap={settings.bootstrap}",
        f"--events-topic={topics[0]}",
        f"--examples-topic={topics[1]}",
        f"--shards={shards}",
        f"--entity-shards={entity_shards}",
        f"--release-granularity-ms={granularity_ms}",
        f"--stream-idle-seconds={idle_seconds}",
        f"--now-ms={now_ms}",
        *extra,
    ]


def demo_job_command(
    settings: KafkaSettings,
    out: Path,
    config: StreamDemoConfig,
    now: int,
    feast_state: Path,
    project: str,
) -> list[str]:
    """The demo's streaming job: its topics, dead letters, Feast pushes into
    ``feast_state`` and freshness samples under ``out``."""
    # A broker that does not answer does not count as idle (the reader
    # probes it), so the outage cannot end the run.
    return streaming_job_command(
        settings,
        out / "gen",
        out / "job",
        topics=(EVENTS_TOPIC, EXAMPLES_TOPIC),
        now_ms=now,
        shards=config.shards,
        idle_seconds=config.idle_seconds,
        entity_shards=config.entity_shards,
        granularity_ms=config.granularity_ms,
        extra=(
            f"--dead-letter-topic={DEAD_LETTER_TOPIC}",
            f"--allowed-lateness-ms={config.allowed_lateness_ms}",
            f"--feast-state-dir={feast_state}",
            f"--feast-project={project}",
            f"--freshness-jsonl={out / 'freshness.jsonl'}",
        ),
    )


def trainer_command(settings: KafkaSettings, out: Path) -> list[str]:
    """``python -m trainer.daemon`` on the examples topic, its metrics in
    ``out/trainer.jsonl``."""
    return [
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


def stop_trainer_when_caught_up(
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
