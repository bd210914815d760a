"""The batch job reads and writes through Beam's filesystems: any scheme works.

``gemtest://`` is a real Beam ``FileSystem`` registered under its own scheme:
an object store (keys, no folders: like GCS or S3) whose objects are the
files of a local folder. The job run on ``gemtest://`` input and output
writes what a run on local folders writes, byte for byte, and clears an
earlier run's objects first.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow.parquet as pq
import pytest
from apache_beam.io.filesystem import (
    BeamIOError,
    CompressedFile,
    CompressionTypes,
    FileMetadata,
    FileSystem,
)
from apache_beam.io.filesystems import FileSystems

from pipelines import build
from pipelines.core.event_files import InputFileError
from pipelines.sources.synthetic import (
    GeneratorConfig,
    generate_dataset,
    validation_now_ms,
)

SCHEME = "gemtest"
PREFIX = f"{SCHEME}://"
ROOT_ENV = "GEMTEST_ROOT"
RUNNER = "--runner=FnApiRunner"
CONFIG = GeneratorConfig(users=150, ads=40, days=2, seed=11)
NOW = validation_now_ms(CONFIG)


class GemTestFileSystem(FileSystem):
    """``gemtest://KEY``: an object store kept in the folder ``$GEMTEST_ROOT``.

    Like an object store it has no folders: an object exists or not, listing
    is by key prefix, and deleting a folder-like key deletes the objects
    under it. Beam finds it by its scheme once this class is imported.
    """

    CHUNK_SIZE = 1 << 20

    @classmethod
    def scheme(cls) -> str:
        return SCHEME

    @staticmethod
    def _root() -> str:
        return os.environ[ROOT_ENV]

    def _local(self, url: str) -> str:
        if not url.startswith(PREFIX):
            raise ValueError(f"not a {SCHEME} URL: {url}")
        return os.path.join(self._root(), url[len(PREFIX) :])

    def _url(self, local: str) -> str:
        return PREFIX + os.path.relpath(local, self._root())

    def _keys(self) -> Iterator[str]:
        for folder, _, files in os.walk(self._root()):
            for name in files:
                yield os.path.join(folder, name)

    def join(self, basepath: str, *paths: str) -> str:
        return "/".join([basepath.rstrip("/"), *(p.strip("/") for p in paths)])

    def split(self, path: str) -> tuple[str, str]:
        head, _, tail = path.rstrip("/").rpartition("/")
        return head, tail

    def mkdirs(self, path: str) -> None:
        """No folders to make."""

    def has_dirs(self) -> bool:
        return False

    def _list(self, dir_or_prefix: str) -> Iterator[FileMetadata]:
        for local in self._keys():
            url = self._url(local)
            if url.startswith(dir_or_prefix):
                yield FileMetadata(url, os.path.getsize(local), os.path.getmtime(local))

    def _open(self, url: str, mode: str, compression_type: str) -> BinaryIO:
        compression = FileSystem._get_compression_type(url, compression_type)
        raw: Any = open(self._local(url), mode)
        if compression == CompressionTypes.UNCOMPRESSED:
            return raw  # type: ignore[no-any-return]
        compressed: Any = CompressedFile(raw, compression_type=compression)
        return compressed  # type: ignore[no-any-return]

    def create(
        self,
        path: str,
        mime_type: str = "application/octet-stream",
        compression_type: str = CompressionTypes.AUTO,
    ) -> BinaryIO:
        os.makedirs(os.path.dirname(self._local(path)), exist_ok=True)
        return self._open(path, "wb", compression_type)

    def open(
        self,
        path: str,
        mime_type: str = "application/octet-stream",
        compression_type: str = CompressionTypes.AUTO,
    ) -> BinaryIO:
        return self._open(path, "rb", compression_type)

    def _objects(self, url: str) -> list[str]:
        """The object ``url``, else the objects under it as a folder-like key."""
        if os.path.isfile(self._local(url)):
            return [url]
        prefix = url.rstrip("/") + "/"
        return [m.path for m in self._list(prefix)]

    def copy(
        self, source_file_names: list[str], destination_file_names: list[str]
    ) -> None:
        errors = {}
        for source, destination in zip(
            source_file_names, destination_file_names, strict=True
        ):
            try:
                for url in self._objects(source):
                    target = destination.rstrip("/") + url[len(source.rstrip("/")) :]
                    os.makedirs(os.path.dirname(self._local(target)), exist_ok=True)
                    shutil.copyfile(self._local(url), self._local(target))
            except OSError as error:
                errors[(source, destination)] = error
        if errors:
            raise BeamIOError("Copy operation failed", errors)

    def rename(
        self, source_file_names: list[str], destination_file_names: list[str]
    ) -> None:
        self.copy(source_file_names, destination_file_names)
        self.delete(source_file_names)

    def exists(self, path: str) -> bool:
        return os.path.isfile(self._local(path))

    def size(self, path: str) -> int:
        return os.path.getsize(self._local(path))

    def last_updated(self, path: str) -> float:
        return os.path.getmtime(self._local(path))

    def checksum(self, path: str) -> str:
        return str(self.size(path))

    def metadata(self, path: str) -> FileMetadata:
        local = self._local(path)
        return FileMetadata(path, os.path.getsize(local), os.path.getmtime(local))

    def delete(self, paths: list[str]) -> None:
        """Delete objects, or every object under a folder-like key; a key
        with no object is no error (as on GCS)."""
        errors = {}
        for path in paths:
            try:
                for url in self._objects(path):
                    os.remove(self._local(url))
            except OSError as error:
                errors[path] = error
        if errors:
            raise BeamIOError("Delete operation failed", errors)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The folder behind ``gemtest://``, holding a generated data set at
    ``gemtest://in`` (with a JSONL file of bad lines, for dead letters)."""
    root = tmp_path_factory.mktemp("gemtest")
    generate_dataset(CONFIG, root / "in")
    bad = root / "in" / "events" / "date=2026-10-01" / "bad.jsonl"
    bad.write_text('{"event_id": 1\n\nnot json\n')
    previous = os.environ.get(ROOT_ENV)
    os.environ[ROOT_ENV] = str(root)
    yield root
    if previous is None:
        del os.environ[ROOT_ENV]
    else:
        os.environ[ROOT_ENV] = previous


