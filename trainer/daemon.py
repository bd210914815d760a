"""``python -m trainer.daemon``: the flags, then the run
(:mod:`trainer.training.daemon`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from features.cli import CommandError, CommandParser, run_command
from features.kafka.settings import add_kafka_arguments
from trainer.cli import (
    add_config_flags,
    config_fields,
    kafka_settings,
    positive_float,
    positive_int,
    require_cluster,
)
from trainer.training.run_config import (
    EMBEDDING_OPTIMIZERS,
    MODEL_NAMES,
    PRESET_NAMES,
    SHARDINGS,
    DaemonConfig,
)

NEEDS_CLUSTER = "the daemon trains from the topic others publish into"
DESCRIPTION = """\
Train GEM continuously from the topic of example messages that pipelines.build
publishes (its examples topic): progressive validation, atomic
checkpoints that hold the Kafka offsets (exactly once across restarts), poison
messages set aside, metrics as JSON lines, Prometheus and TensorBoard.
Runs until SIGTERM (checkpoints, exits 0); --idle-seconds makes it bounded.
Exit 2: bad input, or checkpoints of which none verifies (see
--start-fresh); exit 3: the final checkpoint could not be written."""

HELPS = {
    "topic": "topic of example messages to train from",
    "group": "Kafka consumer group (every rank of a run joins it)",
    "checkpoint_dir": "checkpoints: resumed from, written to",
    "model": "model to train",
    "preset": "model size (tiny: the unit tests'; default: a 2-core CPU's; "
    "large: a GPU's)",
    "lr": "learning rate",
    "seed": "model init",
    "checkpoint_every": "steps between checkpoints",
    "keep": "newest checkpoints kept",
    "idle_seconds": "bounded run: stop once no record came for this long",
    "max_steps": "stop after this many steps",
    "dead_letter": "where poison messages go: a topic, or a .jsonl file "
    "(default: <topic>.dead-letter)",
    "log_every": "steps between metrics records",
    "window_examples": "examples in the recent-window metrics",
    "metrics_jsonl": "append a JSON metrics record there every --log-every steps",
    "prometheus_port": "serve Prometheus metrics on this port (0: off)",
    "metrics_address": "address the Prometheus endpoint listens on (0.0.0.0: "
    "every interface)",
    "start_fresh": "when no checkpoint in --checkpoint-dir verifies, train a new "
    "model from the topic's earliest offsets instead of refusing to start",
    "tensorboard_dir": "write TensorBoard event files there",
    "plot": "PNG of the progressive-NE curves, written at the end",
    "device": "auto: this rank's GPU if any, else cpu",
    "prior_click_rate": "click rate every output starts at",
    "prior_conversion_rate": "conversion rate every output starts at",
    "sharding": "replicated: every rank holds all tables; model-parallel: "
    "TorchRec shards the tables",
    "embedding_optimizer": "auto: adam (with the dense part) when replicated, "
    "adagrad when model-parallel (fbgemm's fused CPU kernel has no Adam)",
    "embedding_lr": "the tables' learning rate (default: --lr)",
    "min_sharded_rows": "model-parallel: pooled tables with fewer rows stay replicated",
}


def build_parser() -> CommandParser:
    """The flags of ``python -m trainer.daemon``."""
    parser = CommandParser("trainer.daemon", DESCRIPTION)
    add_config_flags(
        parser,
        DaemonConfig,
        HELPS,
        choices={
            "model": MODEL_NAMES,
            "preset": PRESET_NAMES,
            "sharding": SHARDINGS,
            "embedding_optimizer": EMBEDDING_OPTIMIZERS,
        },
        kinds={
            "checkpoint_every": positive_int,
            "keep": positive_int,
            "max_steps": positive_int,
            "log_every": positive_int,
            "window_examples": positive_int,
            "idle_seconds": positive_float,
            "lr": positive_float,
            "embedding_lr": positive_float,
        },
        flags={"tensorboard_dir": "--tensorboard"},
        metavars={"metrics_jsonl": "FILE", "plot": "FILE"},
    )
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="torch intra-op threads"
    )
    add_kafka_arguments(parser)
    require_cluster(parser, NEEDS_CLUSTER)
    return parser


def run(args: argparse.Namespace) -> int:
    """Start the daemon on the parsed flags; its exit status."""
    settings = kafka_settings(args, why=NEEDS_CLUSTER)
    checkpoint_dir: Path = args.checkpoint_dir
    if checkpoint_dir.exists() and not checkpoint_dir.is_dir():
        raise CommandError(
            f"--checkpoint-dir {checkpoint_dir} is a file", "name a folder"
        )
    import torch
    import torch.distributed as dist

    from features.memory import reuse_freed_memory
    from launchers.kafka_broker import kafka_cluster
    from trainer.training import daemon
    from trainer.training.checkpoint import (
        CheckpointWriteError,
        NoUsableCheckpointError,
    )

    daemon._die_with_launcher()
    torch.set_num_threads(args.threads)
    # Each step frees and re-allocates the same buffers: keep them (features.memory).
    reuse_freed_memory()
    config = DaemonConfig(**config_fields(args, DaemonConfig))
    try:
        with kafka_cluster(settings) as cluster:
            result = daemon.run(config, cluster)
    except NoUsableCheckpointError as error:
        raise CommandError(f"refusing to start: {error}") from error
    except CheckpointWriteError as error:
        print(f"python -m trainer.daemon: error: {error}", file=sys.stderr)
        return daemon.EXIT_CHECKPOINT_WRITE
    finally:
        # Every rank, also when run raised after its collective stop.
        if dist.is_initialized():
            dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        keys = ("step", "examples", "records", "dead_letters", "png")
        print(json.dumps({k: result[k] for k in keys}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.daemon`` (see :data:`DESCRIPTION`)."""
    return run_command(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
