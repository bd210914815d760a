"""Atomic, verified checkpoints that carry the Kafka offsets.

A checkpoint is one ``torch.save`` file holding everything a restart needs:
model, optimizer, RNG, step, progressive-metric state, run-wide counters and
the *next offset per partition* (the first record not yet applied). Training
state and offsets are written together in one atomic rename, which is what
makes the daemon exactly-once: work done after the newest checkpoint is lost
together with its offsets and simply replayed.

Format: the saved dict is the caller's state plus :data:`MANIFEST_KEY`, an
integrity manifest computed from the state just before it is serialised::

    {"format": 1,
     "tensors": {"model/emb.weight": {"dtype": "torch.float32",
                                      "shape": [100, 8], "crc32": 123}, ...},
     "values_crc32": 456}

``tensors`` names every tensor anywhere in the state (model, optimizer
moments, RNG state, metric histograms: nested dicts and lists, path parts
joined by ``/``) with its dtype, shape and the CRC-32 of its raw bytes;
``values_crc32`` is the CRC-32 of the canonical JSON of everything else (the
dict structure, steps, counters, offsets, topic, config), tensors replaced
by their names.

Write: temporary file in the same directory → flush + fsync → ``os.replace``
→ fsync of the directory (so the rename itself survives a power cut). Then
rotation keeps the newest ``keep`` files, the one just written always among
them. A write that fails (a full disk: ``ENOSPC``, ``EDQUOT``, ``EFBIG``)
removes its temporary file, frees the space of the other checkpoints (never
the newest one that verifies) and tries once more; if that fails too it raises
:class:`CheckpointWriteError`, which names the checkpoint kept.

Read: newest first with ``torch.load(weights_only=True)`` (no pickle code
runs), then verification: the manifest must be present, name exactly the
tensors found, and every CRC must match. A file that fails (torn,
truncated, one flipped bit in an embedding table, no manifest) is skipped
with a warning naming it and why, and the previous one is used; the daemon
renames it ``<name>.corrupt`` (``set_aside=True``) so it is kept as
evidence and never shadows the checkpoints written after it.
:func:`resume_state` is the daemons' start: a directory that holds
checkpoint files none of which verifies is an error
(:class:`NoUsableCheckpointError`), unless the caller starts fresh on purpose.

The model a checkpoint holds is described in it (:func:`model_record`): the
model's name, its preset and the whole :class:`~trainer.models.config.ModelConfig`,
written by the trainer daemon and by ``trainer.fit --save``; a reader
rebuilds the model from it alone (:func:`model_from_record`), and a
checkpoint without one is refused with :class:`MissingModelConfigError`.

``GEM_CHECKPOINT_PAUSE_S`` (tests only) sleeps in the middle of the write and
again before the rename, so a test can SIGKILL the process inside it.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import time
import zlib
from pathlib import Path
from typing import Any, Final

import torch

from features.cli import CommandError
from trainer.models.config import ModelConfig, config_from_dict, config_to_dict

log = logging.getLogger(__name__)

PREFIX: Final = "ckpt-"
SUFFIX: Final = ".pt"
CORRUPT_SUFFIX: Final = ".corrupt"
PAUSE_ENV: Final = "GEM_CHECKPOINT_PAUSE_S"
REQUIRED_KEYS: Final = frozenset({"model", "optimizer", "step", "offsets"})
MANIFEST_KEY: Final = "integrity"
MANIFEST_FORMAT: Final = 1
# Errors that mean "no room": the write is retried once after freeing space.
_NO_SPACE: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class MissingModelConfigError(CommandError):
    """A checkpoint that does not say which model it holds."""


class CheckpointCorruptError(ValueError):
    """A checkpoint file that cannot be trusted (the message says why)."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the older ones are intact."""


class NoUsableCheckpointError(RuntimeError):
    """Checkpoint files exist, but none can be resumed from."""


def checkpoint_path(directory: Path, step: int) -> Path:
    """``DIR/ckpt-0000000042.pt``: zero-padded so names sort by step."""
    return directory / f"{PREFIX}{step:010d}{SUFFIX}"


