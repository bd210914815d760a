"""The flags of ``python -m pipelines.build --streaming``, defined once for
two parsers: the command line checks them (with the batch job's and Beam's)
before anything heavy is imported, and Beam parses them again through
``StreamingOptions`` (:mod:`.job`). Each flag is a field of
:class:`StreamingJobConfig` (:mod:`features.config_flags`); nothing heavy
is imported here.
"""

from __future__ import annotations

import argparse
import dataclasses

from features.config_flags import add_config_flags, flag_field


@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamingJobConfig:
    """What the streaming mode is told beside the batch job's flags (whose
    ``--shards``, ``--max-seq-len`` and Kafka flags it shares)."""

    allowed_lateness_ms: int = flag_field(
        60_000,
        "events this far behind the watermark are still incorporated; "
        "later ones are dead-lettered",
    )
    out_of_orderness_ms: int = flag_field(
        5_000, "how far the watermark trails the newest event time"
    )
    release_granularity_ms: int = flag_field(
        60_000, "examples are released at multiples of this event time"
    )
    entity_shards: int = flag_field(
        4, "ad (and advertiser) shards of the counter state"
    )
    stream_idle_seconds: float | None = flag_field(
        None,
        "bounded run: stop when every partition has been idle this "
        "long (default: run until cancelled)",
    )
    stream_start: str = flag_field(
        "earliest",
        "earliest: replay the topic and rebuild the state (Prism "
        "keeps none across restarts; the release horizons drop what was "
        "already published); committed: resume at the group's committed "
        "offsets (runners that restore checkpointed state)",
        choices=("earliest", "committed"),
    )
    dead_letter_topic: str | None = flag_field(
        None, "dead letters' topic (default: <events topic>.dead-letter)"
    )
    feast_env: str | None = flag_field(None, "push to Feast: local or prod")
    feast_state_dir: str | None = flag_field(
        None, "local Feast: registry + SQLite dir (enables the push)"
    )
    feast_project: str | None = flag_field(
        None, "Feast project to push to (default: the repository's)"
    )
    freshness_jsonl: str | None = flag_field(
        None, "append event-to-online freshness samples here"
    )
    feature_repo: str | None = flag_field(
        None,
        "the Feast feature repository folder, on the launcher and every "
        "worker (default: $GEM_FEATURE_REPO, else the one the project installs)",
    )
    metrics_port: int = flag_field(
        0,
        "serve Prometheus /metrics (event-to-online freshness) on this "
        "127.0.0.1 port where the workers run in the job's own process "
        "(--environment_type=LOOPBACK, Prism's default); 0: none",
    )


def add_streaming_arguments(parser: argparse.ArgumentParser) -> None:
    """Add :class:`StreamingJobConfig`'s flags, in their own group."""
    add_config_flags(
        parser.add_argument_group("streaming (with --streaming)"), StreamingJobConfig
    )
