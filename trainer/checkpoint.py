"""Atomic, self-validating checkpoints that carry the Kafka offsets.

A checkpoint is one ``torch.save`` file holding everything a restart needs:
model, optimizer, RNG, step, progressive-metric state and the *next offset
per partition* (the first record not yet applied). Training state and
offsets are written together in one atomic rename, which is what makes the
daemon exactly-once: work done after the newest checkpoint is lost together
with its offsets and simply replayed.

Write: temporary file in the same directory → flush + fsync → ``os.replace``
→ fsync of the directory (so the rename itself survives a power cut). Keep
the newest ``keep`` files. Read: newest first with ``torch.load(
weights_only=True)`` (no pickle code runs); an unreadable or incomplete one
is skipped with a warning and the previous one is used.

``GEM_CHECKPOINT_PAUSE_S`` (tests only) sleeps in the middle of the write and
again before the rename, so a test can SIGKILL the process inside it.
"""

from __future__ import annotations

import io
import logging
import os
import time
from pathlib import Path
from typing import Any, Final

import torch

log = logging.getLogger(__name__)

PREFIX: Final = "ckpt-"
SUFFIX: Final = ".pt"
PAUSE_ENV: Final = "GEM_CHECKPOINT_PAUSE_S"
REQUIRED_KEYS: Final = frozenset({"model", "optimizer", "step", "offsets"})


def checkpoint_path(directory: Path, step: int) -> Path:
    """``DIR/ckpt-0000000042.pt``: zero-padded so names sort by step."""
    return directory / f"{PREFIX}{step:010d}{SUFFIX}"


def list_checkpoints(directory: Path) -> list[Path]:
    """Finished checkpoints, oldest first (temporary files excluded)."""
    if not directory.is_dir():
        return []
    return sorted(
        p
        for p in directory.iterdir()
        if p.name.startswith(PREFIX) and p.name.endswith(SUFFIX)
    )


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(directory: Path, state: dict[str, Any], *, keep: int = 3) -> Path:
    """Write ``state`` atomically as the checkpoint of ``state["step"]``.

    Args:
        directory: checkpoint folder (created if missing).
        state: must hold :data:`REQUIRED_KEYS`; tensors, numbers, strings,
            lists and dicts only (what ``weights_only`` loading accepts).
        keep: newest checkpoints to keep; older ones are deleted.

    Returns:
        The path written.
    """
    missing = REQUIRED_KEYS - state.keys()
    if missing:
        raise ValueError(f"checkpoint state lacks {sorted(missing)}")
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(directory, int(state["step"]))
    tmp = directory / f".{final.name}.{os.getpid()}.tmp"
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    pause = float(os.environ.get(PAUSE_ENV, "0") or 0)
    with open(tmp, "wb") as file:
        file.write(data[: len(data) // 2])
        if pause:  # test hook: a kill here leaves a half-written temp file
            file.flush()
            time.sleep(pause)
        file.write(data[len(data) // 2 :])
        file.flush()
        os.fsync(file.fileno())
    if pause:  # test hook: a kill here leaves a complete but unrenamed file
        time.sleep(pause)
    os.replace(tmp, final)
    _fsync_dir(directory)
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    # Temp files of killed writers are garbage: only renamed files count.
    for stale in directory.glob(f".{PREFIX}*.tmp"):
        if stale != tmp:
            stale.unlink(missing_ok=True)
    return final


def load_latest(directory: Path) -> tuple[dict[str, Any], Path] | None:
    """The newest readable checkpoint and its path, or None when there is none.

    A file that fails to load (truncated, corrupted, missing keys) is skipped
    with a warning naming it, and the next older one is tried.
    """
    for path in reversed(list_checkpoints(directory)):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:
            log.warning(
                "checkpoint %s is unreadable (%s); trying an older one", path, error
            )
            continue
        if not isinstance(state, dict) or not REQUIRED_KEYS <= state.keys():
            log.warning("checkpoint %s is incomplete; trying an older one", path)
            continue
        return state, path
    return None