def list_checkpoints(directory: Path) -> list[Path]:
    """Finished checkpoints, oldest first (temporary and corrupt files excluded)."""
    if not directory.is_dir():
        return []
    return sorted(
        p
        for p in directory.iterdir()
        if p.name.startswith(PREFIX) and p.name.endswith(SUFFIX)
    )


def checkpoint_files(directory: Path) -> list[Path]:
    """Every checkpoint file, usable or set aside as corrupt."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.startswith(PREFIX))


# ---- the integrity manifest ---------------------------------------------


def _tensor_crc(tensor: torch.Tensor) -> int:
    raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return zlib.crc32(raw.numpy().data)


def _skeleton(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """``value`` as JSON-able data, each tensor replaced by its path."""
    if isinstance(value, torch.Tensor):
        tensors[path] = value
        return {"tensor": path}
    if isinstance(value, dict):
        return [
            [repr(key), _skeleton(item, f"{path}/{key}" if path else str(key), tensors)]
            for key, item in value.items()
        ]
    if isinstance(value, (list, tuple)):
        return [
            type(value).__name__,
            [
                _skeleton(item, f"{path}/{i}" if path else str(i), tensors)
                for i, item in enumerate(value)
            ],
        ]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return {"repr": repr(value)}


def state_manifest(state: dict[str, Any]) -> dict[str, Any]:
    """The integrity manifest of ``state`` (see the module docstring)."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _skeleton(
        {k: v for k, v in state.items() if k != MANIFEST_KEY}, "", tensors
    )
    values = json.dumps(skeleton, separators=(",", ":")).encode()
    return {
        "format": MANIFEST_FORMAT,
        "tensors": {
            name: {
                "dtype": str(t.dtype),
                "shape": list(t.shape),
                "crc32": _tensor_crc(t),
            }
            for name, t in tensors.items()
        },
        "values_crc32": zlib.crc32(values),
    }


def verify_state(state: Any) -> str | None:
    """Why ``state`` (as loaded) fails its manifest, or None when it verifies."""
    if not isinstance(state, dict):
        return "not a checkpoint dict"
    missing = REQUIRED_KEYS - state.keys()
    if missing:
        return f"incomplete: lacks {sorted(missing)}"
    stored = state.get(MANIFEST_KEY)
    if not isinstance(stored, dict) or stored.get("format") != MANIFEST_FORMAT:
        return "no integrity manifest (written by an unverified writer)"
    actual = state_manifest(state)
    expected_tensors = stored.get("tensors", {})
    if set(expected_tensors) != set(actual["tensors"]):
        extra = sorted(set(actual["tensors"]) - set(expected_tensors))
        lost = sorted(set(expected_tensors) - set(actual["tensors"]))
        return f"tensors differ from the manifest (unlisted {extra}, lost {lost})"
    for name, found in actual["tensors"].items():
        if found != expected_tensors[name]:
            return (
                f"tensor {name} fails its checksum (manifest "
                f"{expected_tensors[name]}, file {found})"
            )
    if stored.get("values_crc32") != actual["values_crc32"]:
        return "steps, offsets or config fail their checksum"
    return None


