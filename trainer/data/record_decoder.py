"""One Kafka record of the examples topic → a training batch, or a dead letter.

An example message (:mod:`features.example_messages`) becomes a
:class:`~trainer.data.batch.Batch` (:func:`trainer.data.inputs.make_batch`).
A message that does not decode, or whose ids are out of range (``make_batch``
raises ValueError), or that holds no examples, is set aside
(:mod:`trainer.data.dead_letter_writer`) and yields no batch. Whatever a
record holds, decoding it never raises: any error becomes the dead letter's
reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any

from features.example_messages import DecodedMessage, decode_example_message
from trainer.data.batch import Batch
from trainer.data.dead_letter_writer import DeadLetterWriter
from trainer.data.inputs import make_batch

RecordFormat = Callable[[bytes, list[tuple[str, bytes]]], tuple[Any, str | None]]
"""Another record format: (value, headers) → (payload, reason or None)."""


@dataclass(frozen=True)
class Decoded:
    """What one record gave: a batch (None for a dead letter), the decoded
    message when it is kept, or a custom format's payload."""

    batch: Batch | None
    examples: DecodedMessage | None = None
    payload: Any = None


@dataclass(frozen=True)
class RecordDecoder:
    """Decode records, setting poison aside (module docstring).

    Args:
        dead_letters: where poison goes.
        max_seq_len: history window length for :func:`make_batch`.
        pin_memory: pin each batch, so its copy to the GPU can be
            non-blocking.
        keep_examples: keep the decoded message of each batch (consumers that
            need the example ids and times).
        decode_record: decode another record format instead; the payload is
            kept and no batch is built.
    """

    dead_letters: DeadLetterWriter
    _: KW_ONLY
    max_seq_len: int
    pin_memory: bool = False
    keep_examples: bool = False
    decode_record: RecordFormat | None = None

    def __call__(self, partition: int, message: Any) -> Decoded:
        """Decode ``message`` (a Kafka record) of ``partition``."""
        try:
            return self._decode_or_raise(partition, message)
        except Exception as error:  # outside bytes must never stop the reader
            reason = f"undecodable ({type(error).__name__}: {error})"
            self.dead_letters.set_aside(partition, message, reason)
            return Decoded(None)

    def _decode_or_raise(self, partition: int, message: Any) -> Decoded:
        headers = [(k, v) for k, v in (message.headers or [])]
        if self.decode_record is not None:
            payload, why = self.decode_record(message.value or b"", headers)
            if why is not None:
                self.dead_letters.set_aside(partition, message, why)
                payload = None
            return Decoded(None, payload=payload)
        decoded = decode_example_message(message.value, headers or None)
        batch, reason = None, decoded.reason
        if decoded.ok:
            try:
                # The segments only reach back as far as the producer's
                # window: read at most that many events.
                window = min(self.max_seq_len, decoded.max_seq_len or 0)
                batch = make_batch(
                    decoded.examples, decoded.segments, max_seq_len=window
                )
            except ValueError as error:
                reason = f"invalid examples: {error}"
            else:
                if self.pin_memory:
                    # Pinned here, on the decode thread, so the step's copy
                    # to the GPU can be non-blocking.
                    batch = batch.pin_memory()
        if batch is None or batch.size == 0:
            self.dead_letters.set_aside(
                partition, message, reason or "message holds no examples"
            )
            return Decoded(None)
        return Decoded(batch, decoded if self.keep_examples else None)
