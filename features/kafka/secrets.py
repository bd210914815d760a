"""A Kafka password by where it lives, read when a client is made.

:class:`~features.kafka.settings.KafkaSettings` travels inside a Beam job's
graph (its DoFns are pickled with the settings they hold), so it never
carries a password itself: it carries a :class:`Secret`, which names the
environment variable or the file that holds it, and each worker reads it
there when it opens a client (at ``setup()``). A password given on the
command line is kept for the process that was given it only: a pickled
copy drops it and reads the environment variable instead, which the
launcher sets for its own local workers and its child processes
(``KafkaSettings.export_secrets``, ``KafkaSettings.child_env``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from features.kafka import client_properties

JAAS: Final = "sasl.jaas.config"
PASSWORD_ENV: Final = "KAFKA_SASL_PASSWORD"
SSL_PASSWORD_ENV: Final = "KAFKA_SSL_KEY_PASSWORD"
SASL_PASSWORD_PROPERTIES: Final = (JAAS, "sasl.plain.password")
SSL_PASSWORD_PROPERTIES: Final = ("ssl.key.password", "ssl.password")
SECRET_PROPERTIES: Final = frozenset(SASL_PASSWORD_PROPERTIES + SSL_PASSWORD_PROPERTIES)
"""The client properties that hold a password."""


@dataclass(frozen=True)
class Secret:
    """Where a password is; :meth:`read` reads it.

    Attributes:
        env: the environment variable that holds it.
        file: a file holding only it (surrounding whitespace dropped).
        properties_file: a Kafka client properties file holding it, in
            ``property``; ``sasl.jaas.config``'s password for that one.
        property: the property of ``properties_file``.
        value: the password given in this process (a flag); never pickled.
    """

    env: str | None = None
    file: str | None = None
    properties_file: str | None = None
    property: str | None = None
    value: str | None = field(default=None, repr=False, compare=False)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled without :attr:`value`: a worker reads it where it lives."""
        return (Secret, (self.env, self.file, self.properties_file, self.property))

    def read(self) -> str:
        """The password: the value given here, else the file's, else the
        environment's.

        Raises:
            ValueError: one line naming where it was looked for.
        """
        if self.value is not None:
            return self.value
        if self.file:
            try:
                return Path(self.file).read_text().strip()
            except OSError as error:
                raise ValueError(
                    f"cannot read the Kafka password file {self.file}: {error.strerror}"
                ) from None
        if self.properties_file and self.property:
            properties = client_properties.read_properties_file(
                Path(self.properties_file)
            )
            text = properties.get(self.property)
            if text is None:
                raise ValueError(f"{self.properties_file} has no {self.property}")
            if self.property == JAAS:
                return client_properties.jaas_login(text)[2]
            return text.strip()
        if self.env:
            found = os.environ.get(self.env)
            if found is None:
                raise ValueError(
                    f"${self.env} is not set in this process: the Kafka password "
                    "is read from it (or a --kafka-*-password-file) where each "
                    "client is made"
                )
            return found
        raise ValueError("a Kafka password with nowhere to read it from")


def flag_secret(args: argparse.Namespace) -> Secret | None:
    """The SASL password the flags or the environment name: the flag's
    value (pickled copies read ``KAFKA_SASL_PASSWORD``), else the file,
    else the environment variable."""
    given = getattr(args, "kafka_sasl_password", None)
    if given:
        return Secret(env=PASSWORD_ENV, value=given)
    password_file = getattr(args, "kafka_sasl_password_file", None)
    if password_file:
        return Secret(file=password_file)
    if PASSWORD_ENV in os.environ:
        return Secret(env=PASSWORD_ENV)
    return None


def file_secrets(
    fields: Mapping[str, Any],
    config_file: str,
    from_file: Mapping[str, str],
    options: Mapping[str, str],
) -> dict[str, Secret]:
    """The passwords the ``--kafka-config`` file gave (not overridden by a
    ``--kafka-option``), as read from that file where each client is made."""
    found: dict[str, Secret] = {}
    for field_name, names in (
        ("sasl_password", SASL_PASSWORD_PROPERTIES),
        ("ssl_password", SSL_PASSWORD_PROPERTIES),
    ):
        secret = fields.get(field_name)
        if secret is None or any(name in options for name in names):
            continue
        # The last of the names the file holds is the one read into the field.
        held = [name for name in from_file if name in names]
        if held:
            found[field_name] = Secret(
                properties_file=str(Path(config_file).resolve()),
                property=held[-1],
                value=secret.value,
            )
    return found
