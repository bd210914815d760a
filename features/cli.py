"""How every ``python -m`` command of the system meets its user.

- :class:`CommandParser`: ``prog`` is the command a user types (``python -m
  trainer.daemon``), ``--help`` shows each flag's default, abbreviations are
  refused, and an unknown flag is an error that names the closest known one.
- :func:`run_command`: parses, configures logging, then runs the command; a
  :class:`CommandError` (or a missing file, or no reachable broker) becomes
  one line on stderr and exit status 2, with the traceback only under
  ``--log-level debug``.
- :func:`progress`: a progress bar on an interactive terminal, nothing
  otherwise.

Entry points parse their flags before importing anything heavy (torch, Beam,
Feast), so ``--help`` and flag errors answer in well under a second.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NoReturn

from features.config_flags import add_config_flags

EXIT_USAGE: Final = 2
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Library loggers whose INFO and WARNING lines say nothing a user can act on
# (connection bookkeeping, optional cloud SDKs that are not installed).
QUIET_LOGGERS: Final = {
    "kafka": logging.ERROR,
    "apache_beam.io.gcp": logging.ERROR,
    "apache_beam.internal.gcp": logging.ERROR,
}
# Single lines dropped at the logger that emits them (logger name -> message
# prefixes), where the logger's other lines matter: Beam's "apitools not
# found" (root, while Beam's GCP io imports; no job here reads BigQuery),
# fbgemm's "Successfully loaded" per shared library (root, INFO), Prism
# starting and stopping for every job (WARNING). kafka-python's own noise is
# dropped by features.kafka.client_fixes.
DROPPED_LINES: Final = {
    "root": ("apitools not found", "Successfully loaded"),
    "apache_beam.utils.subprocess_server": (
        "Really starting service",
        "Really destroying service",
    ),
}


class CommandError(Exception):
    """Input a user can fix: printed as one line, exit status 2.

    Args:
        message: what is wrong, naming the file, flag or address.
        fix: what to do about it, appended after a semicolon.
    """

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(f"{message}; {fix}" if fix else message)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description as written, and ``(default: X)`` after every flag
    whose default is a value (not None, not an off switch)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        shown = (
            action.option_strings
            and "%(default)" not in text
            and default is not argparse.SUPPRESS
            and default is not None
            and default is not False
            and default != []
        )
        return f"{text} (default: %(default)s)" if shown else text


class CommandParser(argparse.ArgumentParser):
    """The parser of one ``python -m MODULE`` command.

    Args:
        module: the dotted module a user runs (``pipelines.build``).
        description: the help's first paragraph; by convention the module
            docstring's.
        log_level: add ``--log-level`` (what :func:`run_command` reads).
        configs: frozen config dataclasses whose flag fields are flags of
            this command, in order (:func:`~features.config_flags.add_config_flags`).
    """

    def __init__(
        self,
        module: str,
        description: str | None = None,
        *,
        log_level: bool = True,
        configs: Sequence[type] = (),
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(prog=f"python -m {module}", description=description, **kwargs)
        if log_level:
            self.add_argument(
                "--log-level",
                choices=LOG_LEVELS,
                default="info",
                help="debug also shows the traceback of an error",
            )
        for config in configs:
            add_config_flags(self, config)

    def known_flags(self) -> list[str]:
        """Every ``--flag`` this parser (or one of its subcommands) accepts."""
        flags = []
        for action in self._actions:
            flags += [o for o in action.option_strings if o.startswith("--")]
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    flags += CommandParser.known_flags(sub)
        return flags

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> argparse.Namespace:
        """argparse's, but an unknown flag is reported before a missing
        required one: ``--topc T`` should say "did you mean --topic?"."""
        argv = sys.argv[1:] if args is None else list(args)
        known = set(self.known_flags())
        unknown = []
        for token in argv:
            if token == "--":
                break
            if token.startswith("--") and token.split("=", 1)[0] not in known:
                unknown.append(token)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        parsed: argparse.Namespace = super().parse_args(argv, namespace)
        return parsed

    def error(self, message: str) -> NoReturn:
        """Usage, then ``prog: error: message`` and the closest flag; exit 2."""
        self.print_usage(sys.stderr)
        hint = closest_flag_hint(message, self.known_flags())
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}{hint}\n")


def flag_action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    """The action behind ``flag`` in ``parser``, for a command that words a
    shared flag's help for itself.

    Raises:
        KeyError: ``parser`` has no such flag.
    """
    for action in parser._actions:
        if flag in action.option_strings:
            return action
    raise KeyError(flag)


def closest_flag_hint(message: str, known: Sequence[str]) -> str:
    """``" (did you mean --shards?)"`` for argparse's "unrecognized arguments"
    message when one of its flags is close to a known one, else ``""``."""
    prefix = "unrecognized arguments: "
    if not message.startswith(prefix):
        return ""
    hints = []
    for token in message[len(prefix) :].split():
        if not token.startswith("-"):
            continue
        flag = token.split("=", 1)[0]
        match = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        if match:
            hints.append(f"{flag}: did you mean {match[0]}?")
    return f" ({'; '.join(hints)})" if hints else ""


class DropLines(logging.Filter):
    """Drops a logger's records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def drop_library_lines() -> None:
    """Attach :data:`DROPPED_LINES`' filters (once each; a logger's filters
    see only the records logged on it, not its children's)."""
    for name, prefixes in DROPPED_LINES.items():
        logger = logging.getLogger(None if name == "root" else name)
        if not any(isinstance(f, DropLines) for f in logger.filters):
            logger.addFilter(DropLines(prefixes))


