"""Kafka client properties as Kafka users write them, for kafka-python.

Kafka's tools take client settings as properties (``session.timeout.ms=45000``,
a ``client.properties`` file given with ``--command-config``); kafka-python
takes keyword arguments (``session_timeout_ms=45000``) and rejects any its
client kind does not have. This module is the translation:

- :func:`read_properties_file` reads a Java-style properties file (``key=value``,
  ``key: value`` or ``key value`` lines, ``#``/``!`` comments, ``\\``
  continuation lines and escapes).
- :func:`client_keywords` turns properties into one client kind's keyword
  arguments (``consumer``, ``producer``, ``admin``), leaving out those the
  kind does not have; :func:`check_properties` rejects a property no client
  knows with the closest known name.

The known names come from kafka-python's own ``DEFAULT_CONFIG`` of
``KafkaConsumer``, ``KafkaProducer`` and ``KafkaAdminClient``, each keyword
``_`` → ``.`` (``fetch_max_wait_ms`` is ``fetch.max.wait.ms``). Values are
read as Kafka reads them, by the type of kafka-python's default: integers,
``true``/``false``, ``acks=all``, ``compression.type=none``, Kafka's assignor
class names for ``partition.assignment.strategy``.

A few Kafka names differ from kafka-python's, or cannot be given to it:
:data:`KAFKA_ONLY_PROPERTIES` says why for each. The connection and security
properties (``bootstrap.servers``, ``security.protocol``, ``sasl.*``, the
``ssl.*`` files) are :class:`~features.kafka.settings.KafkaSettings` fields;
:mod:`features.kafka.settings` takes them out before the rest comes here.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

CLIENT_KINDS: Final = ("consumer", "producer", "admin")

# kafka-python keywords that take a Python object (a callable, a class, a
# socket option tuple), which no text in a properties file can be.
OBJECT_KEYWORDS: Final = frozenset(
    {
        "default_offset_commit_callback",
        "kafka_client",
        "key_deserializer",
        "key_serializer",
        "metric_reporters",
        "partitioner",
        "sasl_oauth_token_provider",
        "selector",
        "socket_options",
        "ssl_context",
        "value_deserializer",
        "value_serializer",
    }
)

# Keywords whose kafka-python default is None (or a float) but whose value is
# a number: typed here, since the default cannot tell.
INTEGER_KEYWORDS: Final = frozenset(
    {"receive_buffer_bytes", "send_buffer_bytes", "retries", "consumer_timeout_ms"}
)

# Kafka's assignor class names (the Java client's) and kafka-python's own.
ASSIGNORS: Final = {
    "org.apache.kafka.clients.consumer.RangeAssignor": "range",
    "org.apache.kafka.clients.consumer.RoundRobinAssignor": "roundrobin",
    "org.apache.kafka.clients.consumer.StickyAssignor": "sticky",
    "range": "range",
    "roundrobin": "roundrobin",
    "sticky": "sticky",
}

_UNREADABLE_STORE = (
    "kafka-python reads PEM files only: convert the store to PEM and set "
    "ssl.truststore.type=PEM / ssl.keystore.type=PEM"
)

KAFKA_ONLY_PROPERTIES: Final = {
    "ssl.truststore.password": "a JKS/PKCS12 store password; " + _UNREADABLE_STORE,
    "ssl.keystore.password": "a JKS/PKCS12 store password; " + _UNREADABLE_STORE,
    "ssl.cipher.suites": (
        "takes Java (IANA) cipher names; give an OpenSSL cipher string as "
        "ssl.ciphers instead"
    ),
    "ssl.truststore.certificates": "inline PEM is not supported; "
    "write it to a file and set ssl.truststore.location with ssl.truststore.type=PEM",
    "ssl.keystore.certificate.chain": "inline PEM is not supported; "
    "write it to a file and set ssl.keystore.location with ssl.keystore.type=PEM",
    "ssl.keystore.key": "inline PEM is not supported; "
    "write it to a file and set ssl.keystore.location with ssl.keystore.type=PEM",
    "ssl.protocol": "kafka-python negotiates the TLS version itself",
    "ssl.enabled.protocols": "kafka-python negotiates the TLS version itself",
    "buffer.memory": "kafka-python's producer has no memory bound",
    "partitioner.class": "a Java class; kafka-python's partitioner is a Python object",
    "interceptor.classes": "Java interceptors do not run in kafka-python",
    "key.serializer": "a Java class; the command sets its own serializer",
    "value.serializer": "a Java class; the command sets its own serializer",
    "key.deserializer": "a Java class; the command sets its own deserializer",
    "value.deserializer": "a Java class; the command sets its own deserializer",
    "sasl.login.callback.handler.class": "Java callback handlers do not run in "
    "kafka-python; OAUTHBEARER is not offered",
    "sasl.client.callback.handler.class": "Java callback handlers do not run in "
    "kafka-python; OAUTHBEARER is not offered",
}


@functools.cache
def kafka_python_defaults() -> Mapping[str, Mapping[str, Any]]:
    """Client kind → kafka-python's ``DEFAULT_CONFIG`` of that client."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    return {
        "consumer": dict(KafkaConsumer.DEFAULT_CONFIG),
        "producer": dict(KafkaProducer.DEFAULT_CONFIG),
        "admin": dict(KafkaAdminClient.DEFAULT_CONFIG),
    }


