"""The served models: each artifact folder's version loaded, and swapped live.

One :class:`ModelSlot` per model folder (``gem``, ``student-<domain>``)
holds the loaded version. A watcher thread polls every folder's ``current``
pointer (or the version a slot is pinned to), loads a new version off the
request path (manifest checked, programs loaded and run once), then swaps
it in with one reference assignment: a request holds the version it started
with until it ends. A version that fails to load is logged in one line,
remembered so it is not retried, and the previous one keeps serving.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from features.serving_artifacts import (
    PROGRAM,
    TEACHER_PROGRAM,
    VERSIONS,
    ArtifactError,
    Manifest,
    current_version,
    load_manifest,
)
from serving.inputs import FlatInputs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedVersion:
    """One version, ready to score."""

    version: str
    manifest: Manifest
    program: torch.nn.Module
    teacher: torch.nn.Module | None
    loaded_at: float

    def score(self, inputs: FlatInputs) -> np.ndarray:
        """(B, O) probabilities of the candidates."""
        flat = (
            torch.from_numpy(inputs.sparse),
            torch.from_numpy(inputs.seq_values),
            torch.from_numpy(inputs.seq_lengths),
            torch.from_numpy(inputs.dense),
            torch.from_numpy(inputs.domain),
        )
        with torch.no_grad():
            if self.manifest.kind == "gem":
                probabilities, _ = self.program(*flat)
            elif self.teacher is not None:
                _, embedding = self.teacher(*flat)
                probabilities = self.program(*flat, embedding)
            else:
                probabilities = self.program(*flat)
        return probabilities.numpy()


def load_version(version_dir: Path) -> LoadedVersion:
    """Check and load one version.

    Raises:
        ArtifactError: the manifest, a file or a program is unusable.
    """
    manifest = load_manifest(version_dir)
    try:
        program = torch.export.load(version_dir / PROGRAM).module()
        teacher = None
        if manifest.teacher_embedding_dim:
            teacher = torch.export.load(version_dir / TEACHER_PROGRAM).module()
    except Exception as error:  # a program torch cannot read
        raise ArtifactError(
            f"{version_dir}: program unreadable ({type(error).__name__}: {error})"
        ) from error
    return LoadedVersion(version_dir.name, manifest, program, teacher, time.time())


class ModelSlot:
    """A model folder and the version it serves (``pin``: that version only)."""

    def __init__(self, folder: Path, pin: str | None = None) -> None:
        self.folder = folder
        self.pin = pin
        self.loaded: LoadedVersion | None = None
        self.refused: dict[str, str] = {}

    def wanted(self) -> str | None:
        """The version the slot should serve now."""
        return self.pin or current_version(self.folder)

    def refresh(self) -> bool:
        """Load the wanted version if it is new; True when it swapped in."""
        version = self.wanted()
        if version is None or version in self.refused:
            return False
        if self.loaded is not None and self.loaded.version == version:
            return False
        try:
            loaded = load_version(self.folder / VERSIONS / version)
        except ArtifactError as error:
            self.refused[version] = str(error)
            serving = self.loaded.version if self.loaded else "nothing"
            log.error("refused %s (serving %s): %s", version, serving, error)
            return False
        self.loaded = loaded  # the swap: one reference assignment
        log.info("serving %s %s", self.folder.name, version)
        return True


class Models:
    """Every model folder under the artifacts root, kept current by a watcher.

    Args:
        root: the artifacts root (:mod:`features.serving_artifacts`).
        pins: model folder -> the version it is pinned to.
        poll_s: how often the pointers are read.
    """

    def __init__(
        self, root: Path, pins: Mapping[str, str] | None = None, poll_s: float = 1.0
    ) -> None:
        self.root = root
        self.pins = dict(pins or {})
        self.poll_s = poll_s
        self.slots: dict[str, ModelSlot] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refresh()

    def refresh(self) -> None:
        """Find new model folders and load every slot's wanted version."""
        if self.root.is_dir():
            for folder in sorted(self.root.iterdir()):
                if (folder / VERSIONS).is_dir() and folder.name not in self.slots:
                    self.slots[folder.name] = ModelSlot(
                        folder, self.pins.get(folder.name)
                    )
        for slot in list(self.slots.values()):
            slot.refresh()

    def get(self, name: str) -> LoadedVersion | None:
        """The version model ``name`` serves, None when it has none."""
        slot = self.slots.get(name)
        return None if slot is None else slot.loaded

    def start(self) -> None:
        """Start the watcher thread."""
        self._thread = threading.Thread(target=self._watch, name="models", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the watcher thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.refresh()
            except OSError as error:  # a folder vanishing mid-read: next poll
                log.warning("artifact poll failed: %s", error)

    def describe(self) -> dict[str, Any]:
        """What each model serves (for ``/models``)."""
        return {
            name: {
                "version": slot.loaded.version if slot.loaded else None,
                "pinned": slot.pin,
                "trained_to": slot.loaded.manifest.trained_to if slot.loaded else None,
                "refused": slot.refused,
            }
            for name, slot in self.slots.items()
        }
