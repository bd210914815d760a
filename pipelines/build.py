"""``python -m pipelines.build``: raw events -> training examples, timelines,
feature tables (and optionally a Kafka topic of example batches), as a Beam
job on any runner.

    python -m pipelines.build --input DIR --output DIR [--shards 16] \\
        [--runner=DirectRunner] [--events-topic T] \\
        [--kafka-bootstrap HOST:PORT --examples-topic T] [--max-seq-len N]
    python -m pipelines.build --streaming --runner=DirectRunner --input DIR \\
        --kafka-bootstrap HOST:PORT --events-topic T --examples-topic T2 ...

``--input`` and ``--output`` are folders or URLs of any scheme Beam's
filesystems know (``gs://bucket/out`` on Dataflow). Without ``--runner`` the
batch job runs on the in-process FnApiRunner; ``--runner=DirectRunner`` runs
it on Prism. The job is :mod:`pipelines.batch.job`; ``--streaming`` runs
:mod:`pipelines.streaming.job` instead.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from features.cli import (
    CommandError,
    CommandParser,
    drop_library_lines,
    flag_action,
    no_broker,
    run_command,
)
from features.config_flags import config_fields
from pipelines.beam.beam_flags import add_beam_arguments, runner_options, without
from pipelines.beam.flags import BuildConfig, add_build_arguments
from pipelines.streaming.flags import add_streaming_arguments

MODULE = "pipelines.build"
# Ours, not Beam's: Beam is handed the rest of the command line.
_OWN_FLAGS = ("--log-level",)


def build_parser() -> CommandParser:
    """Every flag of the command: the job's (batch and ``--streaming``) and
    Beam's pipeline options (from a cache, :mod:`pipelines.beam.beam_flags`:
    Beam itself is not imported), so a misspelled one of either is an error
    naming the closest."""
    parser = CommandParser(
        MODULE,
        __doc__,
        # Beam's hundred-odd options would fill the usage line.
        usage="%(prog)s --input DIR (--output DIR | --streaming ...) [FLAG ...]",
    )
    add_build_arguments(parser)
    add_streaming_arguments(parser)
    add_beam_arguments(parser)
    runner = flag_action(parser, "--runner")
    runner.help = (
        f"{runner.help} This job without --runner: the FnApiRunner "
        "(batch), Prism (--streaming)."
    )
    return parser


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the job on Beam-style ``argv`` (the job's flags and Beam's):
    the batch job, or the streaming one with ``--streaming``; returns the
    summary. Flags are not checked here (:func:`main` does)."""
    drop_library_lines()  # also for callers that skip run_command
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    from pipelines.beam.runner import check_runner_options, prepare_runner
    from pipelines.streaming.job import run as run_streaming

    flags = list(sys.argv[1:] if argv is None else argv)
    options = PipelineOptions(flags)
    streaming = options.view_as(StandardOptions).streaming
    if not streaming:
        prepare_runner(options)
    check_runner_options(options)  # every job options class is loaded by now
    if streaming:
        return run_streaming(flags)
    from pipelines.batch.job import run_batch

    return run_batch(options)


def beam_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` without this command's own flags (Beam would warn of them)."""
    kept: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
            continue
        name = token.split("=", 1)[0]
        if name in _OWN_FLAGS:
            skip = "=" not in token
            continue
        kept.append(token)
    return kept


def _build(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if args.log_level != "debug":
        # Beam logs each type hint it reads and each stage at INFO; kafka-python
        # an ERROR per retry while it looks for a broker that is not there
        # (what fails is said once, below).
        logging.getLogger("apache_beam").setLevel(logging.WARNING)
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    config = BuildConfig(**config_fields(args, BuildConfig))
    if not config.input:
        raise CommandError(
            "--input is required",
            "give the data set folder (pipelines.generate or pipelines.movielens "
            "writes one)",
        )
    if not args.streaming and not config.output:
        raise CommandError("--output is required", "give a folder for the features")
    try:
        summary = run(beam_argv(argv))
    except SystemExit as stop:
        # The streaming job stops with its message (its callers catch that).
        if isinstance(stop.code, str):
            raise CommandError(stop.code) from None
        raise
    except Exception as error:
        if no_broker(error):
            raise CommandError(
                f"no Kafka broker answers at {args.kafka_bootstrap}",
                "check --kafka-bootstrap and that the broker is up",
            ) from error
        raise
    for name, value in summary["counts"].items():
        print(f"{name:>22}: {value:,}")
    if "published" in summary:
        published = summary["published"]
        print(
            f"published {published['examples']:,} examples in "
            f"{published['messages']:,} messages to {published['topic']}"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: check every flag, run, print the counts.

    A flag in Beam's spelling that neither the job nor Beam's Python options
    know is the runner's own (Flink's ``--checkpointing_interval``): it goes
    to Beam as given, and the runner is asked about it when the job starts
    (:func:`pipelines.beam.runner.check_runner_options`).
    """
    flags = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    passed = runner_options(flags, parser.known_flags())
    return run_command(parser, lambda args: _build(args, flags), without(flags, passed))


if __name__ == "__main__":
    sys.exit(main())
