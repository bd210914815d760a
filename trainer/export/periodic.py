"""A daemon's checkpoints as serving versions, every N steps or M seconds.

A daemon calls :meth:`PeriodicExport.checkpoint_written` after each
checkpoint it writes. When an export is due (``every_steps`` steps or
``every_seconds`` seconds since the last one started) and none is running,
``python -m trainer.export`` exports that checkpoint in a subprocess: an
export takes seconds to tens of seconds, which training does not wait for,
and the daemon process never imports the export code (a student daemon
would otherwise load the teacher's model code to export its program). A
checkpoint due while an export runs is skipped; the next one due is
exported. A failed export is logged in one line (its own error is on
stderr above it) and training goes on.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)


class PeriodicExport:
    """Exports checkpoints under ``artifacts`` when due (see the module).

    Args:
        artifacts: the serving artifacts root.
        every_steps: steps between exports (None: not by steps).
        every_seconds: seconds between exports (None: not by time).
        keep: versions kept per model.
    """

    def __init__(
        self,
        artifacts: Path,
        *,
        every_steps: int | None = None,
        every_seconds: float | None = None,
        keep: int = 3,
    ) -> None:
        if every_steps is None and every_seconds is None:
            raise ValueError("give every_steps, every_seconds or both")
        self.artifacts = artifacts
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.keep = keep
        self.running: subprocess.Popen[bytes] | None = None
        self.last_step: int | None = None
        self.last_time = 0.0
        self.exported = self.failed = 0

    def due(self, step: int, now: float) -> bool:
        """Whether a checkpoint at ``step`` is to be exported at ``now``."""
        if self.last_step is None:
            return True
        by_steps = (
            self.every_steps is not None and step - self.last_step >= self.every_steps
        )
        by_time = (
            self.every_seconds is not None
            and now - self.last_time >= self.every_seconds
        )
        return by_steps or by_time

    def checkpoint_written(self, path: Path, step: int) -> bool:
        """Start exporting the checkpoint ``path`` (at ``step``) when due and
        no export is running; True when one started."""
        self.poll()
        now = time.monotonic()
        if self.running is not None or not self.due(step, now):
            return False
        command = [sys.executable, "-m", "trainer.export", "--checkpoint", str(path)]
        command += ["--artifacts", str(self.artifacts), "--keep", str(self.keep)]
        self.running = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        self.last_step, self.last_time = step, now
        return True

    def poll(self) -> None:
        """Note a finished export (a failure in one log line)."""
        if self.running is None or self.running.poll() is None:
            return
        code = self.running.returncode
        self.running = None
        if code == 0:
            self.exported += 1
        else:
            self.failed += 1
            log.error(
                "serving export at step %s failed (exit %d)", self.last_step, code
            )

    def close(self, timeout: float = 300.0) -> None:
        """Wait for a running export (the daemon's last checkpoint's)."""
        if self.running is not None:
            try:
                self.running.wait(timeout)
            except subprocess.TimeoutExpired:
                self.running.kill()
                self.running.wait()
            self.poll()
