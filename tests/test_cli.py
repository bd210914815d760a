"""features.cli: the parser, the one-line errors and the progress bar every
command shares."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from features.cli import (
    DROPPED_LINES,
    EXIT_USAGE,
    QUIET_LOGGERS,
    CommandError,
    CommandParser,
    DropLines,
    closest_flag_hint,
    progress,
    run_command,
)


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """configure_logging sets levels and filters process-wide: undo them, so
    later tests in this process see the loggers as they were."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level
    for name in (*QUIET_LOGGERS, *DROPPED_LINES):
        logger = logging.getLogger(None if name == "root" else name)
        logger.setLevel(logging.NOTSET if name != "root" else level)
        logger.filters[:] = [f for f in logger.filters if not isinstance(f, DropLines)]


def _parser() -> CommandParser:
    parser = CommandParser("pipelines.example", "Does an example job.")
    parser.add_argument("--shards", type=int, default=16, help="user shards")
    parser.add_argument("--input", help="events directory")
    parser.add_argument("--dry-run", action="store_true", help="plan only")
    return parser


def test_help_names_the_command_and_shows_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped:
        _parser().parse_args(["--help"])
    assert stopped.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert text.startswith("usage: python -m pipelines.example")
    assert "user shards (default: 16)" in text
    assert "(default: info)" in text  # --log-level
    # No default worth showing for an unset value or an off switch.
    assert "(default: None)" not in text
    assert "(default: False)" not in text


def test_unknown_flag_names_the_closest_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        _parser().parse_args(["--shardz", "3"])
    assert stopped.value.code == EXIT_USAGE
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == (
        "python -m pipelines.example: error: unrecognized arguments: --shardz "
        "(--shardz: did you mean --shards?)"
    )


def test_abbreviations_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--sha", "3"])
    assert "did you mean --shards?" in capsys.readouterr().err


def test_an_unknown_flag_comes_before_a_missing_required_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = _parser()
    parser.add_argument("--topic", required=True, help="topic")
    with pytest.raises(SystemExit):
        parser.parse_args(["--topc", "t"])
    assert "did you mean --topic?" in capsys.readouterr().err


def test_no_hint_for_a_flag_unlike_any() -> None:
    assert closest_flag_hint("unrecognized arguments: --zzzzzz", ["--shards"]) == ""
    assert closest_flag_hint("argument --shards: invalid int value", ["--shards"]) == ""


def test_user_errors_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def fails(args: object) -> int:
        raise CommandError("events/part-0.jsonl is not JSON Lines", "fix or remove it")

    assert run_command(_parser(), fails, []) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err == (
        "python -m pipelines.example: error: events/part-0.jsonl is not JSON "
        "Lines; fix or remove it\n"
    )


def test_missing_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    missing = tmp_path / "users.parquet"

    def opens(args: object) -> int:
        missing.open()
        return 0

    assert run_command(_parser(), opens, []) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"python -m pipelines.example: error: cannot open {missing}: "
        "No such file or directory\n"
    )


def test_debug_shows_the_traceback() -> None:
    def fails(args: object) -> int:
        raise CommandError("bad")

    with pytest.raises(CommandError):
        run_command(_parser(), fails, ["--log-level", "debug"])


def test_a_bug_is_not_disguised_as_a_user_error() -> None:
    def buggy(args: object) -> int:
        raise KeyError("internal")

    with pytest.raises(KeyError):
        run_command(_parser(), buggy, [])


def test_library_loggers_are_quiet_unless_debugging() -> None:
    run_command(_parser(), lambda args: 0, [])
    assert logging.getLogger("kafka").getEffectiveLevel() == logging.ERROR
    logging.getLogger("kafka").setLevel(logging.NOTSET)
    run_command(_parser(), lambda args: 0, ["--log-level", "debug"])
    assert logging.getLogger("kafka").getEffectiveLevel() == logging.DEBUG


def test_progress_counts_on_a_terminal_and_is_silent_elsewhere(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with progress("rows", total=3) as bar:  # pytest's stderr is not a terminal
        for _ in range(3):
            bar.advance()
    assert capsys.readouterr().err == ""
    with progress("rows", total=3, enabled=True) as bar:
        bar.advance(3)


def test_library_lines_are_dropped_at_their_logger_and_others_kept() -> None:
    run_command(_parser(), lambda args: 0, [])
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    try:
        logging.warning("apitools not found, and bigquery client libraries ...")
        logging.info("Successfully loaded: 'fbgemm_gpu_py.so'")
        logging.warning("a checkpoint failed to verify")
    finally:
        logging.getLogger().removeHandler(handler)
    assert seen == ["a checkpoint failed to verify"]
