"""The feature job's flags, as a Beam ``PipelineOptions`` subclass.

Beam parses every ``PipelineOptions`` subclass from the same argv, so runner
flags (``--runner``, ``--direct_num_workers``, Flink/Spark/Dataflow options)
and ours travel together and a misspelled flag fails :func:`validate`.
"""

from __future__ import annotations

import argparse
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions

from features.kafka import KafkaSettings, add_kafka_arguments

DEFAULT_SHARDS = 16
DEFAULT_MAX_SEQ_LEN = 256
DEFAULT_EXAMPLES_PER_MESSAGE = 2048


class GemBuildOptions(PipelineOptions):  # type: ignore[misc]
    """Options of ``python -m pipelines.build`` (see ``--help``)."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--input",
            help="directory of raw events (events/**/*.parquet|jsonl) and the "
            "users / ads / contents tables",
        )
        parser.add_argument("--output", help="output directory (see OUTPUT_LAYOUT)")
        parser.add_argument(
            "--max-seq-len",
            dest="max_seq_len",
            type=int,
            default=DEFAULT_MAX_SEQ_LEN,
            help="longest history window the Kafka messages' segments must serve",
        )
        parser.add_argument(
            "--shards",
            type=int,
            default=DEFAULT_SHARDS,
            help="user (and ad / advertiser) shards: the unit of batched work",
        )
        parser.add_argument(
            "--now-ms",
            dest="now_ms",
            type=int,
            help="validation clock in epoch ms (default: the wall clock)",
        )
        parser.add_argument(
            "--events-topic",
            dest="events_topic",
            help="also read raw events from this Kafka topic (from the group's "
            "committed offsets, else the start, up to the end seen at start)",
        )
        parser.add_argument(
            "--kafka-group-id",
            dest="kafka_group_id",
            default="gem-build",
            help="consumer group whose offsets the events-topic read commits",
        )
        parser.add_argument(
            "--examples-topic",
            dest="examples_topic",
            help="publish example batches (Arrow IPC) to this Kafka topic",
        )
        parser.add_argument(
            "--examples-per-message",
            dest="examples_per_message",
            type=int,
            default=DEFAULT_EXAMPLES_PER_MESSAGE,
            help="examples per Kafka message (at most)",
        )
        add_kafka_arguments(parser)


def kafka_settings(options: GemBuildOptions) -> KafkaSettings:
    """The Kafka settings the ``--kafka-*`` flags describe."""
    view: Any = options.view_as(GemBuildOptions)
    namespace = argparse.Namespace(**view.get_all_options())
    return KafkaSettings.from_args(namespace)
