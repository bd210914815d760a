"""The batch feature job: raw events -> training examples, timelines, feature
tables (and optionally a Kafka topic of example batches).

The output layout and the counts of ``summary.json`` are the contract of
:data:`features.feature_tables.OUTPUT_LAYOUT`; ``pipelines.core.reference`` writes
the same from one process, and the tests hold the two together.

The stages (``pipelines/batch/``), each a composite transform named for what
it produces; batches cross every shuffle as Arrow IPC, keyed by user shard::

    ReadEvents -> ValidateEvents -> DedupeEvents -> BuildTimelines -> WriteTimelines
                       |               |      |          +-> WriteUserSequences
                   dead letters        |      +-> CountEngagement -> BuildExamples
                                       |                              |
                   ReadDimensions  feature tables        WriteExamples, PublishExamples

Runner-agnostic: any ``--runner`` works, and every file is found, read,
written and cleared through Beam's filesystems (``--input`` / ``--output``
may be ``gs://...`` on Dataflow); the Kafka I/O is kafka-python inside DoFns
(Beam's cross-language Kafka transforms need a Java expansion service).
Locally, ``--runner=DirectRunner`` runs the job on Prism (built by ``make
prism``) and no ``--runner`` on the faster in-process FnApiRunner
(:mod:`pipelines.beam.runner`); ``summary.json`` names the runner that ran.
"""

from __future__ import annotations

import json
import time
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from features.events import now_ms
from features.feature_tables import COUNT_NAMES, LAYOUT_VERSION
from features.memory import reuse_freed_memory
from pipelines.batch import inputs, outputs
from pipelines.batch.counters import EXAMPLE_COUNTERS, FEATURE_ROWS, CountEngagement
from pipelines.batch.examples import BuildExamples, BuildProfiles
from pipelines.batch.progress import follow
from pipelines.batch.timelines import BuildTimelines, DedupeEvents, WriteUserSequences
from pipelines.batch.tuning import pipeline_tuning
from pipelines.batch.validate import METRICS_NAMESPACE, ValidateEvents
from pipelines.beam.files import input_location, output_location
from pipelines.beam.options import GemBuildOptions, kafka_settings
from pipelines.beam.runner import job_counters, prepare_runner, runner_that_ran
from pipelines.core.event_files import InputFileError

OUTPUT_DIRS = ("examples", "timelines", "feature_tables", "dead_letters")
SUMMARY = "summary.json"


def run_batch(pipeline_options: PipelineOptions) -> dict[str, Any]:
    """Build the features; returns (and writes) the summary.

    Raises:
        pipelines.core.event_files.InputFileError: an input file is missing or
            corrupt, or ``--input`` / ``--output`` is not given (raised before
            the pipeline starts, naming the file or flag).
    """
    options = pipeline_options.view_as(GemBuildOptions)
    if not options.input or not options.output:
        raise InputFileError(
            "--input and --output are required",
            "give the data set folder and a folder for the features",
        )
    # Check inputs before building the graph: a clear error naming the file
    # beats a runner stack trace.
    files = inputs.check_inputs(options.input, events_required=not options.events_topic)
    output = output_location(options.output)
    clear_outputs(output)
    # One validation clock for the whole run, recorded in the summary; the
    # same rule as pipelines.core.reference (flag, else the generator manifest's
    # validation_now_ms, else the wall clock), so both see the same events.
    now = _validation_clock(options.input, options.now_ms)
    started = time.monotonic()

    prepare_runner(pipeline_options)
    pipeline = beam.Pipeline(options=pipeline_options)
    # Here too: a runner may run the workers in this process (FnApiRunner's
    # embedded worker does); workers elsewhere apply it in DoFn.setup.
    if pipeline_tuning(pipeline).tune_allocator:
        reuse_freed_memory()
    _add_stages(pipeline, options, files, output, now)
    result = pipeline.run()
    follow(result, len(files))
    result.wait_until_finish()
    found = job_counters(result, METRICS_NAMESPACE)
    summary: dict[str, Any] = {
        # Exactly the contract's counts (OUTPUT_LAYOUT), which add up.
        "counts": {name: found.get(name, 0) for name in COUNT_NAMES},
        "now_ms": now,
        "layout_version": LAYOUT_VERSION,
        "runner": runner_that_ran(pipeline_options, result),
        "seconds": round(time.monotonic() - started, 3),
    }
    if options.examples_topic:
        summary["published"] = {
            "topic": options.examples_topic,
            "messages": found.get("messages_published", 0),
            "examples": found.get("examples_published", 0),
        }
    with FileSystems.create(FileSystems.join(output, SUMMARY)) as handle:
        handle.write((json.dumps(summary, indent=2) + "\n").encode())
    return summary


