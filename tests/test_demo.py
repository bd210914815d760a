"""`make demo`'s job: runs end to end, reports what the model learnt beside
the ceiling, keeps library noise out of its report, and leaves no process
behind.

The sizes are small (a few hundred examples): the learning thresholds are
for the full `make demo`; here the verdict must agree with the figures it
printed, whichever way it goes.
"""

from __future__ import annotations

import math
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
# Enough clicks for every pooled figure, and windows that close at this size;
# the tiny preset's checkpoint is small (the default one is ~200 MB).
SMALL = [
    "--users", "400", "--ads", "60", "--days", "1", "--seed", "3",
    "--window-examples", "150", "--preset", "tiny",
]  # fmt: skip
# One SMALL run, shared by the tests below, takes minutes on a busy 2-core box.
SMALL_RUN_TIMEOUT = 900
# Library lines dropped at their source (features.cli.DROPPED_LINES,
# features.kafka.client_fixes) and progress bars it turns off.
SILENCED = (
    "blocking the event loop",
    "apitools not found",
    "Really starting service",
    "Really destroying service",
    "(closed)>: Error receiving",
    "it/s]",
)
_NUMBER = r"(nan|\d+\.\d+)"
_ROW = r"\s+([\d,]+)\s+" + _NUMBER + r"\s+" + _NUMBER + r"\s+" + _NUMBER


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
            "demos.end_to_end",
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


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    """One demo run at SMALL sizes, the learning verdict among its checks:
    (output, exit status, what it printed)."""
    output = tmp_path_factory.mktemp("demo")
    process = _demo(output, *SMALL, "--require-learning")
    out, _ = process.communicate(timeout=SMALL_RUN_TIMEOUT - 60)
    return output, process.returncode, out


def _row(out: str, name: str) -> tuple[float, float, float]:
    found = re.search(re.escape(name) + _ROW, out)
    assert found, f"no {name!r} row in:\n{out}"
    return tuple(float(found.group(i)) for i in (2, 3, 4))  # type: ignore[return-value]


@pytest.mark.timeout(SMALL_RUN_TIMEOUT)
def test_demo_runs_end_to_end_and_stops_the_broker(
    small_run: tuple[Path, int, str],
) -> None:
    output, returncode, out = small_run
    failed = [line for line in out.splitlines() if line.strip().startswith("FAIL")]
    # At this size the model may not have learnt; every other check holds.
    assert all("the model learnt" in line for line in failed), out
    assert returncode == (1 if failed else 0), out
    for check in (
        "every message accounted for",
        "valid events equal the generated events",
        "every malformed message dead-lettered",
        "per-user order kept",
        "the server answered with GEM and the student",
    ):
        assert f"ok   {check}" in out
    assert "  server stopped" in out
    assert re.search(r"broker: 127\.0\.0\.1:(\d+)", out), out
    assert _brokers_in(output) == []


@pytest.mark.timeout(SMALL_RUN_TIMEOUT)
def test_demo_reports_the_model_beside_the_ceiling(
    small_run: tuple[Path, int, str],
) -> None:
    output, _, out = small_run
    bayes_rate, bayes_ne, bayes_auc = _row(out, "Bayes-optimal (ceiling)")
    whole_rate, whole_ne, whole_auc = _row(out, "model, whole run")
    window_rate, window_ne, _ = _row(out, "model, last window")
    # The same examples: the base rate the model saw is the generator's.
    assert whole_rate == pytest.approx(bayes_rate, abs=1e-5)
    assert 0 < bayes_ne < 1
    assert 0.5 < bayes_auc <= 1
    assert math.isfinite(whole_ne), out
    assert math.isfinite(whole_auc), out
    assert math.isfinite(window_ne), out
    assert 0 < window_rate < 1, out
    learnt = window_ne <= 0.95 and whole_auc >= 0.65
    verdict = "the model learnt:" if learnt else "the model did NOT learn:"
    assert f"  {verdict} last-window click NE {window_ne:.4f}" in out
    assert f"{'ok  ' if learnt else 'FAIL'} the model learnt" in out
    png = output / "learning_curve.png"
    assert f"click NE over training time: {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(SMALL_RUN_TIMEOUT)
def test_demo_report_has_no_library_noise(small_run: tuple[Path, int, str]) -> None:
    _, _, out = small_run
    for line in out.splitlines():
        assert not any(noise in line for noise in SILENCED), line
    # Real problems would still show: the malformed messages are reported.
    assert "dead letters" in out


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