def read_checkpoint_file(path: Path) -> dict[str, Any]:
    """One checkpoint file, verified, without its manifest.

    Raises:
        CheckpointCorruptError: unreadable, or it fails verification.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        # torch's messages run to paragraphs: the first line says what broke.
        first_line = (str(error).strip().splitlines() or [""])[0][:300]
        raise CheckpointCorruptError(
            f"unreadable ({type(error).__name__}: {first_line})"
        ) from error
    reason = verify_state(state)
    if reason is not None:
        raise CheckpointCorruptError(reason)
    del state[MANIFEST_KEY]
    return dict(state)


# ---- writing --------------------------------------------------------------


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(data: bytes, tmp: Path, final: Path) -> None:
    pause = float(os.environ.get(PAUSE_ENV, "0") or 0)
    try:
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
    except BaseException:
        tmp.unlink(missing_ok=True)  # a partial file only takes space
        raise
    _fsync_dir(final.parent)


def save_checkpoint(directory: Path, state: dict[str, Any], *, keep: int = 3) -> Path:
    """Write ``state`` atomically as the checkpoint of ``state["step"]``.

    Args:
        directory: checkpoint folder (created if missing).
        state: must hold :data:`REQUIRED_KEYS`; tensors, numbers, strings,
            lists and dicts only (what ``weights_only`` loading accepts).
        keep: newest checkpoints to keep (at least 1); older ones are deleted.

    Returns:
        The path written.

    Raises:
        CheckpointWriteError: the file could not be written (even after
            freeing the older checkpoints' space); the newest existing
            checkpoint is untouched.
    """
    missing = REQUIRED_KEYS - state.keys()
    if missing:
        raise ValueError(f"checkpoint state lacks {sorted(missing)}")
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(directory, int(state["step"]))
    tmp = directory / f".{final.name}.{os.getpid()}.tmp"
    buffer = io.BytesIO()
    torch.save({**state, MANIFEST_KEY: state_manifest(state)}, buffer)
    data = buffer.getvalue()
    try:
        _write_atomically(data, tmp, final)
    except OSError as error:
        if error.errno not in _NO_SPACE:
            raise CheckpointWriteError(
                error.errno, f"cannot write checkpoint {final}: {error}"
            ) from error
        freed = _free_space(directory, final)
        try:
            if not freed:
                raise error
            _write_atomically(data, tmp, final)
        except OSError as again:
            kept = [p for p in list_checkpoints(directory) if p != final]
            raise CheckpointWriteError(
                again.errno,
                f"no space for checkpoint {final.name} ({len(data)} bytes) in "
                f"{directory}: {again.strerror}; the last checkpoint "
                f"{kept[-1].name if kept else '(none)'} is kept",
            ) from again
    _rotate(directory, final, keep)
    # Temp files of killed writers are garbage: only renamed files count.
    for stale in directory.glob(f".{PREFIX}*.tmp"):
        if stale != tmp:
            stale.unlink(missing_ok=True)
    return final


def _free_space(directory: Path, writing: Path) -> list[Path]:
    """Delete temp files and every checkpoint but the newest that verifies
    (the newest of all when none does); returns what was deleted."""
    others = [p for p in list_checkpoints(directory) if p != writing]
    kept = next((p for p in reversed(others) if _verifies(p)), None)
    if kept is None and others:
        kept = others[-1]
    freed = list(directory.glob(f".{PREFIX}*.tmp"))
    freed += [p for p in others if p != kept]
    for path in freed:
        path.unlink(missing_ok=True)
    if freed:
        log.warning(
            "checkpoint directory %s is full: deleted %s to make room, kept %s",
            directory,
            [p.name for p in freed],
            kept.name if kept else "(none)",
        )
    return freed


def _verifies(path: Path) -> bool:
    try:
        read_checkpoint_file(path)
    except CheckpointCorruptError:
        return False
    return True


def _rotate(directory: Path, written: Path, keep: int) -> None:
    """Keep ``written`` and the newest ``keep - 1`` others."""
    others = [p for p in list_checkpoints(directory) if p != written]
    for old in others[: max(0, len(others) - max(keep - 1, 0))]:
        old.unlink(missing_ok=True)


# ---- the model a checkpoint holds -------------------------------------------


class UnusableCheckpointError(CommandError):
    """A checkpoint named on a command line that cannot be read."""


CHECKPOINT_FIX: Final = (
    "point it at a checkpoint file or folder written by python -m trainer.daemon "
    "(--checkpoint-dir) or python -m trainer.fit (--save)"
)


def model_record(name: str, preset: str | None, config: ModelConfig) -> dict[str, Any]:
    """The checkpoint keys that describe its model: ``model_name``,
    ``model_preset`` (the preset it was built from; None for a config of
    its own) and ``model_config`` (the config itself, as plain data)."""
    return {
        "model_name": name,
        "model_preset": preset,
        "model_config": config_to_dict(config),
    }


def model_from_record(state: dict[str, Any], path: Path) -> tuple[str, ModelConfig]:
    """The model name and config a loaded checkpoint (from ``path``) holds.

    Raises:
        MissingModelConfigError: the checkpoint carries no ``model_config``.
    """
    raw = state.get("model_config")
    if not isinstance(raw, dict):
        raise missing_model_config(path)
    return str(state.get("model_name", "gem")), config_from_dict(raw)


def missing_model_config(path: Path) -> MissingModelConfigError:
    """The error of the checkpoint ``path`` that carries no ``model_config``."""
    return MissingModelConfigError(
        f"checkpoint {path} does not say which model it holds (no model_config)",
        "resume it once with python -m trainer.daemon (its --model and --preset) "
        "or train one with python -m trainer.fit --save DIR: their checkpoints "
        "carry it",
    )


def read_model_checkpoint(path: Path, flag: str) -> tuple[dict[str, Any], Path]:
    """The checkpoint file ``path``, or the newest that verifies in the folder
    ``path``, checked to describe its model (:func:`model_from_record`).

    Args:
        path: a checkpoint file, or a folder of them.
        flag: the command-line flag that named it, for the error line.

    Raises:
        UnusableCheckpointError: nothing there, or nothing that verifies.
        MissingModelConfigError: it does not say which model it holds.
    """
    if path.is_dir():
        found = load_latest(path)
        if found is None:
            what = (
                "none of its checkpoint files verifies"
                if checkpoint_files(path)
                else f"no checkpoint files ({PREFIX}*{SUFFIX}) there"
            )
            raise UnusableCheckpointError(f"{flag} {path}: {what}", CHECKPOINT_FIX)
        state, path = found
    elif path.is_file():
        try:
            state = read_checkpoint_file(path)
        except CheckpointCorruptError as error:
            raise UnusableCheckpointError(
                f"{flag} {path}: {error}", CHECKPOINT_FIX
            ) from error
    else:
        raise UnusableCheckpointError(
            f"{flag} {path}: no such file or folder", CHECKPOINT_FIX
        )
    model_from_record(state, path)
    return state, path


# ---- reading --------------------------------------------------------------


def load_latest(
    directory: Path, *, set_aside: bool = False
) -> tuple[dict[str, Any], Path] | None:
    """The newest checkpoint that verifies, and its path; None when there is none.

    A file that fails (unreadable, truncated, corrupted, missing keys or
    manifest) is skipped with a warning naming it and why, and the next older
    one is tried. With ``set_aside`` it is renamed ``<name>.corrupt``.
    """
    for path in reversed(list_checkpoints(directory)):
        try:
            state = read_checkpoint_file(path)
        except CheckpointCorruptError as error:
            log.warning(
                "checkpoint %s is corrupt or unreadable: %s; trying an older one",
                path,
                error,
            )
            if set_aside:
                aside = path.with_name(path.name + CORRUPT_SUFFIX)
                try:
                    os.replace(path, aside)
                    log.warning("checkpoint %s set aside as %s", path.name, aside.name)
                except OSError:
                    pass  # another rank set it aside first
            continue
        return state, path
    return None


def resume_state(
    directory: Path, *, start_fresh: bool = False, set_aside: bool = True
) -> tuple[dict[str, Any], Path] | None:
    """The state to resume from; None means "start a new model".

    Raises:
        NoUsableCheckpointError: ``directory`` holds checkpoint files but none
            verifies, and ``start_fresh`` is not set.
    """
    loaded = load_latest(directory, set_aside=set_aside)
    if loaded is not None or start_fresh:
        if loaded is None and checkpoint_files(directory):
            log.warning(
                "no usable checkpoint in %s: starting a new model (--start-fresh)",
                directory,
            )
        return loaded
    found = checkpoint_files(directory)
    if found:
        raise NoUsableCheckpointError(
            f"none of the {len(found)} checkpoint files in {directory} verifies "
            "(see the warnings above); restore a good checkpoint there, or pass "
            "--start-fresh to train a new model from the topic's earliest offsets"
        )
    return None
