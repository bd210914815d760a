"""Start-up of the streaming job's example publisher, by examples already on
the topic.

For each ``--examples`` count, a fresh examples topic of ``--partitions``
partitions is filled the way the streaming job fills it: example messages
(the contract's codec, ``--per-message`` examples each, cut from a generated
world) published in transactions with their release horizons
(:mod:`pipelines.streaming.example_transactions`). Then, timed:

- **publisher start**: what a restarted publisher does before it publishes,
  for every partition: start a transactional producer (aborting what a
  crashed one left open) and read the committed release horizon;
- **ledger scan** (the peer, ``--peer``): reading every example id already
  on the topic into a set, the start-up of a publisher that deduplicates
  against the topic itself.

Each is the median of ``--repeat`` runs, on the embedded broker, in one
process. The figure that matters is the ratio of the publisher's start-up at
the largest count to the smallest. Prints the hardware and the load average.

Usage::

    python -m benchmarks.bench_stream_startup [--examples 10000,2000000] \\
        [--partitions 4] [--per-message 1000] [--repeat 5] [--peer] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.bench_generator import hardware
from benchmarks.generated import generated_tables
from features.example_messages import (
    decode_example_message,
    encode_example_message,
    message_headers,
)
from features.kafka import KafkaSettings, ensure_topics, topic_records
from features.windows import timeline_segments
from launchers.kafka_broker import EmbeddedKafka
from pipelines.sources.synthetic import GeneratorConfig
from pipelines.streaming.example_transactions import Message, PartitionPublisher

MAX_SEQ_LEN = 64
MESSAGES_PER_TRANSACTION = 20
STEP_MS = 60_000


def one_message(per_message: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    """An example message of ``per_message`` examples of a generated world."""
    config = GeneratorConfig(users=400, ads=50, days=6, seed=11)
    reference = generated_tables(config).reference()
    examples = reference.examples.slice(0, per_message)
    if examples.num_rows < per_message:
        raise SystemExit(f"the generated world has {examples.num_rows} examples")
    segments = timeline_segments(examples, reference.timelines, MAX_SEQ_LEN)
    value = encode_example_message(examples, segments, max_seq_len=MAX_SEQ_LEN)
    return value, message_headers(examples)


def fill(
    settings: KafkaSettings,
    topic: str,
    group: str,
    partitions: int,
    messages: int,
    value: tuple[bytes, list[tuple[str, bytes]]],
) -> None:
    """``messages`` messages over the partitions, in transactions with horizons."""
    for partition in range(partitions):
        publisher = PartitionPublisher(settings, topic, group, partition, partitions)
        publisher.start()
        mine = messages // partitions + (partition < messages % partitions)
        release = 0
        while mine > 0:
            release += 1
            count = min(mine, MESSAGES_PER_TRANSACTION)
            batch = [
                Message(
                    at=release * STEP_MS, key=b"0", value=value[0], headers=value[1]
                )
                for _ in range(count)
            ]
            publisher.publish(batch, release * STEP_MS)
            mine -= count
        publisher.close()


def publisher_start(
    settings: KafkaSettings, topic: str, group: str, partitions: int
) -> None:
    """A restarted publisher's start-up on every partition."""
    for partition in range(partitions):
        publisher = PartitionPublisher(settings, topic, group, partition, partitions)
        publisher.start()
        if publisher.horizon <= 0:
            raise AssertionError(f"partition {partition} has no horizon")
        publisher.close()


def ledger_scan(settings: KafkaSettings, topic: str) -> None:
    """Every example id on the topic, into a set."""
    ids: set[str] = set()
    for record in topic_records(settings, topic):
        decoded = decode_example_message(record.value)
        if decoded.examples is not None:
            ids.update(decoded.examples.column("example_id").to_pylist())
    if not ids:
        raise AssertionError("the ledger read nothing")


def median_seconds(action: Callable[[], object], repeat: int) -> float:
    """Median wall seconds of ``repeat`` runs of ``action``."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def run(args: argparse.Namespace, settings: KafkaSettings) -> list[dict[str, Any]]:
    """One row per examples count."""
    value = one_message(args.per_message)
    rows = []
    for examples in args.examples:
        messages = max(1, examples // args.per_message)
        suffix = uuid.uuid4().hex[:8]
        topic, group = f"ex-{suffix}", f"job-{suffix}"
        ensure_topics(settings, {topic: args.partitions})
        started = time.perf_counter()
        fill(settings, topic, group, args.partitions, messages, value)
        row: dict[str, Any] = {
            "examples": messages * args.per_message,
            "messages": messages,
            "topic_mb": round(messages * len(value[0]) / 2**20, 1),
            "fill_s": round(time.perf_counter() - started, 1),
            "publisher_start_s": median_seconds(
                lambda t=topic, g=group: publisher_start(  # type: ignore[misc]
                    settings, t, g, args.partitions
                ),
                args.repeat,
            ),
        }
        if args.peer:
            row["ledger_scan_s"] = median_seconds(
                lambda t=topic: ledger_scan(settings, t),  # type: ignore[misc]
                1,
            )
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--examples",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[10_000, 2_000_000],
    )
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--per-message", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--peer", action="store_true", help="time the ledger scan")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as home:
        with EmbeddedKafka(home=Path(home)) as broker:
            rows = run(args, broker.settings)
    first = rows[0]["publisher_start_s"]
    for row in rows:
        row["start_vs_smallest"] = round(row["publisher_start_s"] / first, 3)
    report = {
        "hardware": hardware(),
        "load": os.getloadavg(),
        "partitions": args.partitions,
        "rows": rows,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['hardware']}, load {report['load'][0]:.1f}")
    print(
        "| examples | MB on topic | publisher start s | vs smallest | ledger scan s |"
    )
    for row in rows:
        print(
            f"| {row['examples']:,} | {row['topic_mb']} | "
            f"{row['publisher_start_s']:.3f} | {row['start_vs_smallest']} | "
            f"{row.get('ledger_scan_s', float('nan')):.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
