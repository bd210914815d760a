"""The streaming job's timing rules, one frozen value shared by every stage,
and the namespace of the stages' Beam counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from features.events import CLICK_WINDOW, CONVERSION_WINDOW
from features.feature_tables import USER_SEQUENCE_LENGTH

DAY_MS: Final = 86_400_000
METRICS_NAMESPACE: Final = "gem.stream"
"""Where every stage of the streaming job counts (``stream_summary.json``)."""
LABEL_WINDOW_MS: Final = int(
    max(CLICK_WINDOW, CONVERSION_WINDOW).total_seconds() * 1000
)
"""An impression's labels are final once event time passes ``t`` + this."""
COUNTER_HORIZON_MS: Final = 7 * DAY_MS
"""The longest counter window: how far back a counter looks."""


@dataclass(frozen=True, kw_only=True)
class StreamConfig:
    """How the stateful stages decide when a result is final.

    Attributes:
        shards: user shards (the key of the per-user state).
        entity_shards: ad (and advertiser) shards.
        allowed_lateness_ms: events up to this far behind the watermark are
            incorporated; results wait this long past their window.
        granularity_ms: results are released at multiples of this event time
            (one timer per shard per step, instead of one per impression).
        max_seq_len: longest window the example messages' segments serve.
    """

    shards: int = 8
    entity_shards: int = 4
    allowed_lateness_ms: int = 60_000
    granularity_ms: int = 60_000
    max_seq_len: int = 256

    def __post_init__(self) -> None:
        if self.shards < 1 or self.entity_shards < 1:
            raise ValueError("shards and entity shards must be at least 1")
        if self.allowed_lateness_ms < 0:
            raise ValueError("allowed lateness must not be negative")
        # Entity answers (due at t + lateness) must be released strictly
        # before the example that needs them (due at t + label window +
        # lateness), also after both are rounded up to the granularity.
        if not 0 < self.granularity_ms < LABEL_WINDOW_MS:
            raise ValueError(
                f"granularity must be in (0, {LABEL_WINDOW_MS}) ms, "
                f"got {self.granularity_ms}"
            )
        if self.max_seq_len < 1:
            raise ValueError("max_seq_len must be at least 1")

    @property
    def kept_tail(self) -> int:
        """Events per user kept however old: the longest window any output reads."""
        return max(self.max_seq_len, USER_SEQUENCE_LENGTH)
