"""Flags built from a run's dataclass, and the checks every trainer command
makes on its input before any work starts.

- :func:`flag` / :func:`add_config_flags`: a dataclass field whose metadata
  is :func:`flag`'s is also a command-line flag; its default and its help
  are written once, on the field, and the command's flags are generated
  from the dataclass;
- :func:`start_torch`: the process settings every trainer command applies
  before its first step (intra-op threads, freed memory kept);
- :func:`feature_dir`: a folder that is not a feature-job output is refused
  with one line saying what it lacks; :func:`unreadable` is the line for a
  file there that does not parse;
- :func:`require_cluster` / :func:`kafka_settings`: the commands that read
  topics others publish into say in their help that they need a cluster,
  and refuse to start an (empty) embedded broker instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from features.cli import CommandError

# Field metadata: the flag's help, its name when not ``--field-name``, and
# further ``add_argument`` keywords (``type``, ``choices``, ``metavar``...).
HELP: Final = "help"
FLAG: Final = "flag"
ARGPARSE: Final = "argparse"


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number above 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {value}")
    return value


def _value_type(hint: Any) -> type:
    """``int | None`` -> ``int``: the type a flag's text converts to."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (hint,) = (arg for arg in typing.get_args(hint) if arg is not type(None))
    return typing.cast(type, hint)


def _metavar(name: str, value_type: type) -> str | None:
    if value_type is Path:
        return "DIR"
    if value_type is int:
        return "N"
    if value_type is float and name.endswith("seconds"):
        return "S"
    return None


def flag(
    help: str,
    *,
    name: str | None = None,
    written_default: str | None = None,
    **argparse_options: Any,
) -> dict[str, Any]:
    """The ``metadata`` of a dataclass field that is also a command-line flag.

    Args:
        help: the flag's line of help.
        name: the flag when not ``--field-name`` (``--no-field-name`` for a
            ``bool`` that defaults to True).
        written_default: the default as a user writes it, when the field's
            default is what the flag's ``type`` makes of that text (the help
            then shows the text).
        argparse_options: further ``add_argument`` keywords; by default the
            type is the field's own, and the metavar ``DIR`` for a path,
            ``N`` for an integer, ``S`` for seconds.

    Example:
        >>> @dataclasses.dataclass(frozen=True, kw_only=True)
        ... class Run:
        ...     steps: int = dataclasses.field(default=10, metadata=flag("steps"))
        >>> parser = argparse.ArgumentParser()
        >>> add_config_flags(parser, Run)
        >>> Run(**config_fields(parser.parse_args(["--steps", "3"]), Run))
        Run(steps=3)
    """
    if written_default is not None:
        argparse_options["default"] = written_default
    return {HELP: help, FLAG: name, ARGPARSE: argparse_options}


def add_config_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    config: type,
    *,
    only: Sequence[str] | None = None,
) -> None:
    """One flag per field of ``config`` with :func:`flag` metadata, in
    field order.

    Args:
        parser: where the flags go.
        config: the dataclass whose fields they set (``dest`` is the field
            name, so ``config(**config_fields(args, config))`` takes the
            parsed values).
        only: these fields alone, in this order (the options of a
            dataclass a command shares with others).

    A field without a default is a required flag; a ``bool`` field is an
    on switch, or with a True default an off switch.
    """
    hints = typing.get_type_hints(config)
    fields = {
        field.name: field
        for field in dataclasses.fields(config)
        if HELP in field.metadata
    }
    for name in only if only is not None else list(fields):
        field = fields[name]
        options: dict[str, Any] = {"dest": name, "help": field.metadata[HELP]}
        if field.default is not dataclasses.MISSING:
            options["default"] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            options["default"] = field.default_factory()
        else:
            options["required"] = True
        value_type = _value_type(hints[name])
        spelled = field.metadata[FLAG] or "--" + name.replace("_", "-")
        if value_type is bool:
            options["action"] = "store_true"
            if options.get("default") is True:
                # An off switch: left out of the parsed values unless given,
                # so the field's default stands (and --help shows none).
                options.update(action="store_false", default=argparse.SUPPRESS)
                spelled = field.metadata[FLAG] or "--no-" + name.replace("_", "-")
        else:
            options["type"] = value_type
            options["metavar"] = _metavar(name, value_type)
        options.update(field.metadata[ARGPARSE])
        parser.add_argument(spelled, **options)


def config_fields(args: argparse.Namespace, config: type) -> dict[str, Any]:
    """The parsed values that are fields of ``config``."""
    names = {field.name for field in dataclasses.fields(config)}
    return {k: v for k, v in vars(args).items() if k in names}


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


def require_cluster(parser: argparse.ArgumentParser, why: str) -> None:
    """Say in the shared Kafka flags' help that this command needs a cluster
    (it reads topics others publish into: an embedded broker of its own would
    be empty); :func:`kafka_settings` then refuses to go on without one."""
    for action in parser._actions:
        if "--kafka-bootstrap" in action.option_strings:
            action.help = (
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


CHECKPOINT_HELP = (
    "teacher checkpoint: a file, or a folder (its newest that verifies), as "
    "trainer.daemon and trainer.fit write them; the model is the one it "
    "describes"
)
