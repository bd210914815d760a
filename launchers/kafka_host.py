"""What the embedded Kafka node needs beside what every JVM service needs
(``launchers.jvm``): Kafka's jars, a cluster id, and a way to tell that a
broker answers on a port.

Kafka's jars come from Maven Central through ``requirements/kafka/pom.xml``
(``make kafka`` copies them into ``.tools/kafka/libs``); ``GEM_KAFKA_LIBS``
points at another folder of them.
"""

from __future__ import annotations

import base64
import socket
import struct
import uuid
from pathlib import Path
from typing import Final

from launchers.jvm import LOOPBACK, jar_folder, java_binary

LIBS_ENV: Final = "GEM_KAFKA_LIBS"


class BrokerStartError(RuntimeError):
    """The embedded broker did not come up; the message names port and log."""


def kafka_libs() -> Path:
    """The folder of Apache Kafka's jars (``GEM_KAFKA_LIBS`` overrides).

    Raises:
        BrokerStartError: the folder holds no Kafka server jar.
    """
    return jar_folder(
        LIBS_ENV, "kafka", "kafka_2.13-*.jar", "Apache Kafka's jars", BrokerStartError
    )


def kafka_java() -> str:
    """The ``java`` that runs the broker.

    Raises:
        BrokerStartError: no Java is found.
    """
    return java_binary("the embedded Kafka broker", BrokerStartError)


def random_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding.

    Like Kafka's own ``random-uuid``, never one starting with ``-`` (a command
    line would read it as a flag); saves a JVM start.
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


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
