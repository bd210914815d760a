"""`make demo`'s job: runs end to end, and leaves no process behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--users", "150", "--ads", "40", "--days", "1", "--seed", "3"]


def _brokers_in(output: Path) -> list[int]:
    """Pids of live Kafka brokers whose home is under the demo's ``output``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "status").read_text()
        except OSError:
            continue
        running = "zombie" not in state
        if "kafka.Kafka" in cmdline and str(output) in cmdline and running:
            pids.append(int(proc.name))
    return pids


def _demo(tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipelines.demo",
            *TINY,
            "--output",
            str(tmp_path),
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_demo_runs_end_to_end_and_stops_the_broker(tmp_path: Path) -> None:
    process = _demo(tmp_path)
    out, _ = process.communicate(timeout=240)
    assert process.returncode == 0, out
    assert "FAIL" not in out
    for check in (
        "every message accounted for",
        "valid events equal the generated events",
        "every malformed message dead-lettered",
        "per-user order kept",
    ):
        assert f"ok   {check}" in out
    assert re.search(r"broker: 127\.0\.0\.1:(\d+)", out), out
    assert _brokers_in(tmp_path) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_demo_stops_the_broker(tmp_path: Path, sig: signal.Signals) -> None:
    # A slow publishing rate keeps the demo in its Kafka step long enough.
    process = _demo(tmp_path, "--rate", "200")
    assert process.stdout is not None
    port = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        found = re.search(r"broker: 127\.0\.0\.1:(\d+)", line)
        if found:
            port = found.group(1)
            break
    assert port is not None, "the demo never started its broker"
    assert _brokers_in(tmp_path)
    time.sleep(0.5)
    os.kill(process.pid, sig)
    process.communicate(timeout=60)  # the broker's orderly stop takes seconds
    assert process.returncode != 0
    assert _brokers_in(tmp_path) == []
