"""What the embedded Kafka node needs from its host: Java, Kafka's jars, a
free loopback port, and a way to tell that a broker answers there.

Kafka's jars come from Maven Central through ``requirements/kafka/pom.xml``
(``make kafka`` copies them into ``.tools/kafka/libs``); ``GEM_KAFKA_LIBS``
points at another folder of them. Java is ``JAVA_HOME``'s, else the one on
``PATH``.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import struct
import uuid
from pathlib import Path
from typing import Final

LOOPBACK: Final = "127.0.0.1"
LIBS_ENV: Final = "GEM_KAFKA_LIBS"
DEFAULT_LIBS: Final = Path(__file__).resolve().parents[1] / ".tools" / "kafka" / "libs"
_PR_SET_PDEATHSIG: Final = 1


class BrokerStartError(RuntimeError):
    """The embedded broker did not come up; the message names port and log."""


def kafka_libs() -> Path:
    """The folder of Apache Kafka's jars (``GEM_KAFKA_LIBS`` overrides).

    Raises:
        BrokerStartError: the folder holds no Kafka server jar.
    """
    override = os.environ.get(LIBS_ENV)
    libs = Path(override) if override else DEFAULT_LIBS
    if not any(libs.glob("kafka_2.13-*.jar")):
        raise BrokerStartError(
            f"Apache Kafka's jars are not in {libs}; run `make kafka` "
            f"(or set {LIBS_ENV} to a folder of them)"
        )
    return libs


def java_binary() -> str:
    """The ``java`` of ``JAVA_HOME``, else the one on ``PATH``.

    Raises:
        BrokerStartError: no Java is found.
    """
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise BrokerStartError(
            "no java on PATH: the embedded Kafka broker needs Java 17 or newer; "
            "install a JDK or set JAVA_HOME"
        )
    return found


def free_loopback_port() -> int:
    """A TCP port that was free on the loopback interface a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def random_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding.

    Like Kafka's own ``random-uuid``, never one starting with ``-`` (a command
    line would read it as a flag); saves a JVM start.
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the parent dies (Linux).

    Keeps a broker from outliving a test runner or demo that was SIGKILLed.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def answers_api_versions(port: int, timeout: float = 0.5) -> bool:
    """True when a Kafka broker on ``port`` answers an ApiVersions (v0) request."""
    correlation_id = 0x6E6D
    client = b"gem-probe"
    body = struct.pack(">hhih", 18, 0, correlation_id, len(client)) + client
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            header = b""
            while len(header) < 8:
                chunk = sock.recv(8 - len(header))
                if not chunk:
                    return False
                header += chunk
    except OSError:
        return False
    _size, answered_id = struct.unpack(">ii", header)
    return bool(answered_id == correlation_id)
