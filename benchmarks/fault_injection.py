"""Faults at random points along the live chain, counted: nothing lost, nothing
applied twice.

    python -m benchmarks.fault_injection [--job-kills 4] [--daemon-kills 6]
        [--seed 1] [--json PATH]

One generated world goes through the real processes on an embedded broker of
its own (with a log directory, so it can die and come back):

1. **The streaming job** (``pipelines.build --streaming`` on Prism) reads the
   events topic and publishes examples. One whole run, to a topic of its own,
   times it; then it is SIGKILLed (with its Prism) at a uniformly random
   moment of such a run ``--job-kills`` times, and restarted;
   one more run has the broker SIGKILLed under it and restarted on its log.
   The last run goes to the end. The examples topic must then hold every
   example of the reference (the single-process oracle on the same events)
   exactly once.
2. **The trainer daemon** trains on that examples topic. It is SIGKILLed at a
   random moment after a checkpoint ``--daemon-kills`` times, once inside a
   checkpoint write, once after a bit of its newest checkpoint was flipped on
   disk, and once under a broker kill; then it drains the topic and exits.
   Following the final checkpoint's lineage back (the daemon's test-only
   applied-records log, one entry per checkpoint) must give every message of
   the topic exactly once.

Printed as one JSON object: faults injected by kind, examples / messages
expected, lost and doubled, and the hardware.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.generated import generated_tables
from benchmarks.machine import cpu_model
from demos.stream.processes import streaming_job_command
from features.example_messages import decode_example_message
from features.kafka import KafkaSettings, ensure_topics, topic_records
from launchers.kafka_broker import EmbeddedKafka
from pipelines.sources.event_stream import publish_events
from pipelines.sources.synthetic import GeneratorConfig
from trainer.training.checkpoint import PAUSE_ENV as CHECKPOINT_PAUSE_ENV
from trainer.training.checkpoint import list_checkpoints
from trainer.training.daemon import APPLIED_LOG_ENV

REPO = Path(__file__).resolve().parents[1]
EVENTS_TOPIC = "events"
EXAMPLES_TOPIC = "examples"
SHARDS = 4
TIMING_TOPIC = "examples-timing"


def _start(command: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    """A child in its own process group (the job's Prism dies with it)."""
    with open(log, "ab") as handle:
        return subprocess.Popen(
            command,
            cwd=REPO,
            env={**os.environ, **env},
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _job_command(
    settings: KafkaSettings, data: Path, out: Path, now: int, examples: str
) -> list[str]:
    return streaming_job_command(
        settings, data, out, topics=(EVENTS_TOPIC, examples), now_ms=now,
        shards=SHARDS, idle_seconds=1, granularity_ms=600_000,
    )  # fmt: skip


def _daemon_command(settings: KafkaSettings, work: Path) -> list[str]:
    return [
        sys.executable, "-m", "trainer.daemon",
        f"--kafka-bootstrap={settings.bootstrap}", f"--topic={EXAMPLES_TOPIC}",
        "--group=faults", f"--checkpoint-dir={work / 'ckpt'}", "--preset=tiny",
        "--checkpoint-every=2", "--idle-seconds=3",
    ]  # fmt: skip


def _broker_outage(broker: EmbeddedKafka, down_seconds: float) -> None:
    broker.kill()
    time.sleep(down_seconds)
    broker.start()  # same port, same log


def _example_ids(settings: KafkaSettings) -> list[str]:
    ids: list[str] = []
    for record in topic_records(settings, EXAMPLES_TOPIC):
        decoded = decode_example_message(record.value)
        if decoded.examples is None:
            raise RuntimeError(f"undecodable example message: {decoded.reason}")
        ids += decoded.examples.column("example_id").to_pylist()
    return ids


def streaming_faults(
    broker: EmbeddedKafka, work: Path, kills: int, rng: random.Random, seed: int
) -> dict[str, Any]:
    """Part 1: the streaming job under SIGKILLs and a broker outage."""
    data = work / "gen"
    tables = generated_tables(
        GeneratorConfig(users=60, ads=20, days=3, seed=seed), data
    )
    events, now = tables.events, tables.now_ms
    reference = tables.reference()
    expected = set(reference.examples.column("example_id").to_pylist())
    settings = broker.settings
    ensure_topics(
        settings, {EVENTS_TOPIC: 2, EXAMPLES_TOPIC: SHARDS, TIMING_TOPIC: SHARDS}
    )
    publish_events(events, settings, EVENTS_TOPIC)
    # Kill points are drawn over the length of one whole run (Prism's start-up
    # included), timed on a topic of its own: some land in start-up, some
    # mid-read, some mid-publish.
    started = time.monotonic()
    timing = _job_command(settings, data, work / "job-timing", now, TIMING_TOPIC)
    if _start(timing, work / "job.log").wait(timeout=600) != 0:
        raise RuntimeError(f"streaming job failed; see {work / 'job.log'}")
    run_seconds = time.monotonic() - started

    faults: Counter[str] = Counter()
    log = work / "job.log"
    for round_ in range(kills + 2):
        command = _job_command(
            settings, data, work / f"job-{round_}", now, EXAMPLES_TOPIC
        )
        job = _start(command, log)
        if round_ < kills:
            time.sleep(rng.uniform(0.1, 0.95) * run_seconds)
            # A kill drawn past the run's end finds it finished: not a fault.
            faults["streaming job SIGKILL" if job.poll() is None else "missed"] += 1
            _kill_group(job)
            continue
        if round_ == kills:  # the broker dies under a live run
            time.sleep(rng.uniform(0.2, 0.6) * run_seconds)
            _broker_outage(broker, 3.0)
            faults["broker SIGKILL + restart under the job"] += 1
        code = job.wait(timeout=600)
        if code != 0:
            raise RuntimeError(f"streaming job exited {code}; see {log}")
    ids = _example_ids(settings)
    return {
        "events": events.num_rows,
        "run_seconds": round(run_seconds, 1),
        "faults": dict(faults),
        "examples_expected": len(expected),
        "examples_on_topic": len(ids),
        "examples_lost": len(expected - set(ids)),
        "examples_doubled": len(ids) - len(set(ids)),
        "examples_unexpected": len(set(ids) - expected),
    }


def _newest_step(checkpoints: Path) -> int:
    paths = list_checkpoints(checkpoints)
    return int(paths[-1].name.removeprefix("ckpt-").split(".")[0]) if paths else -1


def _wait_for_new_checkpoint(
    process: subprocess.Popen[bytes], checkpoints: Path, timeout: float
) -> bool:
    before, deadline = _newest_step(checkpoints), time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if _newest_step(checkpoints) > before:
            return True
        time.sleep(0.02)
    return False


def _flip_a_bit(path: Path, rng: random.Random) -> None:
    """One bit inside the largest tensor's bytes: a flip in the zip's
    alignment padding would change nothing that is loaded."""
    with zipfile.ZipFile(path) as archive:
        largest = max(
            (i for i in archive.infolist() if "/data/" in i.filename),
            key=lambda i: i.file_size,
        )
    data = bytearray(path.read_bytes())
    # The local file header: 30 bytes, then the name and the extra field.
    name_length, extra_length = struct.unpack_from(
        "<HH", data, largest.header_offset + 26
    )
    start = largest.header_offset + 30 + name_length + extra_length
    at = start + rng.randrange(largest.file_size)
    data[at] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def applied_records(applied_log: Path, newest_lineage: str) -> list[tuple[int, int]]:
    """The (partition, offset) records in a checkpoint's state: the entries
    of its lineage chain, newest back to the first."""
    entries = {}
    for line in applied_log.read_text().splitlines():
        entry = json.loads(line)
        entries[entry["id"]] = entry
    records: list[tuple[int, int]] = []
    node: str | None = newest_lineage
    while node:
        records += [(int(p), int(o)) for p, o in entries[node]["records"]]
        node = entries[node]["parent"]
    return records


def daemon_faults(
    broker: EmbeddedKafka, work: Path, kills: int, rng: random.Random
) -> dict[str, Any]:
    """Part 2: the trainer daemon under SIGKILLs, a torn checkpoint write, a
    flipped bit and a broker outage, on the examples the job published."""
    from trainer.training.checkpoint import load_latest

    settings = broker.settings
    sent = [(r.partition, r.offset) for r in topic_records(settings, EXAMPLES_TOPIC)]
    checkpoints = work / "ckpt"
    log = work / "daemon.log"
    env = {APPLIED_LOG_ENV: str(work / "applied.jsonl")}
    command = _daemon_command(settings, work)
    faults: Counter[str] = Counter()
    flipped: Path | None = None
    plan = ["kill"] * kills + ["torn write", "bit flip", "broker"]
    rng.shuffle(plan)
    for fault in plan:
        pause = {CHECKPOINT_PAUSE_ENV: "2"} if fault == "torn write" else {}
        daemon = _start(command, log, **env, **pause)
        if fault == "torn write":
            deadline = time.monotonic() + 120
            while not any(checkpoints.glob(".ckpt-*.tmp")):
                if time.monotonic() > deadline or daemon.poll() is not None:
                    break
                time.sleep(0.02)
            time.sleep(0.1)
        elif not _wait_for_new_checkpoint(daemon, checkpoints, 120):
            _kill_group(daemon)
            break  # it drained the topic before the fault: nothing left to hit
        else:
            time.sleep(rng.uniform(0.0, 1.0))
        if fault == "broker":
            _broker_outage(broker, 3.0)
            time.sleep(rng.uniform(0.5, 2.0))
        alive = daemon.poll() is None
        _kill_group(daemon)
        if alive:
            faults["daemon SIGKILL" + ("" if fault == "kill" else f" ({fault})")] += 1
        if fault == "bit flip" and list_checkpoints(checkpoints):
            flipped = list_checkpoints(checkpoints)[-1]
            _flip_a_bit(flipped, rng)
            faults["bit flip in the newest checkpoint"] += 1
    daemon = _start(command, log, **env)
    code = daemon.wait(timeout=600)
    if code != 0:
        raise RuntimeError(f"the daemon exited {code}; see {log}")
    loaded = load_latest(checkpoints)
    if loaded is None:
        raise RuntimeError("the daemon left no readable checkpoint")
    applied = applied_records(work / "applied.jsonl", loaded[0]["lineage"])
    text = log.read_text(errors="replace")
    return {
        "messages": len(sent),
        "faults": dict(faults),
        "resumes": text.count("resumed from"),
        # The flipped checkpoint must be named in a warning, not resumed from.
        "bit_flip_caught": flipped is not None
        and f"resumed from {flipped}" not in text
        and any(
            "WARNING" in line and flipped.name in line for line in text.splitlines()
        ),
        "messages_lost": len(set(sent) - set(applied)),
        "messages_doubled": len(applied) - len(set(applied)),
        "messages_unexpected": len(set(applied) - set(sent)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fault_injection",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--job-kills", type=int, default=4, help="streaming job kills")
    parser.add_argument("--daemon-kills", type=int, default=6, help="daemon kills")
    parser.add_argument("--seed", type=int, default=1, help="world and kill points")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument(
        "--work-dir", type=Path, help="keep the logs here (default: a temp dir)"
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gem-faults-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        with EmbeddedKafka(home=work / "kafka") as broker:
            streaming = streaming_faults(broker, work, args.job_kills, rng, args.seed)
            daemon = daemon_faults(broker, work, args.daemon_kills, rng)
    result = {
        "streaming": streaming,
        "daemon": daemon,
        "seconds": round(time.monotonic() - started, 1),
        "hardware": cpu_model(),
        "load_average": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    nothing_lost = (
        streaming["examples_lost"] == streaming["examples_doubled"] == 0
        and daemon["messages_lost"] == daemon["messages_doubled"] == 0
        and daemon["bit_flip_caught"]
    )
    return 0 if nothing_lost else 1


if __name__ == "__main__":
    raise SystemExit(main())
