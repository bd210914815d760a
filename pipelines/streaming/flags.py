"""The flags of ``python -m pipelines.build --streaming``, defined once for
two parsers: the command line checks them (with the batch job's and Beam's)
before anything heavy is imported, and Beam parses them again through
``StreamingOptions`` (:mod:`.job`). Nothing but argparse here.
"""

from __future__ import annotations

import argparse


def add_streaming_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags of ``python -m pipelines.build --streaming`` (beside the
    batch job's, whose ``--shards``, ``--max-seq-len`` and Kafka flags it
    shares)."""
    group = parser.add_argument_group("streaming (with --streaming)")
    group.add_argument(
        "--allowed-lateness-ms",
        dest="allowed_lateness_ms",
        type=int,
        default=60_000,
        help="events this far behind the watermark are still incorporated; "
        "later ones are dead-lettered",
    )
    group.add_argument(
        "--out-of-orderness-ms",
        dest="out_of_orderness_ms",
        type=int,
        default=5_000,
        help="how far the watermark trails the newest event time",
    )
    group.add_argument(
        "--release-granularity-ms",
        dest="release_granularity_ms",
        type=int,
        default=60_000,
        help="examples are released at multiples of this event time",
    )
    group.add_argument(
        "--entity-shards",
        dest="entity_shards",
        type=int,
        default=4,
        help="ad (and advertiser) shards of the counter state",
    )
    group.add_argument(
        "--stream-idle-seconds",
        dest="stream_idle_seconds",
        type=float,
        default=None,
        help="bounded run: stop when every partition has been idle this "
        "long (default: run until cancelled)",
    )
    group.add_argument(
        "--stream-start",
        dest="stream_start",
        choices=("earliest", "committed"),
        default="earliest",
        help="earliest: replay the topic and rebuild the state (Prism "
        "keeps none across restarts; the example-id ledger drops what was "
        "already published); committed: resume at the group's committed "
        "offsets (runners that restore checkpointed state)",
    )
    group.add_argument(
        "--dead-letter-topic",
        dest="dead_letter_topic",
        help="dead letters' topic (default: <events topic>.dead-letter)",
    )
    group.add_argument(
        "--feast-env", dest="feast_env", help="push to Feast: local or prod"
    )
    group.add_argument(
        "--feast-state-dir",
        dest="feast_state_dir",
        help="local Feast: registry + SQLite dir (enables the push)",
    )
    group.add_argument(
        "--feast-project",
        dest="feast_project",
        help="Feast project to push to (default: the repository's)",
    )
    group.add_argument(
        "--freshness-jsonl",
        dest="freshness_jsonl",
        help="append event-to-online freshness samples here",
    )
