"""The memory benchmark's layouts and its per-process peaks (Linux /proc)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from benchmarks.bench_build_memory import Layout, follow_peaks

# A parent that holds 64 MB and starts a child that holds 256 MB, both
# released before they exit: only a high-water mark can see them.
_TREE = textwrap.dedent(
    """
    import subprocess, sys, time
    held = bytearray(64 << 20)
    child = "import time; b = bytearray(256 << 20); time.sleep(0.6); del b"
    subprocess.run([sys.executable, "-c", child + "; time.sleep(0.4)"], check=True)
    del held
    time.sleep(0.3)
    """
)


def test_layouts_parse_and_give_the_job_its_flags() -> None:
    layout = Layout.parse("8:64:2")
    assert layout == Layout(8.0, 64, 2)
    assert layout.beam_flags() == [
        "--shards",
        "64",
        "--direct_num_workers=2",
        "--direct_running_mode=multi_processing",
    ]
    # One worker is the runner's embedded one: no worker flags.
    assert Layout.parse("0.5:4:1").beam_flags() == ["--shards", "4"]


@pytest.mark.parametrize("text", ["8:64", "8:sixty:2", "0:4:1", "2:16:0"])
def test_a_bad_layout_is_a_clear_error(text: str) -> None:
    with pytest.raises(ValueError, match=f"layout '{text}'"):
        Layout.parse(text)


def test_peaks_are_each_process_high_water_mark() -> None:
    process = subprocess.Popen([sys.executable, "-c", _TREE])
    peaks = follow_peaks(process)
    assert process.returncode == 0
    assert 64 <= peaks["job"] < 256
    assert peaks["worker"] >= 256
    assert "engine" not in peaks
