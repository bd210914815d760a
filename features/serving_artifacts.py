"""Serving artifacts: the one format the trainer writes and the scoring service reads.

A model's artifacts live in one folder, a version per subfolder, and a
``current`` pointer names the version to serve::

    ROOT/<model>/versions/<version>/manifest.json
                                    program.pt2     the exported program
                                    teacher.pt2     (students that read the
                                                    teacher's embedding)
    ROOT/<model>/current            one line: the version's name

``<model>`` is ``gem`` (a ``trainer.fit`` model) or ``student-<domain>``.
``<version>`` is ``v<created ms>-s<step>``: names sort by creation time.

Writing (:func:`write_version`): the files go to a hidden folder, are
fsynced and renamed into ``versions/`` in one step, then ``current`` is
replaced by an atomic rename; the newest ``keep`` versions are kept (the one
``current`` names always among them). A reader therefore sees either the old
version or the whole new one, never a half-written one.

Reading (:func:`load_manifest`): the manifest must be of this format, carry
this contract's fingerprint (:func:`contract`), and every file it lists must
be present with its SHA-256; otherwise :class:`ArtifactError` says why in a
line. The programs take the flat inputs of :mod:`features.model_inputs`.

Standard library only (plus the registry): any process loads it cheaply.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from features.events import SCHEMA_VERSION
from features.feature_tables import LAYOUT_VERSION, USER_SEQUENCE_LENGTH
from features.model_inputs import DENSE_NAMES, SEQUENCE_NAMES, SPARSE_NAMES, TABLE_ROWS
from features.vocab import DOMAINS, TRAINING_OBJECTIVES

ARTIFACT_FORMAT: Final = 1
MANIFEST: Final = "manifest.json"
PROGRAM: Final = "program.pt2"
TEACHER_PROGRAM: Final = "teacher.pt2"
CURRENT: Final = "current"
VERSIONS: Final = "versions"
GEM_MODEL: Final = "gem"


class ArtifactError(ValueError):
    """An artifact that cannot be served (the message says why, in a line)."""


def student_model(domain: str) -> str:
    """The model folder of a domain's student.

    Example:
        >>> student_model("ads")
        'student-ads'
    """
    return f"student-{domain}"


def contract() -> dict[str, Any]:
    """What a program's inputs mean: the event schema and layout versions and
    a fingerprint of the features (names, order, table sizes) and outputs."""
    described = {
        "sparse": [[n, TABLE_ROWS[n]] for n in SPARSE_NAMES],
        "sequence": [[n, TABLE_ROWS[n]] for n in SEQUENCE_NAMES],
        "dense": list(DENSE_NAMES),
        "domains": list(DOMAINS),
        "objectives": list(TRAINING_OBJECTIVES),
        "user_sequence_length": USER_SEQUENCE_LENGTH,
    }
    text = json.dumps(described, sort_keys=True).encode()
    return {
        "schema_version": SCHEMA_VERSION,
        "layout_version": LAYOUT_VERSION,
        "fingerprint": hashlib.sha256(text).hexdigest()[:16],
    }


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """What one version holds.

    Args:
        model: the model folder's name (``gem``, ``student-<domain>``).
        kind: ``gem`` (outputs probabilities and the summary embedding) or
            ``student`` (probabilities).
        domain: the student's domain; None for GEM (every domain).
        max_seq_len: the history window the program was trained on.
        teacher_embedding_dim: width of the teacher embedding a student reads
            (0: none; otherwise ``teacher.pt2`` computes it).
        model_config: the model's configuration, as plain data.
        trained_to: ``step``, ``trained_until_ms`` (the newest example time
            trained on) and ``offsets`` (Kafka, for the daemons).
        calibration: how the served probabilities are calibrated.
        source: what it was exported from (checkpoint path, teacher...).
        contract: :func:`contract` at export.
        files: SHA-256 of every file of the version.
        created_ms: export time.
        format: :data:`ARTIFACT_FORMAT`.
    """

    model: str
    kind: str
    domain: str | None
    max_seq_len: int
    teacher_embedding_dim: int
    model_config: dict[str, Any]
    trained_to: dict[str, Any]
    calibration: dict[str, Any]
    source: dict[str, Any] = field(default_factory=dict)
    contract: dict[str, Any] = field(default_factory=contract)
    files: dict[str, str] = field(default_factory=dict)
    created_ms: int = 0
    format: int = ARTIFACT_FORMAT

    @property
    def version(self) -> str:
        """The version folder's name."""
        return f"v{self.created_ms:013d}-s{int(self.trained_to.get('step', 0))}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def set_current(model_dir: Path, version: str) -> None:
    """Point ``current`` at ``version`` (atomic rename of a one-line file)."""
    if not (model_dir / VERSIONS / version / MANIFEST).is_file():
        raise ArtifactError(f"{model_dir / VERSIONS / version} is not a version")
    tmp = model_dir / f".{CURRENT}.{os.getpid()}.tmp"
    _write_file(tmp, f"{version}\n".encode())
    os.replace(tmp, model_dir / CURRENT)
    _fsync_dir(model_dir)


