"""The event-time timers of the stateful stages, in epoch milliseconds.

A stage sets one watermark timer per due time of a batch (a dynamic tag per
time), all while the element itself holds the watermark: no timer is set by
another timer. When several are pending, a later one may fire first and do
the work of the earlier ones; the key keeps the last time it handled (a
``ReadModifyWriteState``), and a timer at or before it finds nothing left.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from apache_beam.utils.timestamp import Timestamp

from pipelines.core.columns import IntArray


def ms_to_timestamp(ms: int) -> Timestamp:
    """Epoch milliseconds as a Beam timestamp."""
    return Timestamp(micros=ms * 1000)


def fired_ms(fire_at: Timestamp) -> int:
    """A timer's firing time (``beam.DoFn.TimestampParam``) in milliseconds."""
    return int(fire_at.micros // 1000)


def set_at_each(timer: Any, due_ms: IntArray) -> None:
    """One firing of ``timer`` (a ``beam.DoFn.TimerParam``) per distinct time."""
    for due in np.unique(due_ms).tolist():
        timer.set(ms_to_timestamp(due), dynamic_timer_tag=str(due))


class Fired(NamedTuple):
    """What a timer has to do: the times in ``(after, fire]``."""

    fire: int
    after: int
    """The last time handled before, or the smallest int64 when none was."""


def newly_fired(fire_at: Timestamp, handled: Any) -> Fired | None:
    """The span a timer firing at ``fire_at`` covers, recorded in ``handled``
    (the key's last handled time); None when a later timer covered it."""
    fire = fired_ms(fire_at)
    until = handled.read()
    if until is not None and fire <= until:
        return None
    handled.write(fire)
    return Fired(fire, np.iinfo(np.int64).min if until is None else until)