def property_name(keyword: str) -> str:
    """``session_timeout_ms`` → ``session.timeout.ms``."""
    return keyword.replace("_", ".")


@functools.cache
def _keywords_by_property() -> Mapping[str, str]:
    """Property name → kafka-python keyword, for every text-settable keyword."""
    keywords = {
        keyword
        for defaults in kafka_python_defaults().values()
        for keyword in defaults
        if keyword not in OBJECT_KEYWORDS
    }
    named = {property_name(keyword): keyword for keyword in sorted(keywords)}
    named["ssl.endpoint.identification.algorithm"] = "ssl_check_hostname"
    return named


def known_property_names(extra: Iterable[str] = ()) -> list[str]:
    """Every property a client can be given, plus ``extra`` (the fields' ones)."""
    return sorted({*_keywords_by_property(), *KAFKA_ONLY_PROPERTIES, *extra})


def closest_property(name: str, extra: Iterable[str] = ()) -> str | None:
    """The known property name nearest to ``name`` (a typo, kafka-python's
    ``_`` spelling), or None when none is close."""
    wanted = name.replace("_", ".").lower()
    match = difflib.get_close_matches(
        wanted, known_property_names(extra), n=1, cutoff=0.6
    )
    return match[0] if match else None


def check_property(name: str, value: str, *, extra: Iterable[str] = ()) -> None:
    """Raise ValueError, one line, when ``name=value`` no client can be given.

    Args:
        name: the property's Kafka name.
        value: its text.
        extra: further names that are known (the settings' own fields), which
            a typo may be closest to.
    """
    if name in KAFKA_ONLY_PROPERTIES:
        raise ValueError(
            f"Kafka property {name} is not supported by kafka-python: "
            f"{KAFKA_ONLY_PROPERTIES[name]}"
        )
    keyword = _keywords_by_property().get(name)
    if keyword is None:
        if name.replace(".", "_") in OBJECT_KEYWORDS:
            raise ValueError(
                f"Kafka property {name} takes a Python object in kafka-python; "
                "it cannot be set from text"
            )
        closest = closest_property(name, extra)
        hint = f" (did you mean {closest}?)" if closest else ""
        raise ValueError(f"unknown Kafka client property {name!r}{hint}")
    parse_value(name, keyword, value)


def check_properties(
    properties: Mapping[str, str], *, extra: Iterable[str] = ()
) -> None:
    """:func:`check_property` for each; the first problem raises."""
    for name, value in properties.items():
        check_property(name, value, extra=extra)


def client_keywords(properties: Mapping[str, str], kind: str) -> dict[str, Any]:
    """kafka-python keyword arguments of client ``kind`` for ``properties``.

    Properties the kind does not have (``session.timeout.ms`` for a producer)
    are left out.

    Raises:
        ValueError: a property no client knows, or a value it cannot read.
    """
    if kind not in CLIENT_KINDS:
        raise ValueError(f"unknown Kafka client kind {kind!r}")
    defaults = kafka_python_defaults()[kind]
    config: dict[str, Any] = {}
    for name, text in properties.items():
        check_property(name, text)
        keyword = _keywords_by_property()[name]
        if keyword in defaults:
            config[keyword] = parse_value(name, keyword, text)
    return config


