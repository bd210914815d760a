"""How every process of the system talks to Kafka.

One :class:`KafkaSettings` carries the bootstrap servers, the security options
and any further client properties of a cluster; :func:`add_kafka_arguments`
gives every CLI the same flags, and :meth:`KafkaSettings.consumer_config`,
:meth:`~KafkaSettings.producer_config` and :meth:`~KafkaSettings.admin_config`
turn them into the keyword arguments of that kafka-python client. With no
bootstrap address the tools start the embedded broker
(:mod:`launchers.kafka_broker`); with one they use that cluster as is.

The flags, as Kafka users write client settings:

- ``--kafka-config client.properties``: a Java-style properties file, as
  Kafka's own tools read with ``--command-config`` (``key=value`` lines,
  ``#``/``!`` comments), by Kafka's property names.
- ``--kafka-option session.timeout.ms=45000`` (repeatable): one property.
- ``--kafka-bootstrap``, ``--kafka-security-protocol``, ``--kafka-sasl-*``,
  ``--kafka-ssl-*``: the connection and security settings by flag.

Later wins: the file, then ``--kafka-option``, then the other ``--kafka-*``
flags (and ``KAFKA_SASL_PASSWORD`` for ``--kafka-sasl-password``).

The settings never hold a password, only where it is
(:class:`~features.kafka.secrets.Secret`: ``$KAFKA_SASL_PASSWORD``,
``--kafka-sasl-password-file``, the ``--kafka-config`` file), read when a
client is made: a Beam job's graph, which pickles the settings into its
DoFns, carries no secret, and each worker reads it at ``setup()``. Each client
kind gets the properties it has (``session.timeout.ms`` reaches consumers
only); a property no client knows is an error naming the closest known one
(:mod:`features.kafka.client_properties` has the mapping). SASL works with
PLAIN and SCRAM-SHA-256/512, a username and a password (``sasl.jaas.config``
with Kafka's ``PlainLoginModule`` or ``ScramLoginModule`` gives both);
kafka-python reads PEM files only (``ssl.truststore.type=PEM``).

The group session timeout is Kafka's smallest default allowance (the broker's
``group.min.session.timeout.ms``) rather than kafka-python's 45 s: a consumer
restarted after a crash waits for its dead predecessor to be evicted before
the group settles, and that wait is the session timeout.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from features.cli import CommandError
from features.kafka import client_fixes, client_properties
from features.kafka.secrets import (
    PASSWORD_ENV,
    SSL_PASSWORD_ENV,
    Secret,
    file_secrets,
    flag_secret,
)

SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# The mechanisms kafka-python completes with a username and a password; the
# others need objects (OAUTHBEARER's token provider) or Kerberos.
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# Consumer-group timing (see the module docstring).
GROUP_SESSION_TIMEOUT_MS: Final = 6000
GROUP_HEARTBEAT_INTERVAL_MS: Final = 2000
# kafka-python backs off reconnects up to 30 s; Kafka's Java clients stop at
# 1 s, which is what lets a client resume within a second of a broker restart.
RECONNECT_BACKOFF_MAX_MS: Final = 1000
# The largest message the system writes (a batch of examples with their
# timeline segments); topics it creates allow it (``max.message.bytes``).
MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
# The per-partition fetch of the raw-event readers (kafka-python's default is
# 1 MiB): a poll brings tens of thousands of small events.
EVENT_FETCH_BYTES: Final = 8 * 1024 * 1024
# kafka-python's defaults send tiny batches; larger, lingering batches carry
# the same records in far fewer requests. A record counts as sent once every
# in-sync replica has it.
THROUGHPUT_PRODUCER: Final = {
    "linger_ms": 5,
    "batch_size": 262_144,
    "acks": "all",
    "max_request_size": MAX_MESSAGE_BYTES,
}

# Properties that are KafkaSettings fields, by Kafka's name (and kafka-python's
# spelling where Kafka has none).
_FIELD_PROPERTIES: Final = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.plain.username": "sasl_username",
    "sasl.plain.password": "sasl_password",
    "ssl.cafile": "ssl_cafile",
    "ssl.certfile": "ssl_certfile",
    "ssl.keyfile": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.password": "ssl_password",
}
_FIELD_INTEGER_PROPERTIES: Final = {
    "session.timeout.ms": "session_timeout_ms",
    "heartbeat.interval.ms": "heartbeat_interval_ms",
}
# Read together with others below rather than one to one.
_COMPOSITE_PROPERTIES: Final = (
    "bootstrap.servers",
    "sasl.jaas.config",
    "ssl.truststore.location",
    "ssl.truststore.type",
    "ssl.keystore.location",
    "ssl.keystore.type",
)
FIELD_PROPERTY_NAMES: Final = frozenset(
    {*_FIELD_PROPERTIES, *_FIELD_INTEGER_PROPERTIES, *_COMPOSITE_PROPERTIES}
)


@dataclass(frozen=True, kw_only=True)
class KafkaSettings:
    """Where the cluster is, how to authenticate, and further client properties.

    Args:
        bootstrap: ``host:port[,host:port...]``; None means "start the embedded
            broker".
        security_protocol: one of :data:`SECURITY_PROTOCOLS`.
        sasl_mechanism: one of :data:`SASL_MECHANISMS`, when the protocol is
            SASL_*.
        sasl_username: SASL user.
        sasl_password: where the SASL password is (``--kafka-sasl-password``,
            ``--kafka-sasl-password-file``, the ``KAFKA_SASL_PASSWORD``
            environment variable, which keeps it out of the process list, or
            ``sasl.jaas.config``).
        ssl_cafile: CA bundle (PEM) to verify the brokers.
        ssl_certfile: client certificate (PEM, mutual TLS).
        ssl_keyfile: client key (PEM, mutual TLS).
        ssl_password: where the client key's password is (``ssl.key.password``,
            ``KAFKA_SSL_KEY_PASSWORD``).
        properties: further client properties by Kafka name, as written
            (``{"request.timeout.ms": "60000"}``); each client kind gets the
            ones it has.
        session_timeout_ms: consumer-group session timeout.
        heartbeat_interval_ms: consumer-group heartbeat interval.

    Raises:
        ValueError: an unknown protocol or mechanism, SASL without a username
            and password, or a property no client knows.
    """

    bootstrap: str | None = None
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    # Compared by the rest: one password may be read from different places.
    sasl_password: Secret | None = field(default=None, repr=False, compare=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: Secret | None = field(default=None, repr=False, compare=False)
    properties: Mapping[str, str] = field(default_factory=dict)
    session_timeout_ms: int = GROUP_SESSION_TIMEOUT_MS
    heartbeat_interval_ms: int = GROUP_HEARTBEAT_INTERVAL_MS

    def __post_init__(self) -> None:
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise ValueError(
                f"unknown Kafka security protocol {self.security_protocol!r}; "
                f"expected one of {', '.join(SECURITY_PROTOCOLS)}"
            )
        if self.sasl_mechanism is not None:
            _check_mechanism(self.sasl_mechanism)
        if self.security_protocol.startswith("SASL"):
            if not self.sasl_mechanism:
                raise ValueError(
                    f"security protocol {self.security_protocol} needs a SASL "
                    f"mechanism ({', '.join(SASL_MECHANISMS)})"
                )
            if not self.sasl_username or self.sasl_password is None:
                raise ValueError(
                    f"SASL {self.sasl_mechanism} needs a username and a password "
                    f"(--kafka-sasl-username with {PASSWORD_ENV}, or "
                    "sasl.jaas.config)"
                )
        owned = sorted(FIELD_PROPERTY_NAMES & set(self.properties))
        if owned:
            raise ValueError(
                f"Kafka property {owned[0]} is a KafkaSettings field; "
                "use KafkaSettings.from_properties"
            )
        if self.properties:
            client_properties.check_properties(
                self.properties, extra=FIELD_PROPERTY_NAMES
            )

    @property
    def embedded(self) -> bool:
        """True when no cluster was named and the embedded broker is to be used."""
        return self.bootstrap is None

    def with_bootstrap(self, bootstrap: str) -> KafkaSettings:
        """A copy pointing at ``bootstrap`` (used once the embedded broker is up)."""
        return dataclasses.replace(self, bootstrap=bootstrap)

    def client_config(self) -> dict[str, Any]:
        """Keyword arguments every kafka-python client kind takes: the
        connection, security, and the properties all three kinds have.

        Raises:
            ValueError: when no bootstrap address is set yet.
        """
        config = self._connection_config()
        config.update(client_properties.shared_keywords(self.properties))
        return config

    def consumer_config(self, **overrides: Any) -> dict[str, Any]:
        """``KafkaConsumer`` keyword arguments: the connection, the group
        timing above, the consumer's properties, then ``overrides`` (what the
        command itself needs, such as its group id)."""
        config = self._connection_config()
        config["session_timeout_ms"] = self.session_timeout_ms
        config["heartbeat_interval_ms"] = self.heartbeat_interval_ms
        config.update(client_properties.client_keywords(self.properties, "consumer"))
        config.update(overrides)
        return config

    def producer_config(
        self, *, throughput: bool = False, **overrides: Any
    ) -> dict[str, Any]:
        """``KafkaProducer`` keyword arguments: the connection, the producer's
        properties, :data:`THROUGHPUT_PRODUCER` when ``throughput``, then
        ``overrides``."""
        config = self._connection_config()
        config.update(client_properties.client_keywords(self.properties, "producer"))
        if throughput:
            config.update(THROUGHPUT_PRODUCER)
        config.update(overrides)
        return config

    def admin_config(self, **overrides: Any) -> dict[str, Any]:
        """``KafkaAdminClient`` keyword arguments: the connection, the admin
        client's properties, then ``overrides``."""
        config = self._connection_config()
        config.update(client_properties.client_keywords(self.properties, "admin"))
        config.update(overrides)
        return config

    def consumer(self, *topics: str, **overrides: Any) -> Any:
        """A ``kafka.KafkaConsumer`` on :meth:`consumer_config`, subscribed to
        ``topics`` when any are given.

        The one place the project builds a consumer, so every one of them
        gets the same connection, security and client properties.
        """
        client_fixes.apply()
        from kafka import KafkaConsumer

        return KafkaConsumer(*topics, **self.consumer_config(**overrides))

    def producer(self, *, throughput: bool = False, **overrides: Any) -> Any:
        """A ``kafka.KafkaProducer`` on :meth:`producer_config` (``throughput``:
        batched for volume, :data:`THROUGHPUT_PRODUCER`)."""
        client_fixes.apply()
        from kafka import KafkaProducer

        return KafkaProducer(**self.producer_config(throughput=throughput, **overrides))

    def admin(self, **overrides: Any) -> Any:
        """A ``kafka.KafkaAdminClient`` on :meth:`admin_config`."""
        client_fixes.apply()
        from kafka import KafkaAdminClient

        return KafkaAdminClient(**self.admin_config(**overrides))

    def _connection_config(self) -> dict[str, Any]:
        if self.bootstrap is None:
            raise ValueError("no Kafka bootstrap address: start a broker first")
        config: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap.split(","),
            "security_protocol": self.security_protocol,
            "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
        }
        optional = {
            "sasl_mechanism": self.sasl_mechanism,
            "sasl_plain_username": self.sasl_username,
            "sasl_plain_password": _read(self.sasl_password),
            "ssl_cafile": self.ssl_cafile,
            "ssl_certfile": self.ssl_certfile,
            "ssl_keyfile": self.ssl_keyfile,
            "ssl_password": _read(self.ssl_password),
        }
        config.update({k: v for k, v in optional.items() if v is not None})
        return config

    def to_args(self) -> list[str]:
        """The flags :func:`add_kafka_arguments` parses back into these settings.

        The passwords are left out: pass them to the child process through
        ``KAFKA_SASL_PASSWORD`` and ``KAFKA_SSL_KEY_PASSWORD`` (see
        :meth:`child_env`), not its command line.
        """
        if self.bootstrap is None:
            raise ValueError("no Kafka bootstrap address: start a broker first")
        args = [
            f"--kafka-bootstrap={self.bootstrap}",
            f"--kafka-security-protocol={self.security_protocol}",
        ]
        optional = {
            "--kafka-sasl-mechanism": self.sasl_mechanism,
            "--kafka-sasl-username": self.sasl_username,
            "--kafka-ssl-cafile": self.ssl_cafile,
            "--kafka-ssl-certfile": self.ssl_certfile,
            "--kafka-ssl-keyfile": self.ssl_keyfile,
        }
        args += [f"{flag}={value}" for flag, value in optional.items() if value]
        timing = {
            "session.timeout.ms": (self.session_timeout_ms, GROUP_SESSION_TIMEOUT_MS),
            "heartbeat.interval.ms": (
                self.heartbeat_interval_ms,
                GROUP_HEARTBEAT_INTERVAL_MS,
            ),
        }
        args += [
            f"--kafka-option={name}={value}"
            for name, (value, default) in timing.items()
            if value != default
        ]
        args += [f"--kafka-option={k}={v}" for k, v in self.properties.items()]
        return args

    def child_env(self) -> dict[str, str]:
        """Environment for a child process given :meth:`to_args` (the passwords)."""
        return {**os.environ, **self._password_env()}

    def export_secrets(self) -> None:
        """Put the passwords given on the command line into this process's
        environment, where the settings' pickled copies read them: a local
        runner's workers in this process, as a remote worker reads its own
        environment."""
        os.environ.update(
            {
                secret.env: secret.value
                for secret in (self.sasl_password, self.ssl_password)
                if secret is not None and secret.env and secret.value is not None
            }
        )

    def _password_env(self) -> dict[str, str]:
        found = {
            PASSWORD_ENV: _read(self.sasl_password),
            SSL_PASSWORD_ENV: _read(self.ssl_password),
        }
        return {name: value for name, value in found.items() if value is not None}

    @classmethod
    def from_properties(
        cls, properties: Mapping[str, str], **fields: Any
    ) -> KafkaSettings:
        """Settings from Kafka client properties (a ``client.properties``'s
        content); ``fields`` override what the properties say.

        Raises:
            ValueError: one line, naming the property.
        """
        return cls(**{**_fields_from_properties(properties), **fields})

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> KafkaSettings:
        """Settings from the flags :func:`add_kafka_arguments` defined.

        Raises:
            CommandError: a property no client knows, an unreadable value, or
                settings that do not fit together (one line).
            FileNotFoundError: no such ``--kafka-config`` file.
        """
        try:
            properties: dict[str, str] = {}
            config_file = getattr(args, "kafka_config", None)
            from_file: dict[str, str] = {}
            if config_file:
                from_file = client_properties.read_properties_file(Path(config_file))
                _check_names(from_file, f"--kafka-config {config_file}")
                properties.update(from_file)
            options = _parse_options(getattr(args, "kafka_option", None) or ())
            _check_names(options, "--kafka-option")
            properties.update(options)
            fields = _fields_from_properties(properties)
            if config_file:
                fields.update(file_secrets(fields, config_file, from_file, options))
            explicit = {
                "bootstrap": getattr(args, "kafka_bootstrap", None),
                "security_protocol": getattr(args, "kafka_security_protocol", None),
                "sasl_mechanism": getattr(args, "kafka_sasl_mechanism", None),
                "sasl_username": getattr(args, "kafka_sasl_username", None),
                "sasl_password": flag_secret(args),
                "ssl_cafile": getattr(args, "kafka_ssl_cafile", None),
                "ssl_certfile": getattr(args, "kafka_ssl_certfile", None),
                "ssl_keyfile": getattr(args, "kafka_ssl_keyfile", None),
                "ssl_password": Secret(env=SSL_PASSWORD_ENV)
                if SSL_PASSWORD_ENV in os.environ
                else None,
            }
            fields.update({k: v for k, v in explicit.items() if v is not None})
            return cls(**fields)
        except ValueError as error:
            raise CommandError(str(error)) from error


