"""Trainer daemon throughput against an in-memory loop on the same batches.

    python -m benchmarks.bench_daemon [--messages 200] [--per-message 64] [--json]

Publishes ``--messages`` example messages (tiny generated set, codec of
:mod:`features.example_messages`) to the embedded broker, 2 partitions, and
runs :func:`trainer.daemon.run_daemon_until_drained` (tiny GEM preset,
progressive validation, checkpoints every 50 steps). Throughput is examples/s
between the first and last log record (start-up, group join and the final
idle wait excluded). Peer: the same messages decoded up front, then the same
eval-then-train loop in a plain Python loop (no Kafka, no thread, no
checkpoints). Ratio = daemon / peer.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from features.example_messages import (
    decode_example_message,
    encode_example_message,
    message_headers,
)
from features.kafka import EmbeddedKafka, ensure_topics
from features.windows import timeline_segments
from pipelines.reference import build_reference
from pipelines.synthetic import GeneratorConfig, generate, validation_now_ms
from pipelines.synthetic.world import ads_table, contents_table, users_table
from trainer.daemon import run_daemon_until_drained
from trainer.inputs import make_batch
from trainer.models.registry import build_model
from trainer.models.train import GEMTrain
from trainer.progressive import ProgressiveMetrics
from trainer.train_step import eval_step, train_step

MAX_LEN = 4096


def main() -> int:
    """Run both and print (or ``--json``) the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--per-message", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = GeneratorConfig(users=400, ads=60, days=3, seed=3)
    g = generate(config)
    ref = build_reference(
        g.events, users_table(g.world.users), ads_table(g.world.ads),
        contents_table(g.world.contents), now_ms=validation_now_ms(config),
    )  # fmt: skip
    rows = ref.examples.num_rows - args.per_message
    values = []
    for i in range(args.messages):
        chunk = ref.examples.slice((i * args.per_message) % rows, args.per_message)
        segments = timeline_segments(chunk, ref.timelines, MAX_LEN)
        values.append(encode_example_message(chunk, segments, max_seq_len=MAX_LEN))

    # Peer: decode everything first, then eval + train in a plain loop.
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
        metrics.update(eval_step(model, batch))
        train_step(model, batch, optimizer)
    peer = sum(b.size for b in batches) / (time.perf_counter() - started)

    from kafka import KafkaProducer

    with EmbeddedKafka() as broker, tempfile.TemporaryDirectory() as tmp:
        ensure_topics(broker.settings, {"examples": 2})
        producer = KafkaProducer(
            **broker.settings.client_config(), max_request_size=64 * 1024 * 1024
        )
        for i, value in enumerate(values):
            producer.send(
                "examples", value=value, partition=i % 2, headers=message_headers()
            )
        producer.flush()
        producer.close()
        jsonl = Path(tmp) / "metrics.jsonl"
        started = time.perf_counter()
        result = run_daemon_until_drained(
            broker.settings, "examples", "bench", Path(tmp) / "ckpt", idle_seconds=3.0,
            metrics_jsonl=jsonl, log_every=10,
        )  # fmt: skip
        wall = time.perf_counter() - started
        records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    first, last = records[0], records[-2]  # the last record is the post-idle one
    daemon = (last["examples"] - first["examples"]) / (last["time"] - first["time"])
    report = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "messages": args.messages,
        "examples_per_message": args.per_message,
        "steps": result["step"],
        "daemon_examples_per_s": round(daemon, 1),
        "peer_examples_per_s": round(peer, 1),
        "ratio": round(daemon / peer, 3),
        "daemon_wall_s": round(wall, 1),
    }
    print(
        json.dumps(report)
        if args.json
        else "\n".join(f"{k:>22}: {v}" for k, v in report.items())
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
