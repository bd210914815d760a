"""One writer per directory: an advisory lock held for a process's life.

A command that writes a directory it may resume from (a daemon's checkpoints,
a job's output folder) takes :class:`DirectoryLock` before it reads or writes
anything there. The lock is ``fcntl.flock`` on :data:`LOCK_NAME` inside the
directory: the kernel drops it when the holder's last descriptor closes,
which includes every way a process can end (exit, exception, SIGKILL, OOM
kill). A lock file left behind by a dead holder is therefore never "stale":
the next process simply takes it, and its recorded holder is only logged.

The file records its holder (pid, host, start time, program) as one JSON
line, so a second process refused the lock can say who holds it. The file
itself is never deleted: unlinking it would let a third process lock a new
file while the second still holds the old one.

flock is local to one host's kernel; on a network filesystem that does not
carry flock across hosts, two hosts can each take it. The holder's host is
recorded for that reason: the refusal names it.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import logging
import os
import shutil
import socket
import sys
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from features.cli import CommandError

log = logging.getLogger(__name__)

LOCK_NAME: Final = ".writer.lock"
"""The lock file inside the locked directory."""


class DirectoryLockedError(CommandError):
    """Another live process holds the directory (the message names it)."""


def lock_path(directory: Path) -> Path:
    """The lock file of ``directory``."""
    return directory / LOCK_NAME


def describe_holder(text: str) -> str:
    """A lock file's recorded holder, as a user reads it."""
    try:
        holder = json.loads(text)
        return (
            f"pid {holder['pid']} on host {holder['host']} "
            f"({holder['command']}, since {holder['started']})"
        )
    except (ValueError, KeyError, TypeError):
        return "a process that recorded no holder"


class DirectoryLock:
    """The exclusive writer's lock of ``directory`` (created if missing).

    Args:
        directory: the folder to hold.
        flag: the command-line flag that named it, for the refusal line.

    Use as a context manager, or :meth:`acquire` for the process's life
    (the kernel releases it at exit).
    """

    def __init__(self, directory: Path, flag: str) -> None:
        self.directory = directory
        self.flag = flag
        self.path = lock_path(directory)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> DirectoryLock:
        """Take the lock, or raise :class:`DirectoryLockedError` naming its holder.

        Raises:
            DirectoryLockedError: a live process holds it.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        # Not inherited by child processes (os.open's default), so a child
        # never keeps the lock alive after its parent dies.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = describe_holder(_read(fd))
            os.close(fd)
            raise DirectoryLockedError(
                f"{self.flag} {self.directory} is in use by {holder}",
                "stop that process first, or give this one another directory",
            ) from None
        except BaseException:
            os.close(fd)
            raise
        previous = _read(fd)
        if previous:
            log.info(
                "%s: taking over the lock of %s, which no longer runs",
                self.directory,
                describe_holder(previous),
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder_record()) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        """Let the lock go (closing the descriptor releases the flock)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DirectoryLock:
        return self.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.release()


def holder_record() -> dict[str, Any]:
    """What the lock file says about this process."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        # The program only: flags may carry secrets, and the file is readable.
        "command": " ".join(
            [Path(sys.orig_argv[0]).name, *sys.orig_argv[1:3]]
            if sys.orig_argv[1:2] == ["-m"]
            else [Path(sys.orig_argv[0]).name, *sys.orig_argv[1:2]]
        ),
    }


def _read(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode(errors="replace").strip()


def claim_directory(directory: Path, marker: str, flag: str) -> None:
    """Make ``directory`` a command's own output folder: create it, or empty
    it when it carries the command's ``marker`` (a folder it wrote); a
    folder holding anything else is refused. The marker is written before
    anything else, so a run that died half way is replaced by the next.

    Call it with the folder's :class:`DirectoryLock` held.

    Raises:
        CommandError: ``directory`` is a file, or a folder with files the
            command did not write.
    """
    if directory.exists() and not directory.is_dir():
        raise CommandError(f"{flag} {directory} is a file", "name a folder")
    directory.mkdir(parents=True, exist_ok=True)
    found = sorted(p for p in directory.iterdir() if p.name not in (LOCK_NAME, marker))
    if found and not (directory / marker).exists():
        names = ", ".join(p.name for p in found[:3]) + (
            ", ..." if len(found) > 3 else ""
        )
        raise CommandError(
            f"{flag} {directory} holds files this command did not write ({names})",
            "name a new or empty folder, or one this command wrote",
        )
    for path in found:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    (directory / marker).write_text(json.dumps(holder_record()) + "\n")
