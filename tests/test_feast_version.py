"""The Feast version guard of the engine and stores (pipelines/feast/version.py).

The decision is pure (a version string and the internals found missing in,
one line out), so other Feast releases are given to it as strings; the
installed Feast is checked for real.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from pipelines.feast import version as feast_version
from tests.interpreter import run_python

ROOT = Path(__file__).resolve().parents[1]


def lock_pin(package: str) -> str:
    for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines():
        name, _, version = line.partition("==")
        if name.lower() == package:
            return version
    raise AssertionError(f"{package} is not pinned in requirements/lock.txt")


def test_the_tested_feast_is_the_locks_and_is_installed() -> None:
    assert feast_version.TESTED_FEAST == lock_pin("feast")
    assert importlib.metadata.version("feast") == feast_version.TESTED_FEAST
    assert feast_version.unsupported_feast(feast_version.TESTED_FEAST) is None


def test_the_installed_feast_has_every_internal_the_engine_uses() -> None:
    assert feast_version.missing_internals() == []
    feast_version.require_supported_feast()  # does not raise


@pytest.mark.parametrize("version", ["0.67.0", "0.67.4", "0.67.1rc1"])
def test_patch_releases_of_the_tested_minor_are_accepted(version: str) -> None:
    assert feast_version.unsupported_feast(version) is None


@pytest.mark.parametrize("version", ["0.66.9", "0.68.0", "1.0.0", "0.67.0rc1", "dev"])
def test_other_releases_fail_with_one_line_naming_the_pin(version: str) -> None:
    problem = feast_version.unsupported_feast(version)
    assert problem is not None
    assert "\n" not in problem
    assert f"found {version}" in problem
    assert "pip install feast==0.67.0" in problem
    assert "requirements/lock.txt" in problem


def test_a_missing_internal_is_named_even_in_a_supported_release() -> None:
    gone = "feast.utils:_convert_arrow_to_proto"
    problem = feast_version.unsupported_feast("0.67.2", [gone])
    assert problem is not None
    assert gone in problem
    assert "pip install feast==0.67.0" in problem


def test_missing_internals_looks_names_up_in_the_installed_feast() -> None:
    present = "feast.utils:make_tzaware"
    absent = [
        "feast.utils:_no_such_helper",
        "feast.no_such_module:anything",
        "feast.infra.online_stores.sqlite:SqliteOnlineStore._no_such_method",
    ]
    assert feast_version.missing_internals([present, *absent]) == absent


def test_an_unsupported_feast_is_one_line_and_exit_2_in_a_command() -> None:
    """What a user meets: UnsupportedFeastError is a CommandError, so every
    command built on features.cli prints its line and exits 2."""
    script = (
        "import sys\n"
        "from features.cli import CommandParser, run_command\n"
        "from pipelines.feast import version as feast_version\n"
        "def command(args):\n"
        "    problem = feast_version.unsupported_feast('0.70.0')\n"
        "    raise feast_version.UnsupportedFeastError(problem)\n"
        "sys.exit(run_command(CommandParser('x'), command, []))\n"
    )
    done = run_python(script)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "found 0.70.0; pip install feast==0.67.0" in line
