"""The embedded Kafka broker: Apache Kafka in KRaft mode, one node.

One JVM is broker and controller at once, listening on loopback. Its jars
come from Maven Central through ``requirements/kafka/pom.xml`` (``make
kafka`` copies them into ``.tools/kafka/libs``; what it needs of the host:
:mod:`launchers.kafka_host`; its configuration: :mod:`launchers.kafka_config`).
Everything talks to it with ordinary Kafka clients, so pointing the same code
at a real cluster is a matter of ``--kafka-bootstrap``.

The broker lives in one folder (its *home*): ``server.properties``, the log4j
configuration, ``broker.log`` and ``data/``, Kafka's log directory. A home
given by the caller outlives the broker: start it again on the same home and
every topic, record and committed offset is still there. Without one, a
temporary home is made and removed on stop.

With ``sasl_users`` (``--sasl-user NAME:PASSWORD``) the node also listens
for SASL_PLAINTEXT clients, with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 for
those users (the SCRAM credentials are stored when its log directory is
formatted, so a home keeps the users of its first start).

Run it on its own::

    python -m launchers.kafka_broker --home out/kafka --topic events:6

It prints the bootstrap address (and the SASL one) and runs until Ctrl-C.
Flags:

- ``--home DIR``: the broker's folder, kept with its data (default: a
  temporary one, removed on stop).
- ``--port PORT``: the client port (default: a free one).
- ``--topic NAME[:PARTITIONS]``: create this topic once it is up (repeatable).
- ``--sasl-user NAME:PASSWORD``: a SASL user (repeatable); adds the
  SASL_PLAINTEXT listener.
- ``--log FILE``: the broker's log (default: ``broker.log`` in its home).

Missing Java or jars are one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import Final, TextIO

from features.cli import CommandError, CommandParser, run_command
from features.config_flags import config_fields, flag, flag_field
from features.kafka.settings import KafkaSettings
from features.kafka.topics import ensure_topics
from launchers.jvm import LOOPBACK, Service, die_with_parent, free_loopback_port
from launchers.kafka_config import (
    SASL_LISTENER_MECHANISMS,
    check_sasl_users,
    log4j_properties,
    scram_arguments,
    server_properties,
)
from launchers.kafka_host import (
    BrokerStartError,
    answers_api_versions,
    kafka_java,
    kafka_libs,
    random_cluster_id,
)

log = logging.getLogger(__name__)

DEFAULT_HEAP: Final = "512m"
_ADDRESS_IN_USE_HINTS: Final = ("address already in use", "bindexception")


class EmbeddedKafka(Service):
    """An Apache Kafka node (KRaft, broker + controller) on loopback ports.

    Args:
        port: client port; None picks a free one (and retries on a race).
            A restart keeps the port it had.
        home: the broker's folder (configuration, ``broker.log``, ``data/``);
            kept after stop, and reused with its data by the next start. None
            makes a temporary one, removed on stop.
        log_path: where the broker's output goes; defaults to
            ``home/broker.log``.
        start_timeout: seconds to wait for the broker to answer.
        heap: the JVM's maximum heap (``-Xmx``).
        sasl_users: name → password of SASL users; when given, the node also
            listens for SASL_PLAINTEXT (:attr:`sasl_bootstrap`) with
            :data:`SASL_LISTENER_MECHANISMS`.

    Example::

        with EmbeddedKafka(home=Path("out/kafka")) as broker:
            broker.create_topics({"events": 6})
            producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        home: Path | None = None,
        log_path: Path | None = None,
        start_timeout: float = 60.0,
        heap: str = DEFAULT_HEAP,
        sasl_users: Mapping[str, str] | None = None,
    ) -> None:
        check_sasl_users(sasl_users or {})
        self._sasl_users = dict(sasl_users or {})
        self.sasl_port: int | None = None
        self._requested_port = port
        self._home = home
        self._own_home = home is None
        self._log_path = log_path
        self._own_log = log_path is None
        self._start_timeout = start_timeout
        self._heap = heap
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
    def sasl_bootstrap(self) -> str:
        """``127.0.0.1:PORT`` of the SASL_PLAINTEXT listener."""
        if self.sasl_port is None or self._process is None:
            raise RuntimeError("the embedded broker has no SASL listener running")
        return f"{LOOPBACK}:{self.sasl_port}"

    @property
    def settings(self) -> KafkaSettings:
        """Client settings for this broker."""
        return KafkaSettings(bootstrap=self.bootstrap)

    @property
    def pid(self) -> int:
        """Process id of the broker (for fault tests)."""
        if self._process is None:
            raise RuntimeError("the embedded broker is not running")
        return self._process.pid

    @property
    def home(self) -> Path | None:
        """The broker's folder (None before the first start of a temporary one)."""
        return self._home

    @property
    def log_path(self) -> Path | None:
        """The broker's log file."""
        return self._log_path

    def start(self) -> str:
        """Start the broker and wait until it answers Kafka requests.

        Returns:
            The bootstrap address.

        Raises:
            BrokerStartError: Java or the jars are missing, the port is taken,
                or the broker exited or stayed silent past ``start_timeout``;
                the message names the port and the log file.
        """
        if self._process is not None:
            return self.bootstrap
        # Missing Java or jars fail here, before a home is made.
        kafka_java()
        kafka_libs()
        requested = self._requested_port or self.port
        attempts = 1 if requested is not None else 3
        for attempt in range(attempts):
            port = requested or free_loopback_port()
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

    def _prepare_home(self, port: int, controller_port: int) -> Path:
        if self._home is None:
            self._home = Path(tempfile.mkdtemp(prefix=f"kafka-{port}-"))
        home = self._home
        data = home / "data"
        data.mkdir(parents=True, exist_ok=True)
        if self._sasl_users and self.sasl_port is None:
            self.sasl_port = free_loopback_port()
        (home / "server.properties").write_text(
            server_properties(
                port=port,
                controller_port=controller_port,
                sasl_port=self.sasl_port,
                data=data,
                sasl_users=self._sasl_users,
            )
        )
        (home / "log4j2.properties").write_text(log4j_properties())
        return home

    def _java_command(self, main: str, *args: str) -> list[str]:
        assert self._home is not None
        return [
            kafka_java(),
            f"-Xmx{self._heap}",
            "-Xms64m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self._home / 'log4j2.properties'}",
            "-cp",
            f"{kafka_libs()}/*",
            main,
            *args,
        ]

    def _format_once(self, home: Path) -> None:
        """Format ``home/data`` for KRaft unless an earlier start did."""
        if (home / "data" / "meta.properties").exists():
            return
        command = self._java_command(
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            random_cluster_id(),
            "--config",
            str(home / "server.properties"),
            *scram_arguments(self._sasl_users),
        )
        done = subprocess.run(
            command, capture_output=True, text=True, stdin=subprocess.DEVNULL
        )
        if done.returncode != 0:
            raise BrokerStartError(
                f"formatting the Kafka log directory {home / 'data'} failed "
                f"(exit {done.returncode}):\n{(done.stdout + done.stderr)[-2000:]}"
            )

    def _launch(self, port: int) -> None:
        home = self._prepare_home(port, free_loopback_port())
        if self._log_path is None:
            self._log_path = home / "broker.log"
        self._format_once(home)
        self._log_file = open(self._log_path, "a")  # closed in stop()
        command = self._java_command("kafka.Kafka", str(home / "server.properties"))
        log.info(
            "starting Kafka broker on %s:%d (home: %s, log: %s)",
            LOOPBACK,
            port,
            home,
            self._log_path,
        )
        self._process = subprocess.Popen(
            command,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # Own session: a Ctrl-C in the terminal reaches us, and we stop
            # the broker in order rather than racing it.
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )
        self.port = port
        try:
            self._wait_until_answering(port)
        except BrokerStartError:
            self.stop()
            raise

    def _wait_until_answering(self, port: int) -> None:
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
            # port. A Kafka ApiVersions round trip proves the broker is up.
            if answers_api_versions(port) and self._process.poll() is None:
                return
            if time.monotonic() > deadline:
                raise BrokerStartError(
                    f"Kafka broker on {LOOPBACK}:{port} did not answer within "
                    f"{self._start_timeout:.0f} s; log: {self._log_path}\n"
                    f"{self._log_tail()}"
                )
            time.sleep(0.05)

    def _log_tail(self, lines: int = 20) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        text = self._log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def kill(self) -> None:
        """SIGKILL the broker, as a crash would; its home and data stay.

        ``start()`` then brings it back on the same port and data.
        """
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
            process.kill()
            process.wait()
        self._close_log()

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds. Safe to call twice.

        A temporary home is removed; one the caller gave is kept.
        """
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
        self._close_log()
        if self._own_home and self._home is not None:
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None
            if self._own_log:
                self._log_path = None

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def create_topics(self, topics: dict[str, int]) -> None:
        """Create topics with the given partition counts (existing ones are kept)."""
        ensure_topics(self.settings, topics)


@contextlib.contextmanager
def kafka_cluster(
    settings: KafkaSettings, *, home: Path | None = None
) -> Iterator[KafkaSettings]:
    """The cluster ``settings`` name, or an embedded broker when they name none.

    Args:
        settings: the cluster, or none (``settings.embedded``).
        home: the embedded broker's folder (under the run's output folder);
            None for a temporary one.

    Yields settings with a bootstrap address either way; an embedded broker is
    stopped on exit, also on error or Ctrl-C.
    """
    if not settings.embedded:
        yield settings
        return
    with EmbeddedKafka(home=home) as broker:
        yield settings.with_bootstrap(broker.bootstrap)


def _parse_topic(spec: str) -> tuple[str, int]:
    name, _, partitions = spec.partition(":")
    if not name:
        raise argparse.ArgumentTypeError(f"expected NAME[:PARTITIONS], got {spec!r}")
    try:
        count = int(partitions or 1)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(
            f"bad partition count in {spec!r}: expected a positive integer"
        )
    return name, count


def _parse_sasl_user(spec: str) -> tuple[str, str]:
    name, sep, password = spec.partition(":")
    if not sep or not name or not password:
        raise argparse.ArgumentTypeError(f"expected NAME:PASSWORD, got {spec!r}")
    return name, password


@dataclasses.dataclass(frozen=True, kw_only=True)
class BrokerCommandConfig:
    """What ``python -m launchers.kafka_broker`` is told (its flags)."""

    port: int | None = flag_field(
        None, "client port (default: a free one on loopback)", metavar="PORT"
    )
    home: Path | None = flag_field(
        None, "the broker's folder, kept with its data (default: a temporary one)"
    )
    topics: list[tuple[str, int]] = field(
        default_factory=list,
        metadata=flag(
            "create this topic once the broker is up (repeatable; 1 partition "
            "unless given)",
            name="--topic",
            action="append",
            type=_parse_topic,
            metavar="NAME[:PARTITIONS]",
        ),
    )
    sasl_users: list[tuple[str, str]] = field(
        default_factory=list,
        metadata=flag(
            "a SASL user (repeatable): adds a SASL_PLAINTEXT listener with "
            + ", ".join(SASL_LISTENER_MECHANISMS),
            name="--sasl-user",
            action="append",
            type=_parse_sasl_user,
            metavar="NAME:PASSWORD",
        ),
    )
    log_path: Path | None = flag_field(
        None,
        "broker log file (default: broker.log in its home)",
        name="--log",
        metavar="FILE",
    )


def build_parser() -> CommandParser:
    """The flags of ``python -m launchers.kafka_broker``."""
    return CommandParser(
        "launchers.kafka_broker",
        __doc__.split("\n\n")[0],
        configs=[BrokerCommandConfig],
    )


def serve(args: argparse.Namespace) -> int:
    """Run the embedded broker in the foreground until Ctrl-C or SIGTERM."""
    stop = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    config = BrokerCommandConfig(**config_fields(args, BrokerCommandConfig))
    signal.signal(signal.SIGTERM, request_stop)
    try:
        broker = EmbeddedKafka(
            port=config.port,
            home=config.home,
            log_path=config.log_path,
            sasl_users=dict(config.sasl_users),
        )
    except ValueError as error:
        raise CommandError(f"--sasl-user: {error}") from error
    try:
        with broker:
            if config.topics:
                broker.create_topics(dict(config.topics))
            print(f"Kafka broker ready: {broker.bootstrap} (log: {broker.log_path})")
            if config.sasl_users:
                print(
                    f"SASL_PLAINTEXT listener: {broker.sasl_bootstrap} "
                    f"({', '.join(SASL_LISTENER_MECHANISMS)})"
                )
            print("Stop with Ctrl-C.", flush=True)
            while not stop:
                time.sleep(0.2)
    except BrokerStartError as error:
        # The first line names the cause and the log; the log has the rest.
        raise CommandError(str(error).splitlines()[0]) from error
    except KeyboardInterrupt:
        pass
    print("Kafka broker stopped.")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    return run_command(build_parser(), serve, argv)


if __name__ == "__main__":
    sys.exit(main())
