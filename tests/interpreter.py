"""A script in a fresh Python interpreter, as a user's ``python -c`` runs it:
nothing the test process imported is loaded there."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_python(
    script: str,
    *args: str,
    cwd: Path = ROOT,
    env: Mapping[str, str] | None = None,
    check: bool = False,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -c script args...`` in ``cwd`` (the repository root), its
    output captured as text; ``check`` raises on a non-zero exit."""
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True,
        cwd=cwd, env=env, check=check, timeout=timeout,
    )  # fmt: skip
