"""Start-up time and memory of the embedded Apache Kafka broker.

For ``--runs`` rounds, on one home folder:

- **fresh**: a new home (KRaft format + first start) until the broker answers;
- **restart**: a clean stop, then a start on the same data;
- **after SIGKILL**: a SIGKILL, then a start on the same data (log recovery,
  and the wait for the dead node's registration to lapse);
- **topic ready**: ``ensure_topics`` of a 6-partition topic on a fresh start.

Memory is the JVM's resident set (``/proc/PID/status`` VmRSS) once started,
and again after ``--messages`` 1 KB messages were produced (acks=all) and read
back, with the produce and consume rates; the rates are kafka-python's, next
to confluent-kafka's (librdkafka) on the same broker in the same run as the
peer. Prints the hardware and the load average.

Usage::

    python -m benchmarks.bench_broker [--runs 3] [--messages 100000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_generator import hardware
from features.kafka import KafkaSettings, ensure_topics
from launchers.kafka_broker import EmbeddedKafka

PAYLOAD = b"x" * 1024


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed(action: Callable[[], object]) -> float:
    """Seconds ``action`` takes."""
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def start_times(runs: int, workdir: Path) -> dict[str, list[float]]:
    """Seconds to an answering broker: fresh, restarted, restarted after SIGKILL."""
    found: dict[str, list[float]] = {
        "fresh": [],
        "restart": [],
        "after_sigkill": [],
        "topic_ready": [],
    }
    for run in range(runs):
        broker = EmbeddedKafka(home=workdir / f"start-{run}")
        found["fresh"].append(timed(broker.start))
        found["topic_ready"].append(
            timed(lambda b=broker: ensure_topics(b.settings, {"ready": 6}))
        )
        broker.stop()
        found["restart"].append(timed(broker.start))
        broker.kill()
        found["after_sigkill"].append(timed(broker.start))
        broker.stop()
    return found


def kafka_python_rates(
    settings: KafkaSettings, topic: str, messages: int
) -> dict[str, float]:
    """kafka-python's produce and consume rates of ``messages`` on ``topic``."""
    from kafka import TopicPartition

    producer = settings.producer(acks="all", linger_ms=5, batch_size=262_144)
    started = time.perf_counter()
    for _ in range(messages):
        producer.send(topic, PAYLOAD)
    producer.flush()
    produce_s = time.perf_counter() - started
    producer.close()
    consumer = settings.consumer(enable_auto_commit=False)
    partitions = sorted(consumer.partitions_for_topic(topic))
    tps = [TopicPartition(topic, p) for p in partitions]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    started, read = time.perf_counter(), 0
    while read < messages:
        for records in consumer.poll(timeout_ms=500, max_records=10_000).values():
            read += len(records)
    consume_s = time.perf_counter() - started
    consumer.close()
    return {
        "produce_per_s": messages / produce_s,
        "consume_per_s": messages / consume_s,
    }


def confluent_rates(bootstrap: str, topic: str, messages: int) -> dict[str, float]:
    """confluent-kafka's (librdkafka) rates on the same broker: the peer."""
    from confluent_kafka import Consumer, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    started = time.perf_counter()
    for _ in range(messages):
        while True:
            try:
                producer.produce(topic, PAYLOAD)
                break
            except BufferError:  # local queue full: let it drain
                producer.poll(0.05)
        producer.poll(0)
    producer.flush()
    produce_s = time.perf_counter() - started
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    started, read = time.perf_counter(), 0
    while read < messages:
        read += sum(1 for m in consumer.consume(10_000, timeout=0.5) if not m.error())
    consume_s = time.perf_counter() - started
    consumer.close()
    return {
        "produce_per_s": messages / produce_s,
        "consume_per_s": messages / consume_s,
    }


def memory_and_rates(messages: int, workdir: Path) -> dict[str, Any]:
    """RSS once started and after ``messages`` through each client, and the rates."""
    with EmbeddedKafka(home=workdir / "load") as broker:
        time.sleep(2)  # let start-up settle
        started_rss = rss_mb(broker.pid)
        ensure_topics(broker.settings, {"kp": 6, "ck": 6})
        python = kafka_python_rates(broker.settings, "kp", messages)
        confluent = confluent_rates(broker.bootstrap, "ck", messages)
        return {
            "rss_started_mb": started_rss,
            "rss_loaded_mb": rss_mb(broker.pid),
            "kafka_python": python,
            "confluent_kafka": confluent,
        }


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_broker",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=3, help="start-up rounds")
    parser.add_argument(
        "--messages", type=int, default=100_000, help="1 KB messages per client"
    )
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as tmp:
        starts = start_times(args.runs, Path(tmp))
        load = memory_and_rates(args.messages, Path(tmp))
    report = {
        "hardware": hardware(),
        "load_before": load_before,
        "load": os.getloadavg(),
        "start_s": starts,
        **load,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    hw = report["hardware"]
    print(
        f"hardware: {hw['cpu']}, {hw['usable_cores']} usable cores; load average "
        f"{load_before[0]:.1f} before, {report['load'][0]:.1f} after"
    )
    for name, values in starts.items():
        print(
            f"{name:>14}: median {statistics.median(values):.2f} s "
            f"(min {min(values):.2f}, max {max(values):.2f}, {len(values)} runs)"
        )
    print(
        f"broker RSS: {load['rss_started_mb']:.0f} MB started, "
        f"{load['rss_loaded_mb']:.0f} MB after {2 * args.messages:,} messages"
    )
    python, confluent = load["kafka_python"], load["confluent_kafka"]
    for what in ("produce_per_s", "consume_per_s"):
        print(
            f"{what.removesuffix('_per_s'):>8}: kafka-python {python[what]:,.0f}/s, "
            f"confluent-kafka {confluent[what]:,.0f}/s "
            f"(ratio {python[what] / confluent[what]:.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
