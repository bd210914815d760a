"""Kafka settings as Kafka users write them: ``--kafka-config`` properties
files and ``--kafka-option`` by Kafka's names, mapped per client kind to
kafka-python's keywords, one-line errors for what no client takes, and the
round trip to a child process's flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

from features.cli import EXIT_USAGE, CommandError, CommandParser, run_command
from features.kafka import KafkaSettings, add_kafka_arguments
from features.kafka.client_properties import (
    CLIENT_KINDS,
    client_keywords,
    jaas_login,
    kafka_python_defaults,
    parse_properties,
)
from features.kafka.settings import (
    MAX_MESSAGE_BYTES,
    PASSWORD_ENV,
    SSL_PASSWORD_ENV,
    THROUGHPUT_PRODUCER,
)

PLAIN_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="alice" password="alice-secret";'
)


def _parser() -> CommandParser:
    parser = CommandParser("features.kafka.example", "Talks to Kafka.")
    add_kafka_arguments(parser)
    return parser


def _settings(*argv: str) -> KafkaSettings:
    return KafkaSettings.from_args(_parser().parse_args(list(argv)))


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_properties_file_reads_as_java_does() -> None:
    text = (
        "# a comment\n"
        "! another comment\n"
        "\n"
        "   bootstrap.servers = a:9092, b:9092\n"
        "client.id:reporting\n"
        "request.timeout.ms 60000\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule \\\n"
        '    required username="alice" \\\n'
        '    password="alice-secret";\n'
        "key\\=with\\:escapes=tab\\there \\u00e9\n"
        "empty=\n"
    )
    assert parse_properties(text) == {
        "bootstrap.servers": "a:9092, b:9092",
        "client.id": "reporting",
        "request.timeout.ms": "60000",
        "sasl.jaas.config": PLAIN_JAAS,
        "key=with:escapes": "tab\there é",
        "empty": "",
    }


def test_a_malformed_escape_names_the_file_and_line() -> None:
    with pytest.raises(ValueError, match=r"client.properties:2: malformed"):
        parse_properties("a=1\nb=\\u12\n", source="client.properties")


def test_each_client_kind_gets_only_the_properties_it_has() -> None:
    settings = KafkaSettings(
        bootstrap="127.0.0.1:9092",
        properties={
            "request.timeout.ms": "60000",
            "acks": "all",
            "linger.ms": "5",
            "max.poll.records": "50",
            "enable.auto.commit": "false",
        },
    )
    consumer = settings.consumer_config()
    producer = settings.producer_config()
    admin = settings.admin_config()
    for config in (consumer, producer, admin, settings.client_config()):
        assert config["request_timeout_ms"] == 60000
        assert config["bootstrap_servers"] == ["127.0.0.1:9092"]
    assert consumer["max_poll_records"] == 50
    assert consumer["enable_auto_commit"] is False
    assert not {"acks", "linger_ms"} & set(consumer)
    assert (producer["acks"], producer["linger_ms"]) == ("all", 5)
    assert not {"max_poll_records", "session_timeout_ms"} & set(producer)
    assert not {"acks", "max_poll_records", "session_timeout_ms"} & set(admin)
    # client_config: what every kind takes, nothing one kind would refuse.
    assert not {"acks", "max_poll_records"} & set(settings.client_config())
    for kind, config in (("consumer", consumer), ("producer", producer)):
        assert set(config) <= set(kafka_python_defaults()[kind])
    assert set(admin) <= set(kafka_python_defaults()["admin"])


def test_values_read_as_kafka_reads_them() -> None:
    settings = _settings(
        "--kafka-option=bootstrap.servers= a:1 ,b:2",
        "--kafka-option=compression.type=none",
        "--kafka-option=enable.idempotence=TRUE",
        "--kafka-option=retries=3",
        "--kafka-option=ssl.endpoint.identification.algorithm=",
        "--kafka-option=partition.assignment.strategy="
        "org.apache.kafka.clients.consumer.RoundRobinAssignor,range",
        "--kafka-option=group.id=1234",
        "--kafka-option=api.version=3.9.0",
    )
    assert settings.bootstrap == "a:1,b:2"
    producer = settings.producer_config()
    assert producer["bootstrap_servers"] == ["a:1", "b:2"]
    assert producer["compression_type"] is None
    assert producer["enable_idempotence"] is True
    assert producer["retries"] == 3
    assert producer["ssl_check_hostname"] is False
    assert producer["api_version"] == (3, 9, 0)
    consumer = settings.consumer_config()
    assert consumer["partition_assignment_strategy"] == (
        RoundRobinPartitionAssignor,
        RangePartitionAssignor,
    )
    assert consumer["group_id"] == "1234"  # a group id stays text


def test_command_overrides_win_over_properties() -> None:
    settings = _settings(
        "--kafka-bootstrap=a:1",
        "--kafka-option=group.id=theirs",
        "--kafka-option=linger.ms=9",
    )
    assert settings.consumer_config(group_id="ours")["group_id"] == "ours"
    assert settings.producer_config(linger_ms=2)["linger_ms"] == 2


def test_throughput_producers_batch_and_wait_for_every_replica() -> None:
    settings = _settings("--kafka-bootstrap=a:1", "--kafka-option=linger.ms=9")
    config = settings.producer_config(throughput=True)
    assert {k: config[k] for k in THROUGHPUT_PRODUCER} == THROUGHPUT_PRODUCER
    assert config["max_request_size"] == MAX_MESSAGE_BYTES
    assert "throughput" not in config
    smaller = settings.producer_config(throughput=True, max_request_size=1024)
    assert (smaller["max_request_size"], smaller["linger_ms"]) == (1024, 5)
    assert settings.producer_config()["linger_ms"] == 9


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            "sesion.timeout.ms=1",
            "'sesion.timeout.ms' (did you mean session.timeout.ms?)",
        ),
        ("session_timeout_ms=1", "(did you mean session.timeout.ms?)"),
        ("bootstrap.server=a:1", "(did you mean bootstrap.servers?)"),
        ("request.timeout.ms=soon", "request.timeout.ms=soon: expected an integer"),
        ("enable.auto.commit=yes", "enable.auto.commit=yes: expected true or false"),
        ("acks=2", "acks=2: expected all, -1, 0 or 1"),
        ("ssl.truststore.location=/etc/ts.jks", "cannot read a JKS store"),
        (
            "ssl.truststore.password=changeit",
            "ssl.truststore.password is not supported",
        ),
        ("ssl.cipher.suites=TLS_AES_128_GCM_SHA256", "ssl.ciphers"),
        ("key.serializer=org.apache.kafka.Foo", "key.serializer is not supported"),
        ("sasl.mechanism=OAUTHBEARER", "token provider"),
        (
            "sasl.jaas.config=com.sun.security.auth.module.Krb5LoginModule required;",
            "Krb5LoginModule is not supported",
        ),
        (
            "partition.assignment.strategy="
            "org.apache.kafka.clients.consumer.CooperativeStickyAssignor",
            "not in kafka-python",
        ),
        ("timeout", "--kafka-option expects KEY=VALUE"),
    ],
)
def test_a_property_no_client_takes_is_one_line(option: str, message: str) -> None:
    with pytest.raises(CommandError) as error:
        _settings(f"--kafka-option={option}")
    text = str(error.value)
    assert message in text
    assert "\n" not in text


def test_errors_from_the_file_name_it(tmp_path: Path) -> None:
    config = _write(tmp_path / "client.properties", "linger.msx=5\n")
    with pytest.raises(
        CommandError,
        match=r"--kafka-config .*client.properties: .*"
        r"did you mean linger.ms\?",
    ):
        _settings("--kafka-config", config)


def test_a_command_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def command(args: argparse.Namespace) -> int:
        KafkaSettings.from_args(args)
        return 0

    status = run_command(_parser(), command, ["--kafka-option", "max.poll.record=5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == EXIT_USAGE
    assert err == [
        "python -m features.kafka.example: error: --kafka-option: unknown Kafka "
        "client property 'max.poll.record' (did you mean max.poll.records?)"
    ]
    status = run_command(_parser(), command, ["--kafka-config", str(tmp_path / "no")])
    assert status == EXIT_USAGE
    assert "cannot open" in capsys.readouterr().err


def _password(settings: KafkaSettings) -> str:
    assert settings.sasl_password is not None
    return settings.sasl_password.read()


def test_precedence_file_then_options_then_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    config = _write(
        tmp_path / "client.properties",
        "bootstrap.servers=file:9092\n"
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=PLAIN\n"
        f"sasl.jaas.config={PLAIN_JAAS}\n"
        "session.timeout.ms=45000\n"
        "linger.ms=1\n"
        "client.id=from-file\n",
    )
    settings = _settings(
        "--kafka-config", config,
        "--kafka-option", "linger.ms=7",
        "--kafka-option", "bootstrap.servers=option:9092",
        "--kafka-bootstrap", "flag:9092",
    )  # fmt: skip
    assert settings.bootstrap == "flag:9092"
    assert settings.security_protocol == "SASL_PLAINTEXT"
    assert settings.sasl_username == "alice"
    assert settings.sasl_password is not None
    assert settings.sasl_password.read() == "alice-secret"
    assert settings.session_timeout_ms == 45000
    assert settings.properties == {"linger.ms": "7", "client.id": "from-file"}
    consumer = settings.consumer_config()
    assert consumer["session_timeout_ms"] == 45000
    assert consumer["sasl_plain_password"] == "alice-secret"
    assert "linger_ms" not in consumer
    # The environment's password beats the file's; the flag beats both.
    monkeypatch.setenv(PASSWORD_ENV, "from-env")
    assert _password(_settings("--kafka-config", config)) == "from-env"
    flagged = _settings("--kafka-config", config, "--kafka-sasl-password", "flag")
    assert _password(flagged) == "flag"
    assert _settings().embedded


def test_to_args_round_trips_through_a_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (PASSWORD_ENV, SSL_PASSWORD_ENV):
        monkeypatch.delenv(name, raising=False)
    ca = _write(tmp_path / "ca.pem", "")
    keystore = _write(tmp_path / "client.pem", "")
    config = _write(
        tmp_path / "client.properties",
        "bootstrap.servers=a:9093,b:9093\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule "
        "required username='bob' password='p=s s';\n"
        f"ssl.truststore.location={ca}\n"
        "ssl.truststore.type=PEM\n"
        f"ssl.keystore.location={keystore}\n"
        "ssl.keystore.type=pem\n"
        "ssl.key.password=key-secret\n"
        "heartbeat.interval.ms=1500\n"
        "max.poll.records=10\n",
    )
    parent = _settings("--kafka-config", config)
    assert (parent.ssl_cafile, parent.ssl_certfile) == (ca, keystore)
    args = parent.to_args()
    assert not any("secret" in arg or "p=s s" in arg for arg in args)
    env = parent.child_env()
    for name in (PASSWORD_ENV, SSL_PASSWORD_ENV):
        monkeypatch.setenv(name, env[name])
    child = _settings(*args)
    assert child == parent
    assert child.consumer_config()["sasl_plain_password"] == "p=s s"
    assert child.consumer_config()["ssl_password"] == "key-secret"
    assert child.consumer_config() == parent.consumer_config()


def test_only_the_mechanisms_kafka_python_completes_are_offered(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stop:
        _parser().parse_args(["--kafka-sasl-mechanism", "OAUTHBEARER"])
    assert stop.value.code == EXIT_USAGE
    assert "invalid choice: 'OAUTHBEARER'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="token provider"):
        KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER")
    with pytest.raises(ValueError, match="needs a username and a password"):
        KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism="PLAIN")
    with pytest.raises(CommandError, match=r"not sasl\.mechanism=SCRAM-SHA-256"):
        _settings(
            "--kafka-option=security.protocol=SASL_PLAINTEXT",
            "--kafka-option=sasl.mechanism=SCRAM-SHA-256",
            f"--kafka-option=sasl.jaas.config={PLAIN_JAAS}",
        )


def test_jaas_login_reads_quotes_and_escapes() -> None:
    assert jaas_login(
        "org.apache.kafka.common.security.scram.ScramLoginModule required\n"
        '  username=bob password="a \\"quoted\\" one" tokenauth=false;'
    ) == (("SCRAM-SHA-256", "SCRAM-SHA-512"), "bob", 'a "quoted" one')
    with pytest.raises(ValueError, match="no password"):
        jaas_login(
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            "username=bob;"
        )


@pytest.mark.integration
def test_every_client_kind_accepts_its_config(kafka_settings: KafkaSettings) -> None:
    """kafka-python refuses a keyword its client does not have: each kind is
    built against the real broker with properties of all three kinds."""
    settings = KafkaSettings(
        bootstrap=kafka_settings.bootstrap,
        properties={
            "request.timeout.ms": "20000",
            "client.id": "settings-test",
            "max.poll.records": "10",
            "acks": "all",
            "linger.ms": "3",
            "compression.type": "gzip",
            "isolation.level": "read_committed",
            "client.dns.lookup": "use_all_dns_ips",
            "connections.max.idle.ms": "60000",
        },
    )
    assert set(client_keywords(settings.properties, "admin")) == {
        "request_timeout_ms",
        "client_id",
        "client_dns_lookup",
        "connections_max_idle_ms",
    }
    clients = [
        KafkaConsumer(**settings.consumer_config()),
        KafkaProducer(**settings.producer_config()),
        KafkaAdminClient(**settings.admin_config()),
    ]
    assert len(clients) == len(CLIENT_KINDS)
    consumer, producer, admin = clients
    try:
        assert consumer.config["isolation_level"] == "read_committed"
        assert producer.config["compression_type"] == "gzip"
        assert admin.config["client_id"] == "settings-test"
        assert isinstance(admin.list_topics(), list)
    finally:
        for client in clients:
            client.close()
