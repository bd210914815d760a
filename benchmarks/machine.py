"""What machine a benchmark ran on: every figure is reported with it."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from types import ModuleType
from typing import Any


def cpu_model() -> str:
    """The CPU's name as /proc/cpuinfo gives it (the platform's guess elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_line(*modules: ModuleType, arch: bool = False) -> str:
    """One line for a report: the CPU (after its architecture with ``arch``),
    its cores, and the versions of Python and of each of ``modules``."""
    cpu = f"{platform.machine()} {cpu_model()}" if arch else cpu_model()
    versions = "".join(f", {m.__name__} {m.__version__}" for m in modules)
    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}{versions}"
    )


def machine_and_load() -> dict[str, Any]:
    """The CPU, its cores and the 1-minute load average (the machine is shared)."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 1),
    }


def process_stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (Linux): state,
    parent pid, ... (``proc(5)``'s fields from the third on)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process so far (Linux /proc)."""
    fields = process_stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
