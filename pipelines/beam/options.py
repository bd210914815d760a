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
    """The Kafka settings the ``--kafka-*`` flags describe.

    A password given by ``--kafka-sasl-password`` then leaves the options
    (which Beam sends to the runner with the job) for this process's
    environment, where this process's own workers read it as remote workers
    read theirs (:mod:`features.kafka.secrets`). A ``--kafka-option``
    holding one stays in the options: give passwords to a job by variable
    or file.
    """
    view: Any = options.view_as(GemBuildOptions)
    namespace = argparse.Namespace(**view.get_all_options())
    settings = KafkaSettings.from_args(namespace)
    settings.export_secrets()
    view.kafka_sasl_password = None
    return settings
