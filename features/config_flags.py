"""Command-line flags generated from a command's frozen config dataclass.

A dataclass field whose metadata is :func:`flag`'s (:func:`flag_field` for
one with a default) is also a command-line flag: its default and its help
are written once, on the field, and
:func:`add_config_flags` adds one flag per such field; the command then
builds its config with ``Config(**config_fields(args, Config))``. Every
``python -m`` command of both wings declares its flags this way.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

# Field metadata: the flag's help, its name when not ``--field-name``, and
# further ``add_argument`` keywords (``type``, ``choices``, ``metavar``...).
HELP: Final = "help"
FLAG: Final = "flag"
ARGPARSE: Final = "argparse"

T = TypeVar("T")


def iso_date(text: str) -> dt.date:
    """argparse type: a ``YYYY-MM-DD`` date."""
    try:
        return dt.date.fromisoformat(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"expected YYYY-MM-DD, got {text!r}"
        ) from error


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


def share(text: str) -> float:
    """argparse type: a share of a whole, at least 0 and below 1."""
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, got {value}")
    return value


def _value_type(hint: Any) -> type | None:
    """``int | None`` -> ``int``: the type a flag's text converts to; None
    where the hint is no one class (``int | str``, ``list[str]``), for a flag
    that names its own ``type`` or takes text."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        kinds = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(kinds) != 1:
            return None
        (hint,) = kinds
    if typing.get_origin(hint) is not None:
        return None
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


def flag_field(default: T, help: str, **flag_options: Any) -> T:
    """A dataclass field with this default that is also a command-line flag:
    ``field(default=default, metadata=flag(help, **flag_options))`` in one
    call, typed as its value so the class body reads as the settings.

    Example:
        >>> @dataclasses.dataclass(frozen=True, kw_only=True)
        ... class Run:
        ...     steps: int = flag_field(10, "steps")
        >>> Run()
        Run(steps=10)
    """
    return dataclasses.field(default=default, metadata=flag(help, **flag_options))


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
    on switch, or with a True default an off switch (its ``action`` may be
    another: ``argparse.BooleanOptionalAction`` for a ``bool | None``); a
    field typed as no one class (``int | str``, ``list[str]``) converts its
    text with the flag's own ``type``, or keeps it as text.
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
        elif value_type is not None:
            options["type"] = value_type
            options["metavar"] = _metavar(name, value_type)
        options.update(field.metadata[ARGPARSE])
        parser.add_argument(spelled, **options)


def config_fields(args: argparse.Namespace, config: type) -> dict[str, Any]:
    """The parsed values that are fields of ``config``."""
    names = {field.name for field in dataclasses.fields(config)}
    return {k: v for k, v in vars(args).items() if k in names}