def _files(folder: Path) -> dict[str, bytes]:
    """Every output file under ``folder`` by relative path, but the summary."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "summary.json"
    }


def _letters(folder: Path, source_prefix: str) -> list[dict[str, Any]]:
    """Dead letters with the input's location cut off their source and
    without the time they were set aside."""
    letters = []
    for path in sorted((folder / "dead_letters").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            letter = json.loads(line)
            assert letter["source"].startswith(source_prefix), letter["source"]
            letter["source"] = letter["source"][len(source_prefix) :]
            letter["set_aside_ms"] = 0
            letters.append(letter)
    return sorted(letters, key=lambda x: (x["source"], x["offset"]))


def test_the_scheme_is_served_by_the_test_filesystem(store: Path) -> None:
    assert isinstance(FileSystems.get_filesystem(f"{PREFIX}in"), GemTestFileSystem)
    users = FileSystems.join(f"{PREFIX}in", "users.parquet")
    assert FileSystems.exists(users)
    assert not FileSystems.exists(f"{PREFIX}in")  # no folders in an object store


def test_a_job_on_the_scheme_writes_what_a_local_job_writes(
    store: Path, tmp_path: Path
) -> None:
    local_out = tmp_path / "local"
    local = build.run(
        [RUNNER, "--input", str(store / "in"), "--output", str(local_out),
         "--shards", "3", "--now-ms", str(NOW)]
    )  # fmt: skip
    # An earlier run's objects, which the job must clear first.
    stale = store / "out" / "examples" / "date=2000-01-01" / "part-00099.parquet"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"stale")
    (store / "out" / "summary.json").write_text("{}")
    remote = build.run(
        [RUNNER, f"--input={PREFIX}in", f"--output={PREFIX}out",
         "--shards", "3", "--now-ms", str(NOW)]
    )  # fmt: skip
    assert remote["counts"] == local["counts"]
    assert remote["counts"]["events_dead_lettered"] == 2
    assert not stale.exists()
    summary = json.loads((store / "out" / "summary.json").read_text())
    assert summary["counts"] == local["counts"]

    local_files = _files(local_out)
    remote_files = _files(store / "out")
    parquet = sorted(name for name in local_files if name.endswith(".parquet"))
    assert any(name.startswith("examples/") for name in parquet)
    for name in parquet:
        assert remote_files[name] == local_files[name], name
    assert sorted(remote_files) == sorted(local_files)
    assert _letters(store / "out", f"{PREFIX}in/") == _letters(
        local_out, f"{store / 'in'}/"
    )
    assert pq.read_table(store / "out" / "timelines").num_rows > 0


def test_a_missing_input_on_the_scheme_names_it(store: Path) -> None:
    with pytest.raises(InputFileError, match=f"{PREFIX}nowhere/events"):
        build.run([RUNNER, f"--input={PREFIX}nowhere", f"--output={PREFIX}o"])


def test_a_scheme_no_filesystem_serves_is_named(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="no Beam filesystem serves nosuch://"):
        build.run([RUNNER, "--input=nosuch://in", f"--output={tmp_path}"])
