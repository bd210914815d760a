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
stderr above it) and training goes on. The checkpoint exported is held by a
hard link under ``<checkpoint dir>/.exporting/`` until its export ends: the
daemon prunes its old checkpoints on its own cadence, and the export reads
its checkpoint seconds after it starts.

:class:`ServingExportConfig` is the daemons' flags for it: both daemon
configurations take its fields, and :meth:`ServingExportConfig.periodic_export`
builds the exporter a run drives.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

from features.config_flags import flag_field, positive_float, positive_int

log = logging.getLogger(__name__)

HOLD_DIR: Final = ".exporting"
"""Beside a daemon's checkpoints: the one its running export reads."""
DEFAULT_EVERY_MINUTES: Final = 10.0
"""The cadence of ``--artifacts`` given alone."""


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
        self.held: Path | None = None  # the running export's checkpoint
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
        self.held = _hold(path)
        command = [sys.executable, "-m", "trainer.export", "--checkpoint"]
        command.append(str(self.held))
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
        if self.held is not None:
            _release(self.held)
            self.held = None
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


def _hold(checkpoint: Path) -> Path:
    """A link to ``checkpoint`` (a file, or a folder of files) that pruning
    leaves alone (a copy where the filesystem has no hard links); an earlier
    run's leftovers go."""
    folder = checkpoint.parent / HOLD_DIR
    folder.mkdir(exist_ok=True)
    for stale in folder.iterdir():
        _release(stale)
    held = folder / checkpoint.name
    if checkpoint.is_dir():
        shutil.copytree(checkpoint, held, copy_function=_link_or_copy)
    else:
        _link_or_copy(checkpoint, held)
    return held


def _link_or_copy(source: str | Path, target: str | Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _release(held: Path) -> None:
    if held.is_dir():
        shutil.rmtree(held, ignore_errors=True)
    else:
        held.unlink(missing_ok=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServingExportConfig:
    """A daemon's serving exports (its flags; none without ``--artifacts``)."""

    artifacts: Path | None = flag_field(
        None,
        "export checkpoints as serving versions under this root "
        "(python -m trainer.export, in a subprocess training does not wait for; "
        f"every {DEFAULT_EVERY_MINUTES:g} minutes unless a cadence is given)",
        metavar="DIR",
    )
    export_every_steps: int | None = flag_field(
        None,
        "with --artifacts: export the first checkpoint written this many steps "
        "after the last export",
        type=positive_int,
        metavar="N",
    )
    export_every_minutes: float | None = flag_field(
        None,
        "with --artifacts: export the first checkpoint written this long after "
        "the last export",
        type=positive_float,
        metavar="M",
    )
    keep_versions: int = flag_field(
        3, "with --artifacts: serving versions kept", type=positive_int
    )

    def export_refusal(self) -> str | None:
        """Why the export flags cannot be honoured; None when they can."""
        if self.artifacts is None:
            given = [
                name
                for name, value in (
                    ("--export-every-steps", self.export_every_steps),
                    ("--export-every-minutes", self.export_every_minutes),
                )
                if value is not None
            ]
            if given:
                return f"{' and '.join(given)} without --artifacts; name the root"
        elif self.artifacts.exists() and not self.artifacts.is_dir():
            return f"--artifacts {self.artifacts} is a file; name a folder"
        return None

    def periodic_export(self) -> PeriodicExport | None:
        """The exporter these flags ask for (None: no ``--artifacts``)."""
        if self.artifacts is None:
            return None
        minutes = self.export_every_minutes
        if minutes is None and self.export_every_steps is None:
            minutes = DEFAULT_EVERY_MINUTES
        return PeriodicExport(
            self.artifacts,
            every_steps=self.export_every_steps,
            every_seconds=None if minutes is None else minutes * 60.0,
            keep=self.keep_versions,
        )
