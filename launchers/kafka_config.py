"""The embedded Kafka node's configuration: ``server.properties``, its log4j
setup, and the SASL listener's users.

One node is broker and controller at once (KRaft), listening on loopback.
With SASL users the node also listens for SASL_PLAINTEXT clients, with
PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 for those users (the SCRAM
credentials are stored when its log directory is formatted:
:func:`scram_arguments`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

from features.kafka.settings import MAX_MESSAGE_BYTES
from launchers.jvm import LOOPBACK

NODE_ID: Final = 1
SASL_LISTENER_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# Characters a SASL user name or password may not hold: they would need
# escaping in server.properties, the JAAS text and the SCRAM argument at once.
_SASL_FORBIDDEN: Final = frozenset('"\\,=[]')


# What the embedded node needs beyond Kafka's defaults. One node: every
# internal topic has one replica. Tests join many groups, so the first join
# is not held back to gather members. Messages carry whole example batches.
# After a SIGKILL the node's old broker registration must lapse before it is
# let back in: a short broker session makes that seconds, not Kafka's 9 s.
_BROKER_CONFIG: Final = {
    "process.roles": "broker,controller",
    "node.id": str(NODE_ID),
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "num.partitions": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "message.max.bytes": str(MAX_MESSAGE_BYTES),
    "broker.heartbeat.interval.ms": "1000",
    "broker.session.timeout.ms": "4000",
    "num.network.threads": "2",
    "num.io.threads": "4",
    "num.recovery.threads.per.data.dir": "1",
}


# Kafka logs through SLF4J to log4j2; this sends it to stdout (the log file)
# without the multi-page configuration dumps of every client it starts.
_LOG4J_CONFIG: Final = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = warn
"""


def check_sasl_users(users: Mapping[str, str]) -> None:
    """Raise ValueError unless every SASL user name and password can be
    written into the configuration as it is."""
    for text in (*users, *users.values()):
        if not text or _SASL_FORBIDDEN & set(text) or text != text.strip():
            raise ValueError(
                f"SASL user names and passwords must be non-empty, without "
                f"blanks at the ends or any of {''.join(sorted(_SASL_FORBIDDEN))}"
            )


def server_properties(
    *,
    port: int,
    controller_port: int,
    sasl_port: int | None,
    data: Path,
    sasl_users: Mapping[str, str],
) -> str:
    """The text of the node's ``server.properties``: client listeners on
    ``port`` (and ``sasl_port`` with SASL users), the controller on
    ``controller_port``, the log directory ``data``."""
    client_listeners = [f"PLAINTEXT://{LOOPBACK}:{port}"]
    if sasl_users:
        client_listeners.append(f"SASL_PLAINTEXT://{LOOPBACK}:{sasl_port}")
    config = {
        **_BROKER_CONFIG,
        # A static voter set: the controller's port may change between
        # starts on the same data (only the client port is kept).
        "controller.quorum.voters": f"{NODE_ID}@{LOOPBACK}:{controller_port}",
        "listeners": ",".join(
            [*client_listeners, f"CONTROLLER://{LOOPBACK}:{controller_port}"]
        ),
        "advertised.listeners": ",".join(client_listeners),
        "log.dirs": str(data),
        **sasl_config(sasl_users),
    }
    return "".join(f"{key}={value}\n" for key, value in config.items())


def log4j_properties() -> str:
    """The node's log4j2 configuration (its output, without config dumps)."""
    return _LOG4J_CONFIG


def sasl_config(users: Mapping[str, str]) -> dict[str, str]:
    """The SASL_PLAINTEXT listener's settings: PLAIN checks the users
    listed in its JAAS text, SCRAM the credentials stored at format."""
    if not users:
        return {}
    listed = " ".join(f'user_{name}="{password}"' for name, password in users.items())
    listener = "listener.name.sasl_plaintext"
    config = {
        "listener.security.protocol.map": (
            "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT"
        ),
        "sasl.enabled.mechanisms": ",".join(SASL_LISTENER_MECHANISMS),
        f"{listener}.plain.sasl.jaas.config": (
            "org.apache.kafka.common.security.plain.PlainLoginModule "
            f"required {listed};"
        ),
    }
    for mechanism in SASL_LISTENER_MECHANISMS[1:]:
        config[f"{listener}.{mechanism.lower()}.sasl.jaas.config"] = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        )
    return config


def scram_arguments(users: Mapping[str, str]) -> list[str]:
    """``kafka.tools.StorageTool format`` arguments that store the users'
    SCRAM credentials."""
    return [
        argument
        for mechanism in SASL_LISTENER_MECHANISMS[1:]
        for name, password in users.items()
        for argument in (
            "--add-scram",
            f"{mechanism}=[name={name},password={password}]",
        )
    ]