def _read(secret: Secret | None) -> str | None:
    return None if secret is None else secret.read()


def _check_mechanism(mechanism: str) -> None:
    if mechanism in SASL_MECHANISMS:
        return
    why = {
        "OAUTHBEARER": "it needs a token provider object, which no flag or "
        "property can give",
        "GSSAPI": "Kerberos is not set up for kafka-python here",
    }.get(mechanism, "kafka-python has no such mechanism")
    raise ValueError(
        f"SASL mechanism {mechanism} is not offered ({why}); "
        f"use one of {', '.join(SASL_MECHANISMS)}"
    )


def _parse_options(items: Any) -> dict[str, str]:
    """``["session.timeout.ms=45000"]`` → ``{"session.timeout.ms": "45000"}``."""
    options: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--kafka-option expects KEY=VALUE, got {item!r}")
        options[key.strip()] = value.strip()
    return options


def _check_names(properties: Mapping[str, str], source: str) -> None:
    """Every property of ``source`` is known (field ones are read below)."""
    for name, value in properties.items():
        if name in FIELD_PROPERTY_NAMES:
            continue
        try:
            client_properties.check_property(name, value, extra=FIELD_PROPERTY_NAMES)
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None


def _fields_from_properties(properties: Mapping[str, str]) -> dict[str, Any]:
    """KafkaSettings keyword arguments: the field properties read into
    fields, the rest kept as ``properties``."""
    rest = dict(properties)
    fields: dict[str, Any] = {}
    servers = rest.pop("bootstrap.servers", None)
    if servers is not None:
        addresses = [part.strip() for part in servers.split(",") if part.strip()]
        if not addresses:
            raise ValueError("bootstrap.servers is empty")
        fields["bootstrap"] = ",".join(addresses)
    for name, field_name in _FIELD_PROPERTIES.items():
        if name in rest:
            fields[field_name] = rest.pop(name).strip()
    for field_name, env in (
        ("sasl_password", PASSWORD_ENV),
        ("ssl_password", SSL_PASSWORD_ENV),
    ):
        if field_name in fields:
            fields[field_name] = Secret(env=env, value=fields[field_name])
    for name, field_name in _FIELD_INTEGER_PROPERTIES.items():
        if name in rest:
            fields[field_name] = client_properties.parse_value(
                name, name.replace(".", "_"), rest.pop(name)
            )
    jaas = rest.pop("sasl.jaas.config", None)
    if jaas is not None:
        mechanisms, username, password = client_properties.jaas_login(jaas)
        mechanism = fields.get("sasl_mechanism")
        if mechanism is not None and mechanism not in mechanisms:
            raise ValueError(
                f"sasl.jaas.config's login module is for {'/'.join(mechanisms)}, "
                f"not sasl.mechanism={mechanism}"
            )
        fields["sasl_username"] = username
        fields["sasl_password"] = Secret(env=PASSWORD_ENV, value=password)
    for store, field_name in (
        ("truststore", "ssl_cafile"),
        ("keystore", "ssl_certfile"),
    ):
        location = rest.pop(f"ssl.{store}.location", None)
        kind = rest.pop(f"ssl.{store}.type", "JKS").strip().upper()
        if location is None:
            continue
        if kind != "PEM":
            raise ValueError(
                f"ssl.{store}.location: kafka-python cannot read a {kind} store "
                f"(ssl.{store}.type, JKS unless set); convert it to PEM and set "
                f"ssl.{store}.type=PEM"
            )
        fields[field_name] = location.strip()
    fields["properties"] = rest
    return fields


