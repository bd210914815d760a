"""The batch feature job's own flags, defined once for two parsers.

``python -m pipelines.build`` parses them (with Beam's, :mod:`.beam_flags`)
before anything heavy is imported, so ``--help`` and flag errors answer at
once; Beam parses the same definitions again through ``GemBuildOptions``
(:mod:`.options`) when the pipeline is built. No Beam import here.
"""

from __future__ import annotations

import argparse
from typing import Final

from features.kafka.settings import add_kafka_arguments

DEFAULT_SHARDS: Final = 16
DEFAULT_MAX_SEQ_LEN: Final = 256
DEFAULT_EXAMPLES_PER_MESSAGE: Final = 2048
AUTO: Final = "auto"


def worker_threads(text: str) -> int | str:
    """``--worker-threads``: ``auto`` or a count of at least 0."""
    if text == AUTO:
        return AUTO
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a count or {AUTO!r}, got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the batch job's flags (and the Kafka client's) to ``parser``."""
    group = parser.add_argument_group("feature job")
    group.add_argument(
        "--input",
        help="data set folder or URL (any scheme Beam's filesystems know: "
        "gs://, s3://...): events/**/*.parquet|jsonl and the users / ads / "
        "contents tables",
    )
    group.add_argument(
        "--output",
        help="output folder or URL (layout: features.feature_tables.OUTPUT_LAYOUT)",
    )
    group.add_argument(
        "--max-seq-len",
        dest="max_seq_len",
        type=int,
        default=DEFAULT_MAX_SEQ_LEN,
        help="longest history window the Kafka messages' segments must serve",
    )
    group.add_argument(
        "--shards",
        type=int,
        default=DEFAULT_SHARDS,
        help="user (and ad / advertiser) shards: the unit of batched work",
    )
    group.add_argument(
        "--now-ms",
        dest="now_ms",
        type=int,
        help="validation clock in epoch ms (default: the manifest's "
        "validation_now_ms, else the wall clock)",
    )
    group.add_argument(
        "--events-topic",
        dest="events_topic",
        help="also read raw events from this Kafka topic (from the group's "
        "committed offsets, else the start, up to the end seen at start)",
    )
    group.add_argument(
        "--kafka-group-id",
        dest="kafka_group_id",
        default="gem-build",
        help="consumer group whose offsets the events-topic read commits",
    )
    group.add_argument(
        "--examples-topic",
        dest="examples_topic",
        help="publish example batches (Arrow IPC) to this Kafka topic",
    )
    group.add_argument(
        "--examples-per-message",
        dest="examples_per_message",
        type=int,
        default=DEFAULT_EXAMPLES_PER_MESSAGE,
        help="examples per Kafka message (at most)",
    )
    group.add_argument(
        "--worker-threads",
        dest="worker_threads",
        type=worker_threads,
        default=AUTO,
        help="threads per heavy DoFn computing shards beside the bundle's own "
        "thread (0: none); auto: 1 where the job runs in one local process "
        "(FnApiRunner in memory, Prism with one loopback worker), 0 on "
        "runners that run several SDK workers per machine",
    )
    group.add_argument(
        "--tune-allocator",
        dest="tune_allocator",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep freed memory in each worker for reuse (glibc mallopt, Arrow "
        "on malloc: features.memory); default: on where the job runs in "
        "one local process, off elsewhere",
    )
    add_kafka_arguments(parser)
