"""``python -m pipelines.build``: raw events -> training examples, timelines,
feature tables (and optionally a Kafka topic of example batches).

    python -m pipelines.build --runner=DirectRunner --input DIR --output DIR \
        [--events-topic T] [--kafka-bootstrap HOST:PORT --examples-topic T] \
        [--max-seq-len N] [--shards 16]
    python -m pipelines.build --streaming --runner=DirectRunner --input DIR \
        --kafka-bootstrap HOST:PORT --events-topic T --examples-topic T2 ...

The output layout and the counts of ``summary.json`` are the contract of
:data:`features.feature_tables.OUTPUT_LAYOUT`; ``pipelines.reference`` writes
the same from one process, and the tests hold the two together.

The stages (``pipelines/beam/``), each a composite transform named for what
it produces; batches cross every shuffle as Arrow IPC, keyed by user shard::

    ReadEvents -> ValidateEvents -> DedupeEvents -> BuildTimelines -> WriteTimelines
                       |               |      |          +-> WriteUserSequences
                   dead letters        |      +-> CountEngagement -> BuildExamples
                                       |                              |
                   ReadDimensions  feature tables        WriteExamples, PublishExamples

Runner-agnostic: any ``--runner`` works; the Kafka I/O is kafka-python inside
DoFns (Beam's cross-language Kafka transforms need a Java expansion service).
Locally, ``--runner=DirectRunner`` runs the batch job on Prism (built by ``make
prism``) and no ``--runner`` on the faster in-process FnApiRunner
(:mod:`pipelines.beam.runner`); ``summary.json`` names the runner that ran.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from features.events import now_ms
from features.feature_tables import COUNT_NAMES, FEATURE_TABLES, LAYOUT_VERSION
from pipelines.beam import io
from pipelines.beam.counters import EXAMPLE_COUNTERS, FEATURE_ROWS, CountEngagement
from pipelines.beam.examples import BuildExamples, BuildProfiles
from pipelines.beam.memory import reuse_freed_memory
from pipelines.beam.options import GemBuildOptions, kafka_settings
from pipelines.beam.runner import prepare_runner, runner_that_ran
from pipelines.beam.timelines import BuildTimelines, DedupeEvents, WriteUserSequences
from pipelines.beam.validate import METRICS_NAMESPACE, ValidateEvents

OUTPUT_DIRS = ("examples", "timelines", "feature_tables", "dead_letters")
# Feature tables gathered from per-shard pieces; user_sequence is built whole.
PIECEWISE_TABLES = tuple(name for name in FEATURE_TABLES if name != "user_sequence")


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Build the features; returns (and writes) the summary.

    Raises:
        pipelines.beam.io.InputFileError: an input file is missing or corrupt
            (raised before the pipeline starts, naming the file).
    """
    pipeline_options = PipelineOptions(argv)
    if pipeline_options.view_as(StandardOptions).streaming:
        # Streaming mode: events from Kafka, examples to Kafka, Feast pushes
        # (pipelines/streaming/; its flags are documented there).
        from pipelines.streaming.job import run as run_streaming

        return run_streaming(argv)
    options = pipeline_options.view_as(GemBuildOptions)
    if not options.input or not options.output:
        raise SystemExit("--input and --output are required")
    # Check inputs before building the graph: a clear error naming the file
    # beats a runner stack trace.
    files = io.check_inputs(options.input, events_required=not options.events_topic)
    output = str(Path(options.output).resolve())
    # Earlier runs' parts (maybe from another --shards) must not mix in, and
    # their summary must not describe this run's outputs if it fails.
    for name in OUTPUT_DIRS:
        shutil.rmtree(Path(output) / name, ignore_errors=True)
    (Path(output) / "summary.json").unlink(missing_ok=True)
    # One validation clock for the whole run, recorded in the summary; the
    # same rule as pipelines.reference (flag, else the generator manifest's
    # validation_now_ms, else the wall clock), so both see the same events.
    now = _validation_clock(options.input, options.now_ms)
    shards = options.shards
    # Here too: a runner may run the workers in this process (FnApiRunner's
    # embedded worker does); workers elsewhere apply it in DoFn.setup.
    reuse_freed_memory()
    started = time.monotonic()

    prepare_runner(pipeline_options)
    pipeline = beam.Pipeline(options=pipeline_options)
    dimensions = pipeline | "ReadDimensions" >> io.ReadDimensions(options.input)
    users, ads, contents = dimensions.users, dimensions.ads, dimensions.contents

    raw = [pipeline | "ReadEvents" >> io.ReadEvents(files)]
    if options.events_topic:
        from pipelines.beam.kafka_io import ReadKafkaEvents

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
    _ = validated.dead_letters | "WriteDeadLetters" >> io.WriteDeadLetters(output)

    events = validated.valid | "DedupeEvents" >> DedupeEvents(shards)
    timelines = events | "BuildTimelines" >> BuildTimelines(ads, contents)
    counters = events | "CountEngagement" >> CountEngagement(shards)
    examples = events | "BuildExamples" >> BuildExamples(
        counters[EXAMPLE_COUNTERS], users, ads
    )
    _ = examples | "WriteExamples" >> io.WriteExamples(output)
    _ = timelines | "WriteTimelines" >> io.WriteTimelines(output)

    profiles = (users, ads) | "BuildProfiles" >> BuildProfiles()
    _ = (profiles, counters[FEATURE_ROWS]) | "WriteFeatureTables" >> (
        io.WriteFeatureTables(output, names=PIECEWISE_TABLES)
    )
    _ = timelines | "WriteUserSequences" >> WriteUserSequences(output)

    if options.examples_topic:
        from features.kafka import ensure_topics
        from pipelines.beam.kafka_io import PublishExamples

        # Create the topic (one partition per shard) unless it exists: a
        # broker that auto-creates would pick its own partition count.
        ensure_topics(kafka_settings(options), {options.examples_topic: shards})

        _ = (examples, timelines) | "PublishExamples" >> PublishExamples(
            kafka_settings(options),
            options.examples_topic,
            max_seq_len=options.max_seq_len,
            examples_per_message=options.examples_per_message,
        )

    result = pipeline.run()
    result.wait_until_finish()
    found = _counters(result)
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
    (Path(output) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _validation_clock(input_dir: str, flag: int | None) -> int:
    """``--now-ms``, else ``manifest.json``'s ``validation_now_ms``, else now."""
    if flag is not None:
        return flag
    try:
        manifest = json.loads((Path(input_dir) / "manifest.json").read_text())
        return int(manifest["validation_now_ms"])
    except (OSError, ValueError, KeyError, TypeError):
        return now_ms()


def _counters(result: Any) -> dict[str, int]:
    """The job's Beam counters (committed values: retried bundles count once)."""
    query = result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))
    found: dict[str, int] = {}
    for counter in query["counters"]:
        name = counter.key.metric.name
        found[name] = found.get(name, 0) + int(counter.committed or 0)
    return found


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: run and print the counts."""
    summary = run(sys.argv[1:] if argv is None else argv)
    for name, value in summary["counts"].items():
        print(f"{name:>22}: {value:,}")
    if "published" in summary:
        published = summary["published"]
        print(
            f"published {published['examples']:,} examples in "
            f"{published['messages']:,} messages to {published['topic']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