def add_kafka_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the standard Kafka connection flags to a CLI.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_kafka_arguments(parser)
        >>> KafkaSettings.from_args(parser.parse_args([])).embedded
        True
    """
    group = parser.add_argument_group(
        "Kafka",
        "Without a bootstrap address (--kafka-bootstrap, or bootstrap.servers "
        "in --kafka-config or --kafka-option) the embedded broker is started. "
        "Later wins: --kafka-config, then --kafka-option, then the other "
        "Kafka flags.",
    )
    group.add_argument(
        "--kafka-bootstrap",
        metavar="HOST:PORT[,HOST:PORT]",
        help="the Kafka cluster (bootstrap.servers)",
    )
    group.add_argument(
        "--kafka-config",
        metavar="FILE",
        help="a Kafka client properties file, as Kafka's own tools take it "
        "(key=value lines, Kafka's property names)",
    )
    group.add_argument(
        "--kafka-option",
        action="append",
        metavar="NAME=VALUE",
        help="one Kafka client property by Kafka's name, e.g. "
        "session.timeout.ms=45000 (repeatable; overrides --kafka-config)",
    )
    group.add_argument(
        "--kafka-security-protocol",
        choices=SECURITY_PROTOCOLS,
        help="security.protocol (default: PLAINTEXT)",
    )
    group.add_argument(
        "--kafka-sasl-mechanism",
        choices=SASL_MECHANISMS,
        help="sasl.mechanism, for the SASL_* protocols",
    )
    group.add_argument(
        "--kafka-sasl-username",
        metavar="NAME",
        help="SASL username (with the password below)",
    )
    group.add_argument(
        "--kafka-sasl-password",
        metavar="PASSWORD",
        help=f"SASL password; prefer the {PASSWORD_ENV} environment variable",
    )
    group.add_argument(
        "--kafka-sasl-password-file",
        metavar="FILE",
        help="a file holding only the SASL password, read where each client "
        "is made (on every worker of a Beam job)",
    )
    group.add_argument(
        "--kafka-ssl-cafile",
        metavar="FILE",
        help="PEM CA bundle that verifies the brokers",
    )
    group.add_argument(
        "--kafka-ssl-certfile",
        metavar="FILE",
        help="PEM client certificate (mutual TLS)",
    )
    group.add_argument(
        "--kafka-ssl-keyfile", metavar="FILE", help="PEM client key (mutual TLS)"
    )
