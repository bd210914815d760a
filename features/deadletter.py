"""Dead letters: records set aside with the reason they could not be used.

Nothing is dropped silently anywhere in the system: a record that fails
decoding or validation becomes a :class:`DeadLetter` carrying where it came
from (topic, partition, offset, or a file and line), why, and its original
bytes, so it can be inspected and replayed. Counts always balance:
records in = records out + dead letters.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class DeadLetter:
    """One record set aside.

    Args:
        source: topic or file the record came from.
        partition: Kafka partition (None for files).
        offset: Kafka offset, or the line number in a file.
        reason: why it was set aside (from validation or decoding).
        payload: the record's original bytes.
    """

    source: str
    partition: int | None
    offset: int
    reason: str
    payload: bytes

    def to_json(self) -> str:
        """One JSON line; the payload base64-encoded (it may not be UTF-8)."""
        record: dict[str, Any] = {
            "source": self.source,
            "partition": self.partition,
            "offset": self.offset,
            "reason": self.reason,
            "payload_base64": base64.b64encode(self.payload).decode("ascii"),
        }
        return json.dumps(record, separators=(",", ":"))

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
        return cls(
            source=record["source"],
            partition=record["partition"],
            offset=record["offset"],
            reason=record["reason"],
            payload=base64.b64decode(record["payload_base64"]),
        )

    def kafka_headers(self) -> list[tuple[str, bytes]]:
        """Headers for the copy sent to a dead-letter topic."""
        return [
            ("dead-letter-source", self.source.encode()),
            ("dead-letter-partition", str(self.partition).encode()),
            ("dead-letter-offset", str(self.offset).encode()),
            ("dead-letter-reason", self.reason.encode()),
        ]