def shared_keywords(properties: Mapping[str, str]) -> dict[str, Any]:
    """The keyword arguments of ``properties`` that every client kind takes."""
    per_kind = [client_keywords(properties, kind) for kind in CLIENT_KINDS]
    return {
        keyword: value
        for keyword, value in per_kind[0].items()
        if all(keyword in other for other in per_kind[1:])
    }


def parse_value(name: str, keyword: str, text: str) -> Any:
    """``text`` as kafka-python's ``keyword`` takes it, read as Kafka would.

    Raises:
        ValueError: one line naming the property and what it expects.
    """
    value = text.strip()
    special = _SPECIAL_VALUES.get(keyword)
    if special is not None:
        return special(name, value)
    if keyword in INTEGER_KEYWORDS:
        return _integer(name, value)
    default = _default_of(keyword)
    if isinstance(default, bool):
        return _boolean(name, value)
    if isinstance(default, int):
        return _integer(name, value)
    if isinstance(default, float) and math.isfinite(default):
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{name}={text}: expected a number") from None
    return value


def _default_of(keyword: str) -> Any:
    for defaults in kafka_python_defaults().values():
        if keyword in defaults:
            return defaults[keyword]
    return None


def _integer(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value}: expected an integer") from None


def _boolean(name: str, value: str) -> bool:
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"{name}={value}: expected true or false")
    return lowered == "true"


def _acks(name: str, value: str) -> int | str:
    if value.lower() == "all":
        return "all"
    number = _integer(name, value)
    if number not in (-1, 0, 1):
        raise ValueError(f"{name}={value}: expected all, -1, 0 or 1")
    return number


def _compression(name: str, value: str) -> str | None:
    lowered = value.lower()
    if lowered == "none":
        return None
    if lowered not in ("gzip", "snappy", "lz4", "zstd"):
        raise ValueError(f"{name}={value}: expected none, gzip, snappy, lz4 or zstd")
    return lowered


def _endpoint_identification(name: str, value: str) -> bool:
    if value.lower() not in ("https", ""):
        raise ValueError(f"{name}={value}: expected https or nothing")
    return value.lower() == "https"


def _api_version(name: str, value: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in value.split("."))
    except ValueError:
        raise ValueError(f"{name}={value}: expected a version such as 3.9.0") from None


def _assignors(name: str, value: str) -> tuple[type, ...]:
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.coordinator.assignors.sticky.sticky_assignor import (
        StickyPartitionAssignor,
    )

    classes: dict[str, type] = {
        "range": RangePartitionAssignor,
        "roundrobin": RoundRobinPartitionAssignor,
        "sticky": StickyPartitionAssignor,
    }
    chosen = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        if item not in ASSIGNORS:
            raise ValueError(
                f"{name}: assignor {item} is not in kafka-python; expected "
                "RangeAssignor, RoundRobinAssignor or StickyAssignor"
            )
        chosen.append(classes[ASSIGNORS[item]])
    if not chosen:
        raise ValueError(f"{name} is empty")
    return tuple(chosen)


_SPECIAL_VALUES: Final[dict[str, Callable[[str, str], Any]]] = {
    "acks": _acks,
    "compression_type": _compression,
    "ssl_check_hostname": _endpoint_identification,
    "api_version": _api_version,
    "partition_assignment_strategy": _assignors,
}


# --- Java-style properties files (java.util.Properties.load) ---------------

_ESCAPES: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_KEY_END: Final = re.compile(r"(?<!\\)(?:\\\\)*[=:\s]")


def read_properties_file(path: Path) -> dict[str, str]:
    """The properties of a Java-style properties file, in file order.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a malformed escape, naming the file and line.
    """
    return parse_properties(path.read_text(encoding="utf-8"), source=str(path))


