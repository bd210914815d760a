"""What a JVM service started beside the jobs needs from its host: Java,
a folder of jars from Maven Central, a free loopback port, and a child
process that does not outlive its parent.

Java is ``JAVA_HOME``'s, else the one on ``PATH``. Each service's jars are
copied by a ``make`` target into ``.tools/<service>/libs``; an environment
variable points at another folder of them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
from pathlib import Path
from types import TracebackType
from typing import Final, Self

LOOPBACK: Final = "127.0.0.1"
TOOLS: Final = Path(__file__).resolve().parents[1] / ".tools"
_PR_SET_PDEATHSIG: Final = 1


def java_binary(service: str, error: type[RuntimeError]) -> str:
    """The ``java`` of ``JAVA_HOME``, else the one on ``PATH``.

    Raises:
        error: no Java is found (the message names ``service``).
    """
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise error(
            f"no java on PATH: {service} needs Java 17 or newer; "
            "install a JDK or set JAVA_HOME"
        )
    return found


def jar_folder(
    env: str, make_target: str, marker: str, jars: str, error: type[RuntimeError]
) -> Path:
    """The folder of a service's jars: ``$env``, else ``.tools/<make_target>/libs``.

    Raises:
        error: the folder holds no jar matching ``marker`` (the message says
            which ``make`` target fetches ``jars``).
    """
    override = os.environ.get(env)
    libs = Path(override) if override else TOOLS / make_target / "libs"
    if not any(libs.glob(marker)):
        raise error(
            f"{jars} are not in {libs}; run `make {make_target}` "
            f"(or set {env} to a folder of them)"
        )
    return libs


def free_loopback_port() -> int:
    """A TCP port that was free on the loopback interface a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the parent dies (Linux).

    Keeps a service from outliving a test runner or demo that was SIGKILLed.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Service:
    """A service that is started on entering a ``with`` block and stopped on
    leaving it, however the block ends."""

    def start(self) -> object:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()