def write_version(
    model_dir: Path, manifest: Manifest, files: dict[str, bytes], *, keep: int = 3
) -> Path:
    """Write one version atomically, point ``current`` at it, keep the newest
    ``keep`` versions; returns the version's folder."""
    versions = model_dir / VERSIONS
    versions.mkdir(parents=True, exist_ok=True)
    created = max(int(time.time() * 1000), _newest_created(versions) + 1)
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    final = Manifest(**{**asdict(manifest), "files": digests, "created_ms": created})
    target = versions / final.version
    tmp = versions / f".{final.version}.{os.getpid()}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for name, data in files.items():
        _write_file(tmp / name, data)
    _write_file(tmp / MANIFEST, json.dumps(asdict(final), indent=1).encode())
    _fsync_dir(tmp)
    os.replace(tmp, target)
    _fsync_dir(versions)
    set_current(model_dir, final.version)
    _prune(versions, final.version, keep)
    return target


def _newest_created(versions: Path) -> int:
    names = list_versions(versions.parent)
    return int(names[-1][1:].split("-")[0]) if names else 0


def _prune(versions: Path, current: str, keep: int) -> None:
    names = [n for n in list_versions(versions.parent) if n != current]
    for name in names[: max(0, len(names) - (max(1, keep) - 1))]:
        shutil.rmtree(versions / name, ignore_errors=True)


def list_versions(model_dir: Path) -> list[str]:
    """The finished versions of a model, oldest first."""
    folder = model_dir / VERSIONS
    if not folder.is_dir():
        return []
    return sorted(
        p.name for p in folder.iterdir() if p.name.startswith("v") and p.is_dir()
    )


def current_version(model_dir: Path) -> str | None:
    """The version ``current`` names; None when there is none yet."""
    try:
        return (model_dir / CURRENT).read_text().strip() or None
    except FileNotFoundError:
        return None


def load_manifest(version_dir: Path) -> Manifest:
    """The manifest of a version, checked against its files and this contract.

    Raises:
        ArtifactError: missing, unreadable, another format or contract, or a
            file missing or altered.
    """
    try:
        raw = json.loads((version_dir / MANIFEST).read_text())
        manifest = Manifest(**raw)
    except (OSError, ValueError, TypeError) as error:
        raise ArtifactError(f"{version_dir}: unreadable manifest ({error})") from error
    if manifest.format != ARTIFACT_FORMAT:
        raise ArtifactError(
            f"{version_dir}: artifact format {manifest.format}, "
            f"this reader serves {ARTIFACT_FORMAT}"
        )
    if manifest.contract != contract():
        raise ArtifactError(
            f"{version_dir}: feature contract {manifest.contract} differs from "
            f"this one {contract()}"
        )
    if PROGRAM not in manifest.files:
        raise ArtifactError(f"{version_dir}: the manifest lists no {PROGRAM}")
    for name, digest in manifest.files.items():
        path = version_dir / name
        if not path.is_file():
            raise ArtifactError(f"{version_dir}: {name} is missing")
        if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            raise ArtifactError(f"{version_dir}: {name} fails its SHA-256")
    return manifest
