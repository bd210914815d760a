"""Dead letters: records set aside with the reason they could not be used.

Nothing is dropped silently anywhere in the system: a record that fails
decoding or validation becomes a :class:`DeadLetter` carrying where it came
from (topic, partition and offset, or a file and line), why, when, and its
original bytes, so it can be inspected and replayed. Counts always balance:
records in = records out + dead letters.

The JSON form (:meth:`DeadLetter.to_json`) is one line of valid JSON whatever
the payload held::

    {"source": "events/day-1.jsonl", "partition": null, "offset": 17,
     "reason": "not JSON: ...", "set_aside_ms": 1764633600000,
     "payload_length": 12, "payload_sha256": "...",
     "payload": "<the bytes as text, when they are UTF-8>"}

``payload_base64`` replaces ``payload`` when the bytes are not UTF-8. A letter
too large for where it is written keeps the first bytes of its payload
(:meth:`DeadLetter.truncated`): ``truncated`` is then true, and
``payload_length`` and ``payload_sha256`` still describe the whole original.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any, Final

HEADER_PREFIX: Final = "dead-letter-"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, kw_only=True)
class DeadLetter:
    """One record set aside.

    Args:
        source: topic or file the record came from.
        partition: Kafka partition (None for files).
        offset: Kafka offset, or the 1-based line number in a file (the row
            number in a Parquet file).
        reason: why it was set aside (from validation or decoding).
        payload: the record's original bytes (the first of them when
            ``truncated``).
        set_aside_ms: when it was set aside, epoch milliseconds.
        payload_length: length of the original payload.
        payload_sha256: hex SHA-256 of the original payload.
        truncated: whether ``payload`` holds only the start of the original.
    """

    source: str
    partition: int | None
    offset: int
    reason: str
    payload: bytes
    set_aside_ms: int = field(default_factory=_now_ms)
    payload_length: int = -1
    payload_sha256: str = ""
    truncated: bool = False

    def __post_init__(self) -> None:
        # Length and hash describe the original, so they are taken before
        # any truncation and carried through it.
        if self.payload_length < 0:
            object.__setattr__(self, "payload_length", len(self.payload))
        if not self.payload_sha256:
            digest = hashlib.sha256(self.payload).hexdigest()
            object.__setattr__(self, "payload_sha256", digest)

    def truncated_to(self, max_payload_bytes: int) -> DeadLetter:
        """This letter with at most ``max_payload_bytes`` of its payload.

        Length and hash still describe the whole original payload.
        """
        if len(self.payload) <= max_payload_bytes:
            return self
        return replace(
            self, payload=self.payload[: max(0, max_payload_bytes)], truncated=True
        )

    def to_json_within(self, max_bytes: int) -> str:
        """:meth:`to_json` with the payload cut as far as needed for the line
        to take at most ``max_bytes`` (escapes and base64 make the payload's
        share of the line larger than its bytes).

        Example:
            >>> letter = DeadLetter(source="t", partition=0, offset=3,
            ...                     reason="too long", payload=b"x" * 5000)
            >>> line = letter.to_json_within(1000)
            >>> len(line) <= 1000, DeadLetter.from_json(line).payload_length
            (True, 5000)
        """
        letter, line = self, self.to_json()
        keep = len(self.payload)
        while len(line) > max_bytes and keep > 0:
            # Shrink in proportion to the excess, by at least a byte.
            keep = min(keep - 1, int(keep * max_bytes / len(line) * 0.95))
            letter = self.truncated_to(max(keep, 0))
            line = letter.to_json()
        return line

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of :meth:`to_json`."""
        record: dict[str, Any] = {
            "source": self.source,
            "partition": self.partition,
            "offset": self.offset,
            "reason": self.reason,
            "set_aside_ms": self.set_aside_ms,
            "payload_length": self.payload_length,
            "payload_sha256": self.payload_sha256,
            "truncated": self.truncated,
        }
        try:
            record["payload"] = self.payload.decode("utf-8")
        except UnicodeDecodeError:
            record["payload_base64"] = base64.b64encode(self.payload).decode("ascii")
        return record

    def to_json(self) -> str:
        """One line of valid JSON (ASCII only, so any sink can hold it)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, line: str) -> DeadLetter:
        """Inverse of :meth:`to_json`.

        Example:
            >>> letter = DeadLetter(source="t", partition=0, offset=3,
            ...                     reason="not JSON", payload=b"\\xff")
            >>> DeadLetter.from_json(letter.to_json()) == letter
            True
        """
        record = json.loads(line)
        if "payload_base64" in record:
            payload = base64.b64decode(record["payload_base64"])
        else:
            payload = record["payload"].encode("utf-8")
        return cls(
            source=record["source"],
            partition=record["partition"],
            offset=record["offset"],
            reason=record["reason"],
            payload=payload,
            set_aside_ms=record["set_aside_ms"],
            payload_length=record["payload_length"],
            payload_sha256=record["payload_sha256"],
            truncated=record["truncated"],
        )

    def kafka_headers(self) -> list[tuple[str, bytes]]:
        """Headers for the copy sent to a dead-letter topic, whose value is
        :attr:`payload` (the original bytes, or their start when truncated)."""
        fields = {
            "source": self.source,
            "partition": str(self.partition),
            "offset": str(self.offset),
            "reason": self.reason,
            "set-aside-ms": str(self.set_aside_ms),
            "payload-length": str(self.payload_length),
            "payload-sha256": self.payload_sha256,
            "truncated": "true" if self.truncated else "false",
        }
        return [
            (HEADER_PREFIX + name, value.encode("utf-8", "backslashreplace"))
            for name, value in fields.items()
        ]
