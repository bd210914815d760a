"""Trainer daemon throughput, decode path and restart-to-first-step.

    python -m benchmarks.bench_daemon [--messages 200] [--per-message 64] \\
        [--repeat 3] [--restart-preset default] [--json]
    python -m benchmarks.bench_daemon --mode sharding [--messages 80] \\
        [--sharding-preset default] [--json]

Publishes ``--messages`` example messages (tiny generated set, codec of
:mod:`features.example_messages`) to the embedded broker, 2 partitions, then
measures, in this one process and on the same topic:

1. **daemon vs memory**: :func:`trainer.training.daemon.run_daemon_until_drained`
   (tiny GEM preset, progressive validation, checkpoints every 50 steps).
   Throughput is examples/s between the first and last log record (start-up,
   group join and the final idle wait excluded). Peer: the same messages
   decoded up front, then the same train loop (each batch scored by its
   step's forward) in a plain Python loop (no Kafka, no thread, no
   checkpoints). Ratio = daemon / peer.
2. **decode path alone**: kafka-python consumes the topic from the beginning
   (partitions assigned, no group) and turns every message into a
   :class:`~trainer.data.batch.Batch` (``decode_example_message`` + ``make_batch``,
   no model). Peer: confluent-kafka's raw consume of the same topic from the
   beginning, no decoding. Also kafka-python's raw consume, to split the
   decode path into client and codec. Best of ``--repeat``; each timing runs
   from consumer creation to the last message. Ratio = decode path / peer.
3. **restart-to-first-step**: ``python -m trainer.daemon --preset
   <restart-preset> --checkpoint-every 5 --max-steps 10 --log-every 1`` as a
   subprocess; once it has written its step-5 checkpoint it is SIGKILLed and
   started again on the same checkpoint directory and group. The figure is
   seconds from ``Popen`` to the ``time`` of its first metrics record (the
   first training step completed after the restore). Breakdown from its log
   timestamps (resume, partition assignment) plus, measured apart,
   interpreter + imports (a ``python -c "import trainer.training.daemon"`` child),
   the checkpoint load (``load_latest``), the model build and the first and
   second train step of a fresh model on one message (in this process).

``--mode sharding`` measures instead: 2 ranks under ``torchrun`` (gloo, 1
thread each) on the same topic, once with ``--sharding replicated`` and once
with ``--sharding model-parallel`` (each its own group and checkpoint
directory, ``--embedding-optimizer adagrad`` in both so only the placement
differs). Throughput is rank 0's examples/s between its first and last
metrics record; checkpoint size and time (gather to rank 0 + atomic write)
come from the daemon's ``checkpoint step`` log lines. Ratio = model-parallel
/ replicated.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from benchmarks.generated import example_chunks, generated_reference
from benchmarks.machine import machine_line
from features.example_messages import (
    decode_example_message,
    encode_example_message,
    message_headers,
)
from features.kafka import KafkaSettings, ensure_topics
from launchers.kafka_broker import EmbeddedKafka
from pipelines.sources.synthetic import GeneratorConfig
from trainer.data.inputs import make_batch
from trainer.metrics.progressive import ProgressiveMetrics
from trainer.models.config import preset as preset_config
from trainer.models.loss_wrapper import GEMTrain
from trainer.models.registry import build_model, model_config
from trainer.training.checkpoint import checkpoint_path, load_latest
from trainer.training.daemon import run_daemon_until_drained
from trainer.training.step import scored, train_step

MAX_LEN = 4096
TOPIC = "examples"
PARTITIONS = 2
FETCH_BYTES = 64 * 1024 * 1024
ROOT = Path(__file__).resolve().parent.parent


def hardware() -> str:
    """CPU model, core count, Python and torch versions."""
    return machine_line(torch, arch=True)


def kafka_python_consume(
    settings: KafkaSettings, count: int, *, decode: bool
) -> tuple[float, int, int]:
    """kafka-python from the beginning: (seconds, bytes, examples).

    With ``decode`` every message becomes a Batch (the daemon's decode path).
    """
    from kafka import TopicPartition

    started = time.perf_counter()
    consumer = settings.consumer(
        group_id=None,
        enable_auto_commit=False,
        max_partition_fetch_bytes=16 * 1024 * 1024,
        fetch_max_bytes=FETCH_BYTES,
    )
    partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    seen = size = examples = 0
    try:
        while seen < count:
            for messages in consumer.poll(timeout_ms=1000).values():
                for message in messages:
                    seen += 1
                    size += len(message.value)
                    if decode:
                        headers = list(message.headers or []) or None
                        decoded = decode_example_message(message.value, headers)
                        window = min(MAX_LEN, decoded.max_seq_len or MAX_LEN)
                        batch = make_batch(
                            decoded.examples, decoded.segments, max_seq_len=window
                        )
                        examples += batch.size
            if time.perf_counter() - started > 120:
                raise TimeoutError(f"kafka-python read {seen} of {count} messages")
        return time.perf_counter() - started, size, examples
    finally:
        consumer.close(autocommit=False)


def confluent_consume(settings: KafkaSettings, count: int) -> tuple[float, int, float]:
    """confluent-kafka raw consume from the beginning.

    Returns (seconds, bytes, seconds to the first message).
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    started = time.perf_counter()
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap,
            "group.id": "bench-raw",
            "enable.auto.commit": False,
            "fetch.max.bytes": FETCH_BYTES,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
            "receive.message.max.bytes": FETCH_BYTES + 1024 * 1024,
        }
    )
    consumer.assign(
        [TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
    )
    seen = size = 0
    first = 0.0
    try:
        while seen < count:
            # Ask for exactly what is left: consume() returns when it has that.
            wanted = min(1000, count - seen)
            for message in consumer.consume(num_messages=wanted, timeout=1.0):
                if message.error():
                    continue
                if not seen:
                    first = time.perf_counter() - started
                seen += 1
                size += len(message.value())
            if time.perf_counter() - started > 120:
                raise TimeoutError(f"confluent-kafka read {seen} of {count} messages")
        return time.perf_counter() - started, size, first
    finally:
        consumer.close()


def _log_time(log: str, needle: str) -> float | None:
    """Epoch seconds of the first daemon log line containing ``needle``."""
    for line in log.splitlines():
        if needle in line:
            stamp = " ".join(line.split(" ", 2)[:2])  # "%Y-%m-%d %H:%M:%S,%f"
            return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def _first_record(
    jsonl: Path, process: subprocess.Popen[bytes], limit: float
) -> dict[str, Any]:
    """Wait for the first metrics record of ``process``; returns it."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if jsonl.exists():
            lines = jsonl.read_text().splitlines()
            if lines and lines[0].endswith("}"):
                return json.loads(lines[0])
        if process.poll() is not None:
            raise RuntimeError(f"daemon exited ({process.returncode}) before a step")
        time.sleep(0.02)
    raise TimeoutError("no first step from the daemon")


def restart_to_first_step(
    settings: KafkaSettings, tmp: Path, preset: str, value: bytes
) -> dict[str, Any]:
    """Run, SIGKILL after the step-5 checkpoint, restart; time the restart."""
    ckpt = tmp / f"ckpt-{preset}"
    command = [
        sys.executable, "-m", "trainer.daemon",
        f"--kafka-bootstrap={settings.bootstrap}", "--topic", TOPIC,
        "--group", f"restart-{preset}", "--checkpoint-dir", str(ckpt),
        "--preset", preset, "--checkpoint-every", "5", "--max-steps", "10",
        "--log-every", "1",
    ]  # fmt: skip

    def launch(name: str) -> tuple[subprocess.Popen[bytes], float, Path, Path]:
        jsonl, log = tmp / f"{name}.jsonl", tmp / f"{name}.log"
        with open(log, "wb") as stderr:  # the child keeps its own descriptor
            started = time.time()
            process = subprocess.Popen(
                [*command, "--metrics-jsonl", str(jsonl)],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        return process, started, jsonl, log

    # First life: cold start, until the step-5 checkpoint is on disk, then kill.
    first, first_start, first_jsonl, _ = launch("first")
    cold = _first_record(first_jsonl, first, 300)["time"] - first_start
    target = checkpoint_path(ckpt, 5)
    deadline = time.monotonic() + 300
    while not target.exists() and first.poll() is None:
        if time.monotonic() > deadline:
            raise TimeoutError("no step-5 checkpoint")
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait()
    steps_before_kill = len(first_jsonl.read_text().splitlines())

    # Second life: restart on the same checkpoint dir and group.
    second, start, jsonl, log = launch("restart")
    record = _first_record(jsonl, second, 300)
    try:
        second.wait(timeout=300)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    text = log.read_text()
    resumed = _log_time(text, "resumed from")
    assigned = _log_time(text, "assigned ")

    # Measured apart: interpreter + imports, checkpoint load, model build.
    t = time.time()
    subprocess.run(
        [sys.executable, "-c", "import trainer.training.daemon"], cwd=ROOT, check=True
    )
    imports = time.time() - t
    t = time.perf_counter()
    loaded = load_latest(ckpt)
    load = time.perf_counter() - t
    assert loaded is not None
    size = loaded[1].stat().st_size
    t = time.perf_counter()
    model = GEMTrain(build_model("gem", preset))
    build = time.perf_counter() - t
    # The first train step of a fresh model (scoring from its forward, as
    # the daemon's progressive validation does), then a second one.
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    decoded = decode_example_message(value)
    window = min(
        model_config("gem", preset_config(preset)).embedding.max_seq_len, MAX_LEN
    )
    batch = make_batch(decoded.examples, decoded.segments, max_seq_len=window)
    steps = []
    for _ in range(2):
        t = time.perf_counter()
        scored(train_step(model, batch, optimizer).logits, batch)
        steps.append(time.perf_counter() - t)

    total = record["time"] - start
    out: dict[str, Any] = {
        "preset": preset,
        "cold_start_to_first_step_s": round(cold, 2),
        "steps_before_sigkill": steps_before_kill,
        "checkpoint_mb": round(size / 1e6, 1),
        "restart_first_step": record["step"],
        "restart_to_first_step_s": round(total, 2),
        "interpreter_imports_s": round(imports, 2),
        "model_build_s": round(build, 2),
        "checkpoint_load_s": round(load, 2),
        "first_step_compute_s": round(steps[0], 2),
        "second_step_compute_s": round(steps[1], 2),
    }
    if resumed is not None and assigned is not None:
        out["start_to_resumed_s"] = round(resumed - start, 2)
        out["resumed_to_assigned_s"] = round(assigned - resumed, 2)  # group join
        out["assigned_to_first_step_s"] = round(record["time"] - assigned, 2)
    return out


def _checkpoint_lines(log: str) -> list[tuple[float, float, float]]:
    """(MB, gather s, write s) of every ``checkpoint step`` log line."""
    out = []
    for line in log.splitlines():
        if "checkpoint step" in line and " MB, gather " in line:
            words = line.replace(",", "").split()
            at = words.index("MB")
            out.append(
                (float(words[at - 1]), float(words[at + 2]), float(words[at + 5]))
            )
    return out


def two_ranks(
    settings: KafkaSettings, tmp: Path, sharding: str, preset: str
) -> dict[str, Any]:
    """One drained 2-rank torchrun daemon run; its throughput and checkpoints."""
    jsonl, log = tmp / f"{sharding}.jsonl", tmp / f"{sharding}.log"
    command = [
        str(Path(sys.executable).with_name("torchrun")), "--standalone",
        "--nproc-per-node", "2", "-m", "trainer.daemon",
        f"--kafka-bootstrap={settings.bootstrap}", "--topic", TOPIC,
        "--group", f"bench-{sharding}", "--checkpoint-dir", str(tmp / sharding),
        "--preset", preset, "--sharding", sharding,
        "--embedding-optimizer", "adagrad", "--checkpoint-every", "10",
        "--log-every", "5", "--idle-seconds", "3", "--metrics-jsonl", str(jsonl),
    ]  # fmt: skip
    started = time.perf_counter()
    with open(log, "wb") as output:
        subprocess.run(
            command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=1800,
        )  # fmt: skip
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    first, last = records[0], records[-2]  # the last record is the post-idle one
    rate = (last["examples"] - first["examples"]) / (last["time"] - first["time"])
    checkpoints = _checkpoint_lines(log.read_text())
    loaded = load_latest(tmp / sharding)
    assert loaded is not None
    return {
        "examples_per_s": round(rate, 1),
        "steps": records[-1]["step"],
        "wall_s": round(wall, 1),
        "checkpoints": len(checkpoints),
        "checkpoint_mb": checkpoints[-1][0],
        "checkpoint_gather_s": round(min(c[1] for c in checkpoints), 3),
        "checkpoint_write_s": round(min(c[2] for c in checkpoints), 3),
        "checkpoint_file_mb": round(loaded[1].stat().st_size / 1e6, 2),
    }


def publish_topic(settings: KafkaSettings, values: list[bytes]) -> None:
    """:data:`TOPIC` with :data:`PARTITIONS`, holding ``values`` round-robin."""
    ensure_topics(settings, {TOPIC: PARTITIONS})
    producer = settings.producer(max_request_size=64 * 1024 * 1024)
    for i, value in enumerate(values):
        producer.send(
            TOPIC, value=value, partition=i % PARTITIONS, headers=message_headers()
        )
    producer.flush()
    producer.close()


def sharding_mode(args: argparse.Namespace, values: list[bytes]) -> dict[str, Any]:
    """2 replicated ranks vs 2 model-parallel ranks on the same topic."""
    with EmbeddedKafka() as broker, tempfile.TemporaryDirectory() as tmp:
        settings = dataclasses.replace(
            broker.settings, session_timeout_ms=6000, heartbeat_interval_ms=1000
        )
        publish_topic(settings, values)
        runs = {
            sharding: two_ranks(settings, Path(tmp), sharding, args.sharding_preset)
            for sharding in ("replicated", "model-parallel")
        }
    replicated, sharded = runs["replicated"], runs["model-parallel"]
    return {
        "hardware": hardware(),
        "preset": args.sharding_preset,
        "messages": len(values),
        "examples_per_message": args.per_message,
        **{f"replicated_{k}": v for k, v in replicated.items()},
        **{f"model_parallel_{k}": v for k, v in sharded.items()},
        "ratio_model_parallel_vs_replicated": round(
            sharded["examples_per_s"] / replicated["examples_per_s"], 3
        ),
    }


def main() -> int:
    """Run everything and print (or ``--json``) the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--per-message", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--restart-preset", default="default")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--mode", choices=("all", "sharding"), default="all")
    parser.add_argument("--sharding-preset", default="default")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ref = generated_reference(GeneratorConfig(users=400, ads=60, days=3, seed=3))
    values = [
        encode_example_message(chunk, segments, max_seq_len=MAX_LEN)
        for chunk, segments in example_chunks(
            ref, args.messages, args.per_message, MAX_LEN
        )
    ]
    if args.mode == "sharding":
        report = sharding_mode(args, values)
        print(
            json.dumps(report)
            if args.json
            else "\n".join(f"{k:>44}: {v}" for k, v in report.items())
        )
        return 0

    # Peer: decode everything first, then train in a plain loop, each batch
    # scored by its step's forward (the daemon's progressive validation).
    batches = []
    for value in values:
        decoded = decode_example_message(value)
        batches.append(
            make_batch(decoded.examples, decoded.segments, max_seq_len=MAX_LEN)
        )
    torch.manual_seed(0)
    model = GEMTrain(build_model("gem", "tiny"))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    metrics = ProgressiveMetrics()
    started = time.perf_counter()
    for batch in batches:
        metrics.update(scored(train_step(model, batch, optimizer).logits, batch))
    peer = sum(b.size for b in batches) / (time.perf_counter() - started)

    with EmbeddedKafka() as broker, tempfile.TemporaryDirectory() as tmp:
        publish_topic(broker.settings, values)
        jsonl = Path(tmp) / "metrics.jsonl"
        started = time.perf_counter()
        result = run_daemon_until_drained(
            broker.settings, TOPIC, "bench", Path(tmp) / "ckpt", idle_seconds=3.0,
            metrics_jsonl=jsonl, log_every=10, preset="tiny",
        )  # fmt: skip
        wall = time.perf_counter() - started
        records = [json.loads(line) for line in jsonl.read_text().splitlines()]

        n = len(values)
        decode_runs = [
            kafka_python_consume(broker.settings, n, decode=True)
            for _ in range(args.repeat)
        ]
        raw_runs = [
            kafka_python_consume(broker.settings, n, decode=False)
            for _ in range(args.repeat)
        ]
        confluent_runs = [
            confluent_consume(broker.settings, n) for _ in range(args.repeat)
        ]
        restart = restart_to_first_step(
            broker.settings, Path(tmp), args.restart_preset, values[0]
        )
    first, last = records[0], records[-2]  # the last record is the post-idle one
    daemon = (last["examples"] - first["examples"]) / (last["time"] - first["time"])
    d_s, d_bytes, d_examples = min(decode_runs)
    r_s, r_bytes, _ = min(raw_runs)
    c_s, c_bytes, c_first = min(confluent_runs)
    report = {
        "hardware": hardware(),
        "messages": args.messages,
        "examples_per_message": args.per_message,
        "topic_mb": round(sum(len(v) for v in values) / 1e6, 1),
        "steps": result["step"],
        "daemon_examples_per_s": round(daemon, 1),
        "peer_examples_per_s": round(peer, 1),
        "ratio": round(daemon / peer, 3),
        "daemon_wall_s": round(wall, 1),
        "decode_path_s": round(d_s, 3),
        "decode_path_examples_per_s": round(d_examples / d_s),
        "decode_path_mb_per_s": round(d_bytes / 1e6 / d_s, 1),
        "decode_path_messages_per_s": round(n / d_s, 1),
        "kafka_python_raw_mb_per_s": round(r_bytes / 1e6 / r_s, 1),
        "kafka_python_raw_messages_per_s": round(n / r_s, 1),
        "confluent_raw_s": round(c_s, 3),
        "confluent_raw_mb_per_s": round(c_bytes / 1e6 / c_s, 1),
        "confluent_raw_messages_per_s": round(n / c_s, 1),
        "confluent_raw_first_message_s": round(c_first, 3),
        "decode_path_vs_confluent_raw": round(c_s / d_s, 3),
        **{f"restart_{k}": v for k, v in restart.items()},
        "restart_target_s": 10,
    }
    print(
        json.dumps(report)
        if args.json
        else "\n".join(f"{k:>40}: {v}" for k, v in report.items())
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
