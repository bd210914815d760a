"""How every process of the system talks to Kafka.

One :class:`KafkaSettings` carries the bootstrap servers and the security
options of a cluster; :func:`add_kafka_arguments` gives every CLI the same
flags, and :meth:`KafkaSettings.client_config` turns them into kafka-python
keyword arguments. With no ``--kafka-bootstrap`` the tools start the embedded
broker (:mod:`features.kafka.broker`); with one they use that cluster as is.

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
from typing import Any, Final

SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
PASSWORD_ENV: Final = "KAFKA_SASL_PASSWORD"

# Consumer-group timing (see the module docstring).
GROUP_SESSION_TIMEOUT_MS: Final = 6000
GROUP_HEARTBEAT_INTERVAL_MS: Final = 2000
# kafka-python backs off reconnects up to 30 s; Kafka's Java clients stop at
# 1 s, which is what lets a client resume within a second of a broker restart.
RECONNECT_BACKOFF_MAX_MS: Final = 1000
# The largest message the system writes (a batch of examples with their
# timeline segments); topics it creates allow it (``max.message.bytes``).
MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class KafkaSettings:
    """Where the cluster is and how to authenticate.

    Args:
        bootstrap: ``host:port[,host:port...]``; None means "start the embedded
            broker".
        security_protocol: one of :data:`SECURITY_PROTOCOLS`.
        sasl_mechanism: SASL mechanism when the protocol is SASL_*.
        sasl_username: SASL user.
        sasl_password: SASL password (``--kafka-sasl-password`` or the
            ``KAFKA_SASL_PASSWORD`` environment variable, which keeps it out of
            the process list).
        ssl_cafile: CA bundle to verify the brokers.
        ssl_certfile: client certificate (mutual TLS).
        ssl_keyfile: client key (mutual TLS).
        extra: any other kafka-python client option, passed through as is
            (``--kafka-option request_timeout_ms=60000``).
        session_timeout_ms: consumer-group session timeout.
        heartbeat_interval_ms: consumer-group heartbeat interval.
    """

    bootstrap: str | None = None
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    session_timeout_ms: int = GROUP_SESSION_TIMEOUT_MS
    heartbeat_interval_ms: int = GROUP_HEARTBEAT_INTERVAL_MS

    def __post_init__(self) -> None:
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise ValueError(
                f"unknown Kafka security protocol {self.security_protocol!r}; "
                f"expected one of {', '.join(SECURITY_PROTOCOLS)}"
            )
        if self.security_protocol.startswith("SASL") and not self.sasl_mechanism:
            raise ValueError(
                f"security protocol {self.security_protocol} needs a SASL mechanism"
            )

    @property
    def embedded(self) -> bool:
        """True when no cluster was named and the embedded broker is to be used."""
        return self.bootstrap is None

    def with_bootstrap(self, bootstrap: str) -> KafkaSettings:
        """A copy pointing at ``bootstrap`` (used once the embedded broker is up)."""
        return dataclasses.replace(self, bootstrap=bootstrap)

    def client_config(self) -> dict[str, Any]:
        """Keyword arguments common to kafka-python's producer, consumer and admin.

        Raises:
            ValueError: when no bootstrap address is set yet.
        """
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
            "sasl_plain_password": self.sasl_password,
            "ssl_cafile": self.ssl_cafile,
            "ssl_certfile": self.ssl_certfile,
            "ssl_keyfile": self.ssl_keyfile,
        }
        config.update({k: v for k, v in optional.items() if v is not None})
        config.update(self.extra)
        return config

    def consumer_config(self, **overrides: Any) -> dict[str, Any]:
        """Consumer keyword arguments with the group timing above."""
        config = self.client_config()
        config.setdefault("session_timeout_ms", self.session_timeout_ms)
        config.setdefault("heartbeat_interval_ms", self.heartbeat_interval_ms)
        config.update(overrides)
        return config

    def to_args(self) -> list[str]:
        """The flags :func:`add_kafka_arguments` parses back into these settings.

        The SASL password is left out: pass it to the child process through
        ``KAFKA_SASL_PASSWORD`` (see :meth:`child_env`), not its command line.
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
        args += [f"--kafka-option={k}={v}" for k, v in self.extra.items()]
        return args

    def child_env(self) -> dict[str, str]:
        """Environment for a child process given :meth:`to_args` (the password)."""
        env = dict(os.environ)
        if self.sasl_password is not None:
            env[PASSWORD_ENV] = self.sasl_password
        return env

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> KafkaSettings:
        """Settings from the flags :func:`add_kafka_arguments` defined."""
        extra: dict[str, Any] = {}
        for item in args.kafka_option or ():
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ValueError(f"--kafka-option expects KEY=VALUE, got {item!r}")
            extra[key] = _parse_option_value(value)
        return cls(
            bootstrap=args.kafka_bootstrap,
            security_protocol=args.kafka_security_protocol,
            sasl_mechanism=args.kafka_sasl_mechanism,
            sasl_username=args.kafka_sasl_username,
            sasl_password=args.kafka_sasl_password or os.environ.get(PASSWORD_ENV),
            ssl_cafile=args.kafka_ssl_cafile,
            ssl_certfile=args.kafka_ssl_certfile,
            ssl_keyfile=args.kafka_ssl_keyfile,
            extra=extra,
        )


def _parse_option_value(value: str) -> Any:
    """``"60000"`` → 60000, ``"true"`` → True; anything else stays a string."""
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(value)
    except ValueError:
        return value


def add_kafka_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the standard Kafka connection flags to a CLI.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_kafka_arguments(parser)
        >>> KafkaSettings.from_args(parser.parse_args([])).embedded
        True
    """
    group = parser.add_argument_group(
        "Kafka", "Without --kafka-bootstrap the embedded broker is started."
    )
    group.add_argument(
        "--kafka-bootstrap", metavar="HOST:PORT[,HOST:PORT]", help="Kafka cluster"
    )
    group.add_argument(
        "--kafka-security-protocol", default="PLAINTEXT", choices=SECURITY_PROTOCOLS
    )
    group.add_argument("--kafka-sasl-mechanism", choices=SASL_MECHANISMS)
    group.add_argument("--kafka-sasl-username")
    group.add_argument(
        "--kafka-sasl-password", help=f"prefer the {PASSWORD_ENV} environment variable"
    )
    group.add_argument("--kafka-ssl-cafile")
    group.add_argument("--kafka-ssl-certfile")
    group.add_argument("--kafka-ssl-keyfile")
    group.add_argument(
        "--kafka-option",
        action="append",
        metavar="KEY=VALUE",
        help="any other kafka-python client option (repeatable)",
    )
