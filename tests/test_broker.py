"""The embedded broker: start, topics, real clients, clean stop, clear errors,
and what a memory-only broker could not do: data that survives a restart and a
SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kafka import TopicPartition
from kafka.structs import OffsetAndMetadata

from features.kafka import KafkaSettings, topic_records
from launchers.jvm import LOOPBACK
from launchers.kafka_broker import EmbeddedKafka, kafka_cluster
from launchers.kafka_host import BrokerStartError

pytestmark = pytest.mark.integration


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); look at its state.
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


def test_start_create_topics_produce_consume_stop(tmp_path: Path) -> None:
    with EmbeddedKafka(log_path=tmp_path / "broker.log") as broker:
        host, port = broker.bootstrap.split(":")
        assert host == LOOPBACK
        broker.create_topics({"orders": 3})
        producer = broker.settings.producer()
        for i in range(30):
            producer.send("orders", key=str(i % 5).encode(), value=f"m{i}".encode())
        producer.flush()
        producer.close()
        consumer = broker.settings.consumer(consumer_timeout_ms=3000)
        assert consumer.partitions_for_topic("orders") == {0, 1, 2}
        partitions = [TopicPartition("orders", p) for p in range(3)]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        values = sorted(m.value for m in consumer)
        consumer.close()
        assert values == sorted(f"m{i}".encode() for i in range(30))
        pid = broker.pid
    # Stopped, and the port is free again.
    assert not _process_alive(pid)
    with socket.socket() as sock:
        assert sock.connect_ex((LOOPBACK, int(port))) != 0


def test_port_in_use_gives_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind((LOOPBACK, 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        log_path = tmp_path / "broker.log"
        broker = EmbeddedKafka(
            port=port, home=tmp_path / "home", log_path=log_path, start_timeout=30
        )
        with pytest.raises(BrokerStartError) as error:
            broker.start()
    message = str(error.value)
    assert f"{LOOPBACK}:{port}" in message
    assert str(log_path) in message


def test_stop_resumes_a_sigstopped_broker(tmp_path: Path) -> None:
    broker = EmbeddedKafka(home=tmp_path / "home")
    broker.start()
    pid = broker.pid
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    broker.stop(grace=20)
    assert time.monotonic() - started < 20  # stopped by SIGTERM, not the SIGKILL
    assert not _process_alive(pid)
    assert "shut down completely" in (tmp_path / "home" / "broker.log").read_text()


def test_broker_dies_with_a_killed_parent(tmp_path: Path) -> None:
    """A SIGKILLed parent (a crashed test runner) leaves no broker behind."""
    script = (
        "import time, sys\n"
        "from launchers.kafka_broker import EmbeddedKafka\n"
        "b = EmbeddedKafka(); b.start()\n"
        "print(b.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    broker_pid = int(parent.stdout.readline())
    assert _process_alive(broker_pid)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 30  # the JVM's orderly shutdown on SIGTERM
    while _process_alive(broker_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _process_alive(broker_pid)


def test_kafka_cluster_uses_an_external_cluster_as_is(
    kafka_settings: KafkaSettings,
) -> None:
    with kafka_cluster(kafka_settings) as settings:
        assert settings is kafka_settings
    with kafka_cluster(KafkaSettings()) as settings:
        assert settings.bootstrap is not None
        assert settings.bootstrap != kafka_settings.bootstrap


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def broker_command(*args: str) -> Iterator[subprocess.Popen[str]]:
    """``python -m launchers.kafka_broker ARGS``, once it says it is ready
    (its first line read); on the way out Ctrl-C, which must stop it with
    status 0, or a kill when a check failed (it must not be left running)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "launchers.kafka_broker", *args],
        stdout=subprocess.PIPE,
        text=True,
        # Ctrl-C as a terminal delivers it: a test run started in the
        # background of a script (`make test &`) has SIGINT ignored, which the
        # child would inherit, and then it never sees the signal.
        preexec_fn=_default_sigint,
    )
    try:
        assert process.stdout is not None
        yield process
        process.send_signal(signal.SIGINT)
        # Stopping gives the broker 20 s before SIGKILL (EmbeddedKafka.stop).
        assert process.wait(timeout=40) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_cli_runs_until_interrupted(tmp_path: Path) -> None:
    with broker_command("--topic", "events:4") as process:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("Kafka broker ready: 127.0.0.1:"), line
        settings = KafkaSettings(bootstrap=line.split()[3])
        consumer = settings.consumer()
        assert consumer.partitions_for_topic("events") == {0, 1, 2, 3}
        consumer.close()
    assert settings.bootstrap is not None
    host, port = settings.bootstrap.split(":")
    with socket.socket() as sock:
        assert sock.connect_ex((host, int(port))) != 0


