"""What every trainer command does before any work starts (its flags come
from its run's dataclass, :mod:`features.config_flags`).

- :func:`start_torch`: the process settings every trainer command applies
  before its first step (intra-op threads, freed memory kept);
- :func:`feature_dir`: a folder that is not a feature-job output is refused
  with one line saying what it lacks; :func:`unreadable` is the line for a
  file there that does not parse;
- :func:`add_cluster_arguments` / :func:`kafka_settings`: the commands that read
  topics others publish into say in their help that they need a cluster,
  and refuse to start an (empty) embedded broker instead;
- the help of the flags several commands share (:data:`CHECKPOINT_HELP`,
  :data:`THREADS_HELP`, :data:`REPORT_HELP`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from features.cli import CommandError, flag_action
from features.kafka.settings import add_kafka_arguments


def start_torch(threads: int) -> None:
    """Set torch's intra-op threads and keep freed memory for reuse.

    Every trainer command calls it once, before its first step: each step
    frees and re-allocates the same buffers (:mod:`features.memory`). Torch
    loads here, after the flags are parsed.
    """
    import torch

    from features.memory import reuse_freed_memory

    torch.set_num_threads(threads)
    reuse_freed_memory()


FEATURE_DIR_FIX = (
    "point it at a feature-job output (pipelines.build or pipelines.reference "
    "--output) or a folder written by python -m trainer.data.split"
)


def feature_dir(flag: str, path: Path) -> Path:
    """``path`` if it holds ``examples/`` and ``timelines/`` Parquet, else a
    :class:`CommandError` naming ``flag`` and what is missing."""
    if not path.is_dir():
        raise CommandError(f"{flag} {path}: no such folder", FEATURE_DIR_FIX)
    for part in ("examples", "timelines"):
        if not any((path / part).rglob("*.parquet")):
            raise CommandError(
                f"{flag} {path}: no {part}/ Parquet files there", FEATURE_DIR_FIX
            )
    return path


def unreadable(flag: str, path: Path, error: BaseException) -> CommandError:
    """The one line for a file under ``flag`` that exists but does not parse."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return CommandError(
        f"{flag} {path}: unreadable ({type(error).__name__}: {first})",
        "rewrite it with the command that made it",
    )


def add_cluster_arguments(parser: argparse.ArgumentParser, why: str) -> None:
    """Add the shared Kafka flags, saying in their help that this command
    needs a cluster (it reads topics others publish into: an embedded broker
    of its own would be empty); :func:`kafka_settings` then refuses to go on
    without one."""
    add_kafka_arguments(parser)
    flag_action(parser, "--kafka-bootstrap").help = (
        f"the Kafka cluster, required ({why}); or bootstrap.servers in "
        "--kafka-config / --kafka-option"
    )
    for group in parser._action_groups:
        if group.title == "Kafka":
            group.description = (
                "The cluster to read from (no embedded broker: this command "
                "reads topics others publish into) and its client settings. "
                "Later wins: --kafka-config, then --kafka-option, then the "
                "other Kafka flags."
            )


def kafka_settings(args: argparse.Namespace, *, why: str) -> Any:
    """The :class:`~features.kafka.KafkaSettings` of the parsed Kafka flags,
    naming a cluster; a malformed setting or no cluster is a
    :class:`CommandError`."""
    from features.kafka import KafkaSettings

    try:
        settings = KafkaSettings.from_args(args)
    except ValueError as error:
        raise CommandError(str(error)) from error
    if settings.embedded:
        raise CommandError(
            f"no Kafka cluster named ({why})",
            "pass --kafka-bootstrap HOST:PORT (or bootstrap.servers in --kafka-config)",
        )
    return settings


# The help of the flags several commands' dataclasses share.
CHECKPOINT_HELP = (
    "teacher checkpoint: a file, or a folder (its newest that verifies), as "
    "trainer.daemon and trainer.fit write them; the model is the one it "
    "describes"
)
THREADS_HELP = "torch intra-op threads"
REPORT_HELP = "where the JSON report goes"