def configure_logging(level: str = "info") -> None:
    """Root logging at ``level`` (one of :data:`LOG_LEVELS`), quiet libraries.

    ``force``: imports (fbgemm, Beam) may have configured the root logger.
    Under ``debug`` the libraries speak too.
    """
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, force=True)
    if level != "debug":
        for name, quiet in QUIET_LOGGERS.items():
            logging.getLogger(name).setLevel(quiet)
        drop_library_lines()


def user_error_line(error: BaseException) -> str | None:
    """The one line a user reads for an error they can fix, else None (a bug:
    the traceback is the useful report)."""
    if isinstance(error, CommandError):
        return str(error)
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError)):
        if error.filename is not None:
            return f"cannot open {error.filename}: {error.strerror}"
        return None
    # kafka-python is not imported here: features/ stays cheap to load.
    if no_broker(error):
        return (
            "no Kafka broker answers at the bootstrap address; check "
            "--kafka-bootstrap and that the broker is up"
        )
    return None


def no_broker(error: BaseException) -> bool:
    """kafka-python's "found no broker at the bootstrap address": its admin
    client says it with a timeout, its other clients with NoBrokersAvailable."""
    kind = type(error)
    if not kind.__module__.startswith("kafka"):
        return False
    return kind.__name__ == "NoBrokersAvailable" or (
        kind.__name__ == "KafkaTimeoutError" and "bootstrap" in str(error)
    )


def run_command(
    parser: CommandParser,
    command: Callable[[argparse.Namespace], int | None],
    argv: Sequence[str] | None = None,
) -> int:
    """Parse ``argv``, configure logging, run ``command(args)``: its exit
    status, or 2 with one line on stderr for an error the user can fix."""
    args = parser.parse_args(argv)
    level = getattr(args, "log_level", "info")
    configure_logging(level)
    try:
        return command(args) or 0
    except Exception as error:
        line = user_error_line(error)
        if line is None or level == "debug":
            raise
        print(f"{parser.prog}: error: {line}", file=sys.stderr)
        return EXIT_USAGE


class Progress:
    """What :func:`progress` yields: ``advance`` it as work is done."""

    def __init__(self, advance: Callable[[float], None]) -> None:
        self._advance = advance

    def advance(self, amount: float = 1) -> None:
        """Count ``amount`` more units done."""
        self._advance(amount)


@contextlib.contextmanager
def progress(
    description: str, total: float | None = None, *, enabled: bool | None = None
) -> Iterator[Progress]:
    """A progress bar on stderr while the block runs; ``enabled`` defaults to
    "stderr is a terminal", so logs, pipes and CI see no bar at all."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield Progress(lambda amount: None)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as RichProgress

    bar = RichProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with bar:
        task = bar.add_task(description, total=total)
        yield Progress(lambda amount: bar.advance(task, amount))