def test_restart_on_the_same_home_keeps_topics_records_and_offsets(
    tmp_path: Path,
) -> None:
    home = tmp_path / "kafka"
    with EmbeddedKafka(home=home) as broker:
        broker.create_topics({"kept": 2})
        producer = broker.settings.producer(acks="all")
        for i in range(20):
            producer.send("kept", f"v{i}".encode(), partition=i % 2)
        producer.close()
        consumer = broker.settings.consumer(group_id="keeper", enable_auto_commit=False)
        consumer.assign([TopicPartition("kept", 0)])
        consumer.commit({TopicPartition("kept", 0): OffsetAndMetadata(7, "", -1)})
        consumer.close()
        port = broker.port
    assert (home / "data" / "meta.properties").exists()  # kept after stop
    with EmbeddedKafka(home=home, port=port) as broker:
        assert sorted(
            r.value for r in topic_records(broker.settings, "kept")
        ) == sorted(f"v{i}".encode() for i in range(20))
        consumer = broker.settings.consumer(group_id="keeper")
        assert consumer.committed(TopicPartition("kept", 0)) == 7
        consumer.close()


def test_sigkill_mid_stream_loses_no_acknowledged_record(tmp_path: Path) -> None:
    """Produce while the broker is SIGKILLed and restarted on the same data:
    every record the broker acknowledged is there afterwards, exactly once
    (the idempotent producer's retries add no copies)."""
    broker = EmbeddedKafka(home=tmp_path / "kafka")
    broker.start()
    try:
        broker.create_topics({"durable": 3})
        producer = broker.settings.producer(acks="all", linger_ms=2)
        acknowledged: list[bytes] = []
        failed: list[BaseException] = []
        lock = threading.Lock()

        def on_ack(value: bytes) -> Callable[[object], None]:
            def record(_metadata: object) -> None:
                with lock:
                    acknowledged.append(value)

            return record

        def send_all() -> None:
            for i in range(4000):
                value = f"r{i}".encode()
                future = producer.send("durable", value, partition=i % 3)
                future.add_callback(on_ack(value))
                future.add_errback(failed.append)
                time.sleep(0.001)

        sender = threading.Thread(target=send_all)
        sender.start()
        while len(acknowledged) < 500:
            time.sleep(0.01)
        broker.kill()
        with lock:
            acked_before_kill = len(acknowledged)
        time.sleep(2)
        broker.start()  # same port, same log directory
        sender.join(timeout=120)
        producer.flush(timeout=120)
        producer.close()
        assert not failed, failed[:3]
        assert 500 <= acked_before_kill < 4000  # the kill landed mid-stream
        stored = [r.value for r in topic_records(broker.settings, "durable")]
        assert len(stored) == len(set(stored)), "a record was stored twice"
        assert set(acknowledged) <= set(stored), "an acknowledged record was lost"
        assert len(acknowledged) == 4000
    finally:
        broker.stop()


def _broker_command(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-W", "error::RuntimeWarning", "-m"]
    return subprocess.run(
        [*command, "launchers.kafka_broker", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def test_cli_help_runs_without_a_runpy_warning() -> None:
    done = _broker_command("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m launchers.kafka_broker ")
    assert done.stderr == ""


def test_cli_without_jars_says_run_make_kafka(tmp_path: Path) -> None:
    done = _broker_command(env={"GEM_KAFKA_LIBS": str(tmp_path)})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "run `make kafka`" in lines[0]
    assert str(tmp_path) in lines[0]


def test_cli_without_java_says_so(tmp_path: Path) -> None:
    done = _broker_command(env={"PATH": str(tmp_path), "JAVA_HOME": ""})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "python -m launchers.kafka_broker: error: no java on PATH: the embedded "
        "Kafka broker needs Java 17 or newer; install a JDK or set JAVA_HOME"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topic", "events:0"], "bad partition count in 'events:0'"),
        (["--sasl-user", "alice"], "expected NAME:PASSWORD"),
        (["--sasl-user", "al,ice:pw"], "--sasl-user: SASL user names"),
    ],
)
def test_cli_bad_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    done = _broker_command(*args)
    assert done.returncode == 2
    assert message in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr
