"""Every ``python -m`` command explains itself: ``--help`` names the command,
lists the pinned flags, each with a line of help, and loads none of the heavy
frameworks (so it answers at once); an unknown flag exits 2 naming the
closest known one.

A flag added or removed shows up here first: update its command's set.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torchrec", "fbgemm_gpu", "feast", "pandas", "pyarrow")
# Beam jobs list Beam's own options too, so they load Beam's options module
# (which loads Beam); everything else stays out of them as well.
BEAM_JOBS = {"pipelines.build"}

# command -> the flags its --help lists (for the Beam jobs: the job's own
# flags; Beam's are checked by name below).
COMMANDS: dict[str, set[str]] = {}

_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9_-]*)")


def _help(module: str) -> tuple[str, list[str]]:
    """``--help`` of ``module`` in a fresh interpreter, and what it loaded."""
    script = (
        "import json, runpy, sys\n"
        f"sys.argv = [{module!r}, '--help']\n"
        "try:\n"
        f"    runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
        "except SystemExit as stop:\n"
        "    assert stop.code in (0, None), stop.code\n"
        "print('\\x00' + json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    text, _, modules = out.rpartition("\x00")
    return text, json.loads(modules)


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_help_lists_the_pinned_flags_and_stays_light(module: str) -> None:
    text, loaded = _help(module)
    assert text.startswith(f"usage: python -m {module} ")
    roots = {name.split(".")[0] for name in loaded}
    heavy = set(HEAVY) if module in BEAM_JOBS else {*HEAVY, "apache_beam"}
    assert not roots & heavy, f"--help of {module} imports {sorted(roots & heavy)}"
    listed = set(_FLAG.findall(text)) - {"--help"}
    if module in BEAM_JOBS:
        assert {"--runner", "--direct_num_workers", "--streaming"} <= listed
        listed &= COMMANDS[module] | {"--log-level"}
    assert listed == COMMANDS[module] | {"--log-level"}


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_unknown_flag_exits_2_with_the_closest(module: str) -> None:
    flag = max(COMMANDS[module], key=len)
    typo = flag[:-1] + ("x" if flag[-1] != "x" else "y")
    done = subprocess.run(
        [sys.executable, "-m", module, typo, "1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert f"did you mean {flag}?" in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr
