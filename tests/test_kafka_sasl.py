"""SASL against the real broker: ``python -m launchers.kafka_broker
--sasl-user`` listens for SASL_PLAINTEXT, and clients whose only settings are
a ``--kafka-config`` file (``security.protocol``, ``sasl.mechanism``,
``sasl.jaas.config``) authenticate with each offered mechanism; a wrong
password is refused."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.errors import KafkaError

from features.cli import CommandParser
from features.kafka import KafkaSettings, add_kafka_arguments, ensure_topics
from features.kafka.settings import SASL_MECHANISMS
from tests.test_broker import broker_command

pytestmark = pytest.mark.integration

USER = "alice"
PASSWORD = "alice-secret"
LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


@pytest.fixture(scope="module")
def sasl_bootstrap() -> Iterator[str]:
    """The SASL_PLAINTEXT address of a broker started by its command."""
    with broker_command("--sasl-user", f"{USER}:{PASSWORD}") as process:
        assert process.stdout is not None
        ready = process.stdout.readline()
        assert ready.startswith("Kafka broker ready: "), ready
        listener = process.stdout.readline()
        assert listener.startswith("SASL_PLAINTEXT listener: 127.0.0.1:"), listener
        assert all(mechanism in listener for mechanism in SASL_MECHANISMS)
        yield listener.split()[2]


def _client_properties(
    path: Path, bootstrap: str, mechanism: str, password: str
) -> Path:
    path.write_text(
        "# as Kafka's tools take it with --command-config\n"
        f"bootstrap.servers={bootstrap}\n"
        "security.protocol=SASL_PLAINTEXT\n"
        f"sasl.mechanism={mechanism}\n"
        f"sasl.jaas.config={LOGIN_MODULES[mechanism]} required \\\n"
        f'    username="{USER}" password="{password}";\n'
        "request.timeout.ms=20000\n"
    )
    return path


def _settings_from_file(path: Path) -> KafkaSettings:
    parser = CommandParser("features.kafka.example", "Talks to Kafka.")
    add_kafka_arguments(parser)
    return KafkaSettings.from_args(parser.parse_args(["--kafka-config", str(path)]))


@pytest.mark.parametrize("mechanism", SASL_MECHANISMS)
def test_clients_authenticate_with_a_kafka_config_file(
    sasl_bootstrap: str, tmp_path: Path, mechanism: str
) -> None:
    settings = _settings_from_file(
        _client_properties(
            tmp_path / "client.properties", sasl_bootstrap, mechanism, PASSWORD
        )
    )
    assert settings.bootstrap == sasl_bootstrap
    topic = f"sasl-{mechanism.lower()}-{uuid.uuid4().hex[:8]}"
    ensure_topics(settings, {topic: 2})  # admin client and metadata probe
    sent = [f"{mechanism}-{i}".encode() for i in range(20)]
    producer = settings.producer(acks="all")
    for value in sent:
        producer.send(topic, value)
    producer.flush(timeout=30)
    producer.close()
    consumer = settings.consumer(
        topic, group_id=f"sasl-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest"
    )
    received: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(received) < len(sent) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                received += [record.value for record in records]
        consumer.commit()  # the group coordinator answers over SASL too
    finally:
        consumer.close()
    assert sorted(received) == sorted(sent)


def _send_one(settings: KafkaSettings) -> None:
    producer = settings.producer(max_block_ms=5000, bootstrap_timeout_ms=5000)
    try:
        producer.send("anything", b"x").get(timeout=10)
    finally:
        producer.close(timeout=1)


def test_a_wrong_password_is_refused(sasl_bootstrap: str, tmp_path: Path) -> None:
    settings = _settings_from_file(
        _client_properties(
            tmp_path / "client.properties", sasl_bootstrap, "PLAIN", "not-it"
        )
    )
    with pytest.raises(KafkaError):
        _send_one(settings)
