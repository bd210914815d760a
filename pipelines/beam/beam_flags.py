"""Beam's own pipeline options (``--runner``, ``--direct_num_workers``, the
Flink, Spark, Dataflow... flags) for a command line that must not import Beam.

A Beam job's ``--help`` should list Beam's options, and a misspelled one
should be an error naming the closest; but importing Beam's options module
loads all of ``apache_beam``, too slow for ``--help`` or a typo. So the
table of Beam's options (flag, destination, kind, default, choices, help) is
read once from Beam, in a child interpreter, and cached as
JSON keyed by the installed ``apache-beam`` version (read cheaply from the
package metadata): a new Beam version rebuilds it on first need, a corrupt
or unwritable cache only costs the rebuild. :func:`beam_options` called once
after installing builds it ahead of time.

The table holds what Beam's ``PipelineOptions`` parser holds: the options
of every ``PipelineOptions`` subclass Beam itself defines. Values are only
checked for choices here; Beam converts and checks them when it parses the
same argv.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

CACHE_ENV: Final = "GEM_CACHE_DIR"
# Run in a child interpreter: the parent keeps Beam out of its modules.
_READ_BEAM_OPTIONS: Final = r"""
import argparse, json, logging, sys
logging.disable(logging.WARNING)  # optional cloud SDKs warn while Beam loads
import apache_beam  # noqa: F401  (registers every options class)
from apache_beam.options.pipeline_options import PipelineOptions

def plain(value):
    default_value = getattr(value, "default_value", value)  # ValueProviders
    try:
        json.dumps(default_value)
        return default_value
    except TypeError:
        return repr(default_value)

KINDS = {
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._StoreAction: "store",
}
rows = []
seen = {}
for cls in PipelineOptions.__subclasses__():
    seen.setdefault(str(cls), cls)
for cls in seen.values():
    if not cls.__module__.startswith("apache_beam."):
        continue
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_value_provider_argument = (
        lambda *a, **k: parser.add_argument(*a, **{**k, "type": None}))
    cls._add_argparse_args(parser)
    for action in parser._actions:
        kind = KINDS.get(type(action), "append")
        rows.append({
            "group": cls.__name__,
            "flags": list(action.option_strings),
            "dest": action.dest,
            "kind": kind,
            "nargs": action.nargs if kind != "store_true" and kind != "store_false"
            else None,
            "default": plain(action.default),
            "choices": None if action.choices is None
            else [str(c) for c in action.choices],
            "help": action.help or "",
        })
json.dump(rows, sys.stdout)
"""


def beam_version() -> str:
    """The installed apache-beam's version (package metadata: no import)."""
    return importlib.metadata.version("apache-beam")


def cache_path(version: str | None = None) -> Path:
    """Where the table of this Beam version is cached (``GEM_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/gem``, else ``~/.cache/gem``)."""
    root = os.environ.get(CACHE_ENV)
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "gem")
    return Path(root) / f"beam-options-{version or beam_version()}.json"


def read_from_beam() -> list[dict[str, Any]]:
    """The table, read from Beam in a child interpreter (seconds)."""
    done = subprocess.run(
        [sys.executable, "-c", _READ_BEAM_OPTIONS],
        capture_output=True,
        text=True,
        check=True,
    )
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def beam_options() -> list[dict[str, Any]]:
    """The table of Beam's options: cached, else read from Beam and cached."""
    path = cache_path()
    try:
        rows: list[dict[str, Any]] = json.loads(path.read_text())
        if isinstance(rows, list) and rows:
            return rows
    except (OSError, ValueError):
        pass
    rows = read_from_beam()
    _store(path, rows)
    return rows


def _store(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write the cache atomically; a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=path.parent, prefix=path.name, delete=False
        ) as handle:
            json.dump(rows, handle)
        os.replace(handle.name, path)
    except OSError:
        pass


def add_beam_arguments(
    parser: argparse.ArgumentParser, rows: list[dict[str, Any]] | None = None
) -> None:
    """Add Beam's options to ``parser``, one argument group per Beam options
    class, under the destinations Beam uses (values kept as text)."""
    groups: dict[str, Any] = {}
    taken = {flag for action in parser._actions for flag in action.option_strings}
    for row in beam_options() if rows is None else rows:
        flags = [flag for flag in row["flags"] if flag not in taken]
        if not flags:
            continue
        taken.update(flags)
        group = groups.get(row["group"])
        if group is None:
            group = groups[row["group"]] = parser.add_argument_group(
                f"Beam: {row['group']}"
            )
        # argparse formats help with %: Beam's text is shown as written.
        text = row["help"].replace("%", "%%") or "(Beam's option; no help given)"
        kind = row["kind"]
        if kind in ("store_true", "store_false"):
            group.add_argument(
                *flags,
                dest=row["dest"],
                action=kind,
                default=row["default"],
                help=text,
            )
            continue
        group.add_argument(
            *flags,
            dest=row["dest"],
            action="append" if kind == "append" else "store",
            nargs=row["nargs"],
            default=row["default"],
            choices=row["choices"],
            help=text,
        )


# A runner's own options (Flink's --checkpointing_interval, --savepoint_path)
# are described by its job server, not by Beam's Python options, so no table
# here holds them: a flag in Beam's spelling (lower-case words joined by
# underscores) that no table knows is handed on to the runner, which checks
# it (pipelines.beam.runner.check_runner_options). One that is a character
# or two from a known flag stays an error: it is a typo, not an option.
_RUNNER_OPTION: Final = re.compile(r"--[a-z][a-z0-9]*(_[a-z0-9]+)+")
TYPO_SIMILARITY: Final = 0.85


def runner_options(argv: Sequence[str], known: Sequence[str]) -> list[str]:
    """The tokens of ``argv`` that are runner options none of ``known``
    spells (each flag with its value, ``--name=value`` or ``--name value``)."""
    passed: list[str] = []
    tokens = list(argv)
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if token == "--":
            break
        name, has_value, _ = token.partition("=")
        if not is_runner_option(name, known):
            continue
        passed.append(token)
        if not has_value and index < len(tokens) and not tokens[index].startswith("-"):
            passed.append(tokens[index])
            index += 1
    return passed


def is_runner_option(flag: str, known: Sequence[str]) -> bool:
    """``flag`` is in Beam's spelling, unknown, and not a near miss of a known one."""
    if flag in known or not _RUNNER_OPTION.fullmatch(flag):
        return False
    return not difflib.get_close_matches(flag, known, n=1, cutoff=TYPO_SIMILARITY)


def without(argv: Sequence[str], dropped: Sequence[str]) -> list[str]:
    """``argv`` less the tokens of ``dropped`` (in order, once each)."""
    rest = list(dropped)
    kept = []
    for token in argv:
        if rest and token == rest[0]:
            rest.pop(0)
            continue
        kept.append(token)
    return kept
