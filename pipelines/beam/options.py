"""The feature job's flags, as a Beam ``PipelineOptions`` subclass.

Beam parses every ``PipelineOptions`` subclass from the same argv, so runner
flags (``--runner``, ``--direct_num_workers``, Flink/Spark/Dataflow options)
and ours travel together. The flags themselves are :mod:`.flags` (the
command line checks them, with Beam's, before Beam is imported).
"""

from __future__ import annotations

import argparse
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions

from features.kafka import KafkaSettings
from pipelines.beam.flags import add_build_arguments


class GemBuildOptions(PipelineOptions):  # type: ignore[misc]
    """Options of ``python -m pipelines.build`` (see ``--help``)."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        add_build_arguments(parser)


def kafka_settings(options: GemBuildOptions) -> KafkaSettings:
    """The Kafka settings the ``--kafka-*`` flags describe."""
    view: Any = options.view_as(GemBuildOptions)
    namespace = argparse.Namespace(**view.get_all_options())
    return KafkaSettings.from_args(namespace)
