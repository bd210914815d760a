"""Flags built from a run's dataclass, and the checks every trainer command
makes on its input before any work starts.

- :func:`add_config_flags`: dataclass fields become flags whose defaults are
  the fields' defaults (the dataclass stays the one place they are written);
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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from features.cli import CommandError


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


def add_config_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    config: type,
    helps: Mapping[str, str],
    *,
    choices: Mapping[str, Sequence[str]] | None = None,
    kinds: Mapping[str, Callable[[str], Any]] | None = None,
    flags: Mapping[str, str] | None = None,
    metavars: Mapping[str, str] | None = None,
) -> None:
    """One flag per field named in ``helps``, in that order.

    Args:
        parser: where the flags go.
        config: the dataclass whose fields they set (``dest`` is the field
            name, so ``config(**fields)`` takes the parsed values).
        helps: field -> its line of help.
        choices: field -> the values it accepts.
        kinds: field -> the argparse type (default: the field's own type).
        flags: field -> its flag when not ``--field-name``.
        metavars: field -> what its help calls the value (default: ``DIR``
            for a path, ``N`` for an integer, ``S`` for seconds).

    A field without a default is a required flag; a ``bool`` field is an
    on switch.
    """
    hints = typing.get_type_hints(config)
    fields = {field.name: field for field in dataclasses.fields(config)}
    for name, text in helps.items():
        field = fields[name]
        flag = (flags or {}).get(name, "--" + name.replace("_", "-"))
        options: dict[str, Any] = {"dest": name, "help": text}
        if field.default is dataclasses.MISSING:
            options["required"] = True
        else:
            options["default"] = field.default
        value_type = _value_type(hints[name])
        if value_type is bool:
            options["action"] = "store_true"
        else:
            options["type"] = (kinds or {}).get(name, value_type)
            if choices and name in choices:
                options["choices"] = tuple(choices[name])
            options["metavar"] = (metavars or {}).get(name, _metavar(name, value_type))
        parser.add_argument(flag, **options)


def config_fields(args: argparse.Namespace, config: type) -> dict[str, Any]:
    """The parsed values that are fields of ``config``."""
    names = {field.name for field in dataclasses.fields(config)}
    return {k: v for k, v in vars(args).items() if k in names}


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
