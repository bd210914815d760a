"""``python -m pipelines.build --streaming``: the feature job on an event stream.

    python -m pipelines.build --streaming --runner=DirectRunner \\
        --kafka-bootstrap HOST:PORT --events-topic gem.events.raw \\
        --examples-topic gem.examples --input DIR_WITH_DIMENSION_TABLES \\
        [--feast-state-dir DIR --feast-project P] [--stream-idle-seconds 5]

The stages (each a stateful DoFn keyed by shard, timers in event time)::

    ReadEventStream (SDF per partition, watermark = event time)
        |-- dead letters (invalid, too late) ----------------> <topic>.dead-letter
        |-- ShardById -> EventIdFn (which copy of an event_id wins)
        |                  '-- winners -> both shard stages below
        |-- ShardByEntity -> EntityShardFn (ad / advertiser counters)
        |                        |-- answers --+            |-- push rows --+
        '-- ShardByUser --------------------> UserShardFn                   |
                                   |-- example messages -> PublishExamples  |
                                   |   (keyed by examples partition, one    |
                                   |    transaction per partition & bundle) |
                                   '-- push rows ----------------------> PushToFeast

Locally it runs on Prism, Beam's portable local runner, which streams: every
stage runs as its input arrives and the watermark is the reader's. The same
graph runs on Flink or Dataflow (keyed state, event-time timers and an
unbounded splittable DoFn are portable); see the README for their flags.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import apache_beam as beam
from apache_beam.options.pipeline_options import (
    DebugOptions,
    PipelineOptions,
    PortableOptions,
    StandardOptions,
)

from features.kafka import KafkaSettings, ensure_topics
from pipelines.beam.options import GemBuildOptions, kafka_settings
from pipelines.beam.prometheus import serve_job_metrics
from pipelines.beam.runner import (
    job_counters,
    job_gauges,
    prism_location,
    runner_name,
    use_local_prism,
)
from pipelines.streaming.config import METRICS_NAMESPACE, StreamConfig
from pipelines.streaming.entity_state import EntityShardFn, route_entity_rows
from pipelines.streaming.event_ids import ENTITY_NOTICES, EventIdFn, id_elements
from pipelines.streaming.feast_push import (
    PushTarget,
    PushToFeastFn,
    check_push_target,
)
from pipelines.streaming.flags import add_streaming_arguments
from pipelines.streaming.kafka_source import (
    DEAD_LETTERS,
    MARKS,
    EventBatch,
    ReadEventStream,
)
from pipelines.streaming.offsets import CommitOffsetsFn, Mark
from pipelines.streaming.publish import (
    PublishDeadLettersFn,
    PublishExamples,
    topic_partition_count,
)
from pipelines.streaming.tables import PUSH, state_bytes
from pipelines.streaming.user_state import UserShardFn, shard_events

Keyed = tuple[int, tuple[str, bytes]]


class StreamingOptions(PipelineOptions):  # type: ignore[misc]
    """Flags of the streaming mode (with ``GemBuildOptions``' Kafka flags)."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        add_streaming_arguments(parser)


def stream_config(options: PipelineOptions) -> StreamConfig:
    """The timing rules the flags describe."""
    build = options.view_as(GemBuildOptions)
    stream = options.view_as(StreamingOptions)
    return StreamConfig(
        shards=build.shards,
        entity_shards=stream.entity_shards,
        allowed_lateness_ms=stream.allowed_lateness_ms,
        granularity_ms=stream.release_granularity_ms,
        max_seq_len=build.max_seq_len,
    )


def _user_elements(batch: EventBatch, shards: int) -> list[Keyed]:
    return [
        (shard, ("events", state_bytes(part)))
        for shard, part in shard_events(batch.events, shards)
    ]


def _entity_elements(batch: EventBatch, entity_shards: int) -> list[Keyed]:
    return [
        (key, ("rows", state_bytes(part)))
        for key, part in route_entity_rows(batch.events, entity_shards)
    ]


def _id_elements(batch: EventBatch, shards: int) -> list[tuple[int, bytes]]:
    return id_elements(batch.events, shards)


@dataclass(frozen=True)
class _Job:
    """What the flags ask of one run, checked."""

    build: Any
    stream: Any
    settings: KafkaSettings
    config: StreamConfig
    dead_topic: str
    target: PushTarget | None

    @property
    def push(self) -> bool:
        """Whether the job pushes to Feast."""
        return self.target is not None


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the streaming job (until cancelled, or idle in a bounded run)."""
    options = PipelineOptions(argv)
    options.view_as(StandardOptions).streaming = True
    choose_streaming_runner(options)
    job = _checked_job(options)
    ensure_topics(
        job.settings, {job.build.examples_topic: job.config.shards, job.dead_topic: 1}
    )
    started = time.monotonic()
    examples_partitions = topic_partition_count(job.settings, job.build.examples_topic)
    pipeline = beam.Pipeline(options=options)
    _add_stages(pipeline, job, examples_partitions)
    endpoint = serve_job_metrics(options, job.stream.metrics_port)
    try:
        result = pipeline.run()
        result.wait_until_finish()
    finally:
        if endpoint is not None:
            endpoint.close()
    summary = {
        "runner": runner_name(options),
        "prism": prism_location(options),
        "counts": job_counters(result, METRICS_NAMESPACE),
        **job_gauges(result, METRICS_NAMESPACE),
        "seconds": round(time.monotonic() - started, 3),
        "examples_topic": job.build.examples_topic,
        "dead_letter_topic": job.dead_topic,
    }
    if job.build.output:
        out = Path(job.build.output)
        out.mkdir(parents=True, exist_ok=True)
        (out / "stream_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _checked_job(options: PipelineOptions) -> _Job:
    """The run the flags describe; a flag missing or wrong exits naming it."""
    build = options.view_as(GemBuildOptions)
    stream = options.view_as(StreamingOptions)
    if not (build.events_topic and build.examples_topic and build.input):
        raise SystemExit(
            "--streaming needs --events-topic, --examples-topic and --input "
            "(the folder of the users / ads / contents tables)"
        )
    settings = kafka_settings(build)
    if settings.bootstrap is None:
        raise SystemExit("--streaming needs --kafka-bootstrap HOST:PORT")
    target = None
    if stream.feast_state_dir or stream.feast_env:
        try:
            target = check_push_target(
                stream.feast_env,
                stream.feast_state_dir,
                stream.feast_project,
                stream.feature_repo,
            )
        except ValueError as error:
            raise SystemExit(str(error)) from None
    return _Job(
        build=build,
        stream=stream,
        settings=settings,
        config=stream_config(options),
        dead_topic=stream.dead_letter_topic or f"{build.events_topic}.dead-letter",
        target=target,
    )


def _add_stages(pipeline: beam.Pipeline, job: _Job, examples_partitions: int) -> None:
    """The job's stages (see the module docstring), publishing to an examples
    topic of ``examples_partitions`` partitions."""
    build, stream, config = job.build, job.stream, job.config
    read = pipeline | "ReadEventStream" >> ReadEventStream(
        job.settings,
        build.events_topic,
        group_id=build.kafka_group_id,
        out_of_orderness_ms=stream.out_of_orderness_ms,
        allowed_lateness_ms=config.allowed_lateness_ms,
        idle_seconds=stream.stream_idle_seconds,
        now_ms=build.now_ms,
        from_committed=stream.stream_start == "committed",
    )
    user, entity = _add_state_stages(read, job)
    published = user.messages | "PublishExamples" >> PublishExamples(
        job.settings,
        build.examples_topic,
        group=build.kafka_group_id,
        partitions=examples_partitions,
        max_seq_len=config.max_seq_len,
    )
    # The committer reads the publisher's (empty) output too: its watermark
    # then waits for every release to be on the topic (see .offsets).
    _ = (
        (
            read[MARKS] | "TypeMarks" >> beam.Map(_same).with_output_types(Mark),
            published,
        )
        | "MarksAfterPublish" >> beam.Flatten()
        | "CommitOffsets"
        >> beam.ParDo(CommitOffsetsFn(job.settings, build.kafka_group_id, config))
    )
    _ = read[DEAD_LETTERS] | "PublishDeadLetters" >> beam.ParDo(
        PublishDeadLettersFn(job.settings, job.dead_topic)
    )
    if job.push:
        _ = (
            (user[PUSH], entity[PUSH])
            | "AllPushRows" >> beam.Flatten()
            | "PushToFeast"
            >> beam.ParDo(PushToFeastFn(job.target, stream.freshness_jsonl))
        )


def _add_state_stages(read: Any, job: _Job) -> tuple[Any, Any]:
    """The stateful stages after the reader: the id stage, the entity shards
    and the user shards; the outputs of the last two."""
    config = job.config
    event_ids = (
        read.events
        | "ShardById"
        >> beam.FlatMap(_id_elements, config.shards).with_output_types(
            tuple[int, bytes]
        )
        | "EventIds"
        >> beam.ParDo(EventIdFn(config)).with_outputs(ENTITY_NOTICES, main="users")
    )
    entity_rows = read.events | "ShardByEntity" >> beam.FlatMap(
        _entity_elements, config.entity_shards
    ).with_output_types(Keyed)
    entity = (
        (
            entity_rows,
            event_ids[ENTITY_NOTICES]
            | "TypeEntityNotices" >> beam.Map(_same).with_output_types(Keyed),
        )
        | "RowsAndNotices" >> beam.Flatten()
        | "EntityCounters"
        >> beam.ParDo(EntityShardFn(config, job.push)).with_outputs(
            PUSH, main="answers"
        )
    )
    users = read.events | "ShardByUser" >> beam.FlatMap(
        _user_elements, config.shards
    ).with_output_types(Keyed)
    user = (
        (
            users,
            entity.answers | "TypeAnswers" >> beam.Map(_same).with_output_types(Keyed),
            event_ids.users
            | "TypeUserNotices" >> beam.Map(_same).with_output_types(Keyed),
        )
        | "EventsAndAnswers" >> beam.Flatten()
        | "UserHistory"
        >> beam.ParDo(UserShardFn(config, job.build.input, job.push)).with_outputs(
            PUSH, main="messages"
        )
    )
    return user, entity


BATCH_ONLY_RUNNERS: Final = frozenset({"FnApiRunner", "BundleBasedDirectRunner"})
"""Beam's in-process runners: they run an unbounded source to its end before
the stages after it, so nothing would come out while the stream is live."""


PRISM_NO_SPLITS: Final = "prism_disable_sdf_split"
DEFAULT_JOB_SERVER_TIMEOUT_S: Final = 300
STREAM_JOB_SERVER_TIMEOUT_S: Final = 365 * 86_400


def choose_streaming_runner(options: PipelineOptions) -> None:
    """Run a DirectRunner job on Prism, and refuse runners that cannot stream.

    The DirectRunner would fall back to the FnApiRunner without a word where
    Prism is missing; a streaming job names Prism itself and says what to do
    when its binary is not there.
    """
    name = runner_name(options)
    if name in BATCH_ONLY_RUNNERS:
        raise SystemExit(
            f"--runner={name} cannot stream (it drains the source before the "
            "stages after it); use --runner=DirectRunner (Prism) or a "
            "distributed runner"
        )
    if name not in ("DirectRunner", "SwitchingDirectRunner", "PrismRunner"):
        return
    options.view_as(StandardOptions).runner = "PrismRunner"
    # Prism splits a slow bundle of a stateful stage, and a split bundle with
    # timers can fire them twice or out of order (a Beam Prism bug). The
    # reader checkpoints itself, so the job needs no split at all.
    debug = options.view_as(DebugOptions)
    if PRISM_NO_SPLITS not in (debug.experiments or []):
        debug.add_experiment(PRISM_NO_SPLITS)
    # The SDK waits on the job's state and message streams with the job
    # server's timeout as their deadline, and ends the job when it passes
    # (300 s by default): a stream runs until it is cancelled.
    portable = options.view_as(PortableOptions)
    if portable.job_server_timeout == DEFAULT_JOB_SERVER_TIMEOUT_S:
        portable.job_server_timeout = STREAM_JOB_SERVER_TIMEOUT_S
    use_local_prism(options)
    if not prism_location(options):
        raise SystemExit("the streaming job runs on Prism: run `make prism` first")


def _same(element: Any) -> Any:
    """Identity, applied with a type hint (keys must have a deterministic coder)."""
    return element
