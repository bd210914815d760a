"""Beam's Flink job server on an embedded Flink, for the portable FlinkRunner.

``make flink`` copies its jars into ``.tools/flink/libs``
(``requirements/flink/pom.xml``); ``GEM_FLINK_LIBS`` points at another
folder of them. A job reaches it with ``--runner=PortableRunner
--job_endpoint=<endpoint> --environment_type=LOOPBACK``: Flink runs the
graph in the server's JVM and sends each bundle's elements, grouped input
included, to the Python SDK worker in the job's own process as a stream.

Usage::

    with FlinkJobServer() as server:
        build.run([*server.beam_flags(), "--input", ..., "--output", ...])
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Final

from launchers.jvm import (
    LOOPBACK,
    Service,
    die_with_parent,
    free_loopback_port,
    jar_folder,
    java_binary,
)

LIBS_ENV: Final = "GEM_FLINK_LIBS"
DRIVER: Final = "org.apache.beam.runners.flink.FlinkJobServerDriver"


class JobServerStartError(RuntimeError):
    """The job server did not come up; the message names its port and log."""


def flink_libs() -> Path:
    """The folder of the job server's jars (``GEM_FLINK_LIBS`` overrides).

    Raises:
        JobServerStartError: the folder holds no Beam Flink runner jar.
    """
    return jar_folder(
        LIBS_ENV,
        "flink",
        "beam-runners-flink-*.jar",
        "Beam's Flink job server jars",
        JobServerStartError,
    )


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


class FlinkJobServer(Service):
    """A job server on free loopback ports, its log in ``log_path``; started
    on entry, stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, log_path: Path | None = None, start_timeout_s: float = 90.0):
        self.job_port = free_loopback_port()
        self.log_path = log_path or Path(os.devnull)
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """``host:port`` of the job service."""
        return f"{LOOPBACK}:{self.job_port}"

    def beam_flags(self, parallelism: int = 1) -> list[str]:
        """The pipeline flags that run a job on this server."""
        return [
            "--runner=PortableRunner",
            f"--job_endpoint={self.endpoint}",
            "--environment_type=LOOPBACK",
            f"--parallelism={parallelism}",
        ]

    def start(self) -> None:
        """Start the JVM and wait until the job service accepts connections.

        Raises:
            JobServerStartError: it exited, or did not answer in time.
        """
        classpath = f"{flink_libs()}/*"
        command = [
            java_binary("Beam's Flink job server", JobServerStartError),
            "-cp",
            classpath,
            DRIVER,
            "--flink-master=[local]",
            f"--job-port={self.job_port}",
            # 0: any free port, so two servers never collide.
            "--artifact-port=0",
            "--expansion-port=0",
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + self.start_timeout_s
        while not _accepts(self.job_port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise JobServerStartError(
                    f"Beam's Flink job server did not start on port "
                    f"{self.job_port} (log: {self.log_path})"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the JVM if it runs."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