def _add_stages(
    pipeline: beam.Pipeline,
    options: GemBuildOptions,
    files: list[str],
    output: str,
    now: int,
) -> None:
    """The job's stages (see the module docstring), reading ``files`` (and
    ``--events-topic``) and writing under ``output``."""
    shards = options.shards
    dimensions = pipeline | "ReadDimensions" >> inputs.ReadDimensions(options.input)
    users, ads, contents = dimensions.users, dimensions.ads, dimensions.contents

    raw = [pipeline | "ReadEvents" >> inputs.ReadEvents(files)]
    if options.events_topic:
        from pipelines.batch.kafka_io import ReadKafkaEvents

        raw.append(
            pipeline
            | "ReadKafkaEvents"
            >> ReadKafkaEvents(
                kafka_settings(options),
                options.events_topic,
                group_id=options.kafka_group_id,
            )
        )
    validated = (
        tuple(raw) | "AllRawEvents" >> beam.Flatten()
    ) | "ValidateEvents" >> ValidateEvents(now)
    _ = validated.dead_letters | "WriteDeadLetters" >> outputs.WriteDeadLetters(output)

    events = validated.valid | "DedupeEvents" >> DedupeEvents(shards)
    timelines = events | "BuildTimelines" >> BuildTimelines(ads, contents)
    counters = events | "CountEngagement" >> CountEngagement(shards)
    examples = events | "BuildExamples" >> BuildExamples(
        counters[EXAMPLE_COUNTERS], users, ads
    )
    _ = examples | "WriteExamples" >> outputs.WriteExamples(output)
    _ = timelines | "WriteTimelines" >> outputs.WriteTimelines(output)

    profiles = (users, ads) | "BuildProfiles" >> BuildProfiles()
    table_parts = (profiles, counters[FEATURE_ROWS]) | "WriteFeatureTables" >> (
        outputs.WriteFeatureTables(output)
    )
    sequence_parts = timelines | "WriteUserSequences" >> WriteUserSequences(output)
    _ = (table_parts, sequence_parts) | "WriteMissingTables" >> (
        outputs.WriteMissingTables(output)
    )

    if options.examples_topic:
        from features.kafka import ensure_topics
        from pipelines.batch.kafka_io import PublishExamples

        # Create the topic (one partition per shard) unless it exists: a
        # broker that auto-creates would pick its own partition count.
        ensure_topics(kafka_settings(options), {options.examples_topic: shards})

        _ = (examples, timelines) | "PublishExamples" >> PublishExamples(
            kafka_settings(options),
            options.examples_topic,
            max_seq_len=options.max_seq_len,
            examples_per_message=options.examples_per_message,
        )


def clear_outputs(output: str) -> None:
    """Remove an earlier run's outputs under ``output`` (any Beam filesystem).

    Its parts (maybe from another ``--shards``) must not mix in, and its
    summary must not describe this run's outputs if this run fails. A folder
    goes whole where the filesystem has folders; its files one by one where
    it has only prefixes (object stores).
    """
    for name in OUTPUT_DIRS:
        folder = FileSystems.join(output, name)
        if FileSystems.exists(folder):
            FileSystems.delete([folder])
            continue
        pattern = FileSystems.join(folder, "**")
        stale = [m.path for m in FileSystems.match([pattern])[0].metadata_list]
        if stale:
            FileSystems.delete(stale)
    summary = FileSystems.join(output, SUMMARY)
    if FileSystems.exists(summary):
        FileSystems.delete([summary])


def _validation_clock(input_dir: str, flag: int | None) -> int:
    """``--now-ms``, else ``manifest.json``'s ``validation_now_ms``, else now."""
    if flag is not None:
        return flag
    manifest = FileSystems.join(input_location(input_dir), "manifest.json")
    try:
        with FileSystems.open(manifest) as handle:
            return int(json.loads(handle.read())["validation_now_ms"])
    except (OSError, ValueError, KeyError, TypeError):
        return now_ms()
