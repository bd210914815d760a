"""The batch feature job's own flags, defined once for two parsers.

``python -m pipelines.build`` parses them (with Beam's, :mod:`.beam_flags`)
before anything heavy is imported, so ``--help`` and flag errors answer at
once; Beam parses the same definitions again through ``GemBuildOptions``
(:mod:`.options`) when the pipeline is built. Each flag is a field of
:class:`BuildConfig` (:mod:`features.config_flags`). No Beam import here.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Final

from features.config_flags import add_config_flags, flag_field
from features.kafka.settings import add_kafka_arguments

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildConfig:
    """What one run of the feature job is told (``python -m pipelines.build``;
    ``--streaming`` adds :class:`pipelines.streaming.flags.StreamingJobConfig`).

    ``--input`` and ``--output`` are checked by the command, which says what
    to give (the streaming job needs no ``--output``).
    """

    input: str | None = flag_field(
        None,
        "data set folder or URL (any scheme Beam's filesystems know: "
        "gs://, s3://...): events/**/*.parquet|jsonl and the users / ads / "
        "contents tables",
    )
    output: str | None = flag_field(
        None, "output folder or URL (layout: features.feature_tables.OUTPUT_LAYOUT)"
    )
    max_seq_len: int = flag_field(
        256, "longest history window the Kafka messages' segments must serve"
    )
    shards: int = flag_field(
        16, "user (and ad / advertiser) shards: the unit of batched work"
    )
    now_ms: int | None = flag_field(
        None,
        "validation clock in epoch ms (default: the manifest's "
        "validation_now_ms, else the wall clock)",
    )
    events_topic: str | None = flag_field(
        None,
        "also read raw events from this Kafka topic (from the group's "
        "committed offsets, else the start, up to the end seen at start)",
    )
    kafka_group_id: str = flag_field(
        "gem-build", "consumer group whose offsets the events-topic read commits"
    )
    examples_topic: str | None = flag_field(
        None, "publish example batches (Arrow IPC) to this Kafka topic"
    )
    examples_per_message: int = flag_field(2048, "examples per Kafka message (at most)")
    worker_threads: int | str = flag_field(
        AUTO,
        "threads per heavy DoFn computing shards beside the bundle's own "
        "thread (0: none); auto: 1 where the job runs in one local process "
        "(FnApiRunner in memory, Prism with one loopback worker), 0 on "
        "runners that run several SDK workers per machine",
        type=worker_threads,
    )
    tune_allocator: bool | None = flag_field(
        None,
        "keep freed memory in each worker for reuse (glibc mallopt, Arrow "
        "on malloc: features.memory); default: on where the job runs in "
        "one local process, off elsewhere",
        action=argparse.BooleanOptionalAction,
    )


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the batch job's flags (:class:`BuildConfig`'s, and the Kafka
    client's) to ``parser``."""
    add_config_flags(parser.add_argument_group("feature job"), BuildConfig)
    add_kafka_arguments(parser)