def parse_properties(text: str, *, source: str = "<properties>") -> dict[str, str]:
    """Properties from the text of a Java-style properties file."""
    properties: dict[str, str] = {}
    for number, line in _logical_lines(text):
        key, value = _split_entry(line)
        try:
            properties[_unescape(key)] = _unescape(value)
        except ValueError as error:
            raise ValueError(f"{source}:{number}: {error}") from None
    return properties


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each entry, continuation lines joined."""
    entries = []
    pending: str | None = None
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.lstrip(" \t\f")
        if pending is None:
            if not line or line[0] in "#!":
                continue
            pending, start = "", number
        pending += line
        # An odd number of trailing backslashes continues the entry.
        trailing = len(pending) - len(pending.rstrip("\\"))
        if trailing % 2 == 1:
            pending = pending[:-1]
            continue
        entries.append((start, pending))
        pending = None
    if pending is not None:
        entries.append((start, pending))
    return entries


def _split_entry(line: str) -> tuple[str, str]:
    """Key and value: the key ends at the first unescaped ``=``, ``:`` or
    blank; blanks around one ``=`` or ``:`` separate it from the value."""
    match = _KEY_END.search(line)
    if match is None:
        return line, ""
    end = match.end() - 1
    rest = line[end:]
    if rest[0] in "=:":
        rest = rest[1:]
    else:
        rest = rest.lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:]
    return line[:end], rest.lstrip(" \t\f")


def _unescape(text: str) -> str:
    out = []
    index = 0
    while index < len(text):
        char = text[index]
        if char != "\\" or index + 1 == len(text):
            out.append(char)
            index += 1
            continue
        escaped = text[index + 1]
        if escaped == "u":
            digits = text[index + 2 : index + 6]
            if len(digits) != 4 or not all(
                c in "0123456789abcdefABCDEF" for c in digits
            ):
                raise ValueError(
                    f"malformed \\uXXXX escape {text[index : index + 6]!r}"
                )
            out.append(chr(int(digits, 16)))
            index += 6
            continue
        out.append(_ESCAPES.get(escaped, escaped))
        index += 2
    return "".join(out)


# --- sasl.jaas.config --------------------------------------------------------

JAAS_LOGIN_MODULES: Final = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": ("PLAIN",),
    "org.apache.kafka.common.security.scram.ScramLoginModule": (
        "SCRAM-SHA-256",
        "SCRAM-SHA-512",
    ),
}
_JAAS: Final = re.compile(
    r"^\s*(?P<module>[\w.$]+)\s+(?P<flag>\w+)(?P<options>.*?);?\s*$", re.S
)
_JAAS_OPTION: Final = re.compile(
    r"""\s*(?P<key>[\w.-]+)\s*=\s*(?:"(?P<dq>(?:[^"\\]|\\.)*)"|'(?P<sq>(?:[^'\\]|\\.)*)'|(?P<bare>[^\s;]+))"""
)


def jaas_login(text: str) -> tuple[tuple[str, ...], str, str]:
    """The mechanisms, username and password of a ``sasl.jaas.config``.

    Only the PLAIN and SCRAM login modules carry a username and password
    kafka-python can use.

    Raises:
        ValueError: another login module, or no username or password.
    """
    match = _JAAS.match(text)
    if match is None:
        raise ValueError(
            'sasl.jaas.config: expected \'LoginModule required username="..." '
            'password="...";\''
        )
    module = match["module"]
    if module not in JAAS_LOGIN_MODULES:
        raise ValueError(
            f"sasl.jaas.config: login module {module} is not supported by "
            "kafka-python; use PlainLoginModule or ScramLoginModule"
        )
    options: dict[str, str] = {}
    rest = match["options"]
    position = 0
    while rest[position:].strip():
        option = _JAAS_OPTION.match(rest, position)
        if option is None:
            raise ValueError(
                f"sasl.jaas.config: cannot read {rest[position:].strip()!r}"
            )
        raw = option["dq"] if option["dq"] is not None else option["sq"]
        value = option["bare"] if raw is None else re.sub(r"\\(.)", r"\1", raw)
        options[option["key"]] = value
        position = option.end()
    missing = [key for key in ("username", "password") if key not in options]
    if missing:
        raise ValueError(f"sasl.jaas.config: no {' or '.join(missing)} in {module}")
    return JAAS_LOGIN_MODULES[module], options["username"], options["password"]
