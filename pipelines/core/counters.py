"""The user / ad / advertiser counters: ``{entity}_{action}_count_{window}``.

A counter of an entity at time ``t`` is the number of its distinct ad events
of that action with time in ``[t - window, t)``. The same counts at every
distinct ad-event time of an entity are the rows of the ``*_counters``
feature tables (:mod:`features.feature_tables`). Counted by
:class:`~pipelines.core.window_counter.WindowCounter`; shared by the batch
and the streaming job.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.feature_tables import FEATURE_TABLES, counter_names
from features.registry import COUNTER_ACTIONS, COUNTER_WINDOWS
from pipelines.core.columns import IntArray, to_int64
from pipelines.core.window_counter import WindowCounter

ENTITY_KINDS: Final = ("ad", "advertiser")
"""The entities other than the user that have counters."""
_UNIT_MS: Final = {"h": 3_600_000, "d": 86_400_000}
WINDOWS_MS: Final = tuple(int(w[:-1]) * _UNIT_MS[w[-1]] for w in COUNTER_WINDOWS)


def counter_action_codes(actions: pa.ChunkedArray | pa.Array) -> IntArray:
    """1-based index of each action in COUNTER_ACTIONS (0: not counted)."""
    index = pc.index_in(actions, value_set=pa.array(COUNTER_ACTIONS))
    return to_int64(index, -1) + 1


def window_counter(
    event_ids: IntArray, event_times: IntArray, event_actions: IntArray
) -> WindowCounter:
    """The counter of distinct ad events (:func:`counter_action_codes` codes)."""
    return WindowCounter(
        event_ids, event_times, event_actions, len(COUNTER_ACTIONS), WINDOWS_MS
    )


def named_counts(entity: str, counts: list[list[IntArray]]) -> dict[str, Any]:
    """``counts[action][window]`` as float32 columns named by counter_names."""
    names = iter(counter_names(entity))
    return {
        next(names): count.astype(np.float32)
        for per_action in counts
        for count in per_action
    }


def entity_counters(
    entity: str,
    event_ids: IntArray,
    event_times: IntArray,
    event_actions: IntArray,
    query_ids: IntArray,
    query_times: IntArray,
) -> dict[str, Any]:
    """The 9 counters of ``entity`` for each query, as float32 arrays by name.

    Args:
        entity: ``user``, ``ad`` or ``advertiser`` (names the columns).
        event_ids: entity id of each distinct ad event.
        event_times: its time (epoch ms).
        event_actions: 1-based index into COUNTER_ACTIONS.
        query_ids: entity of each query.
        query_times: query time ``t``; counted: ``[t - window, t)``.
    """
    counter = window_counter(event_ids, event_times, event_actions)
    return named_counts(entity, counter.count(query_ids, query_times))


def counter_table(
    entity: str, ids: IntArray, stamps_ms: IntArray, counters: dict[str, Any]
) -> pa.Table:
    """``{entity}_counters`` feature rows: each id's counters (by name, as
    :func:`named_counts` gives them) at its stamp (epoch ms)."""
    spec = FEATURE_TABLES[f"{entity}_counters"]
    columns: dict[str, Any] = {
        spec.entity: pa.array(ids, pa.int64()),
        "event_timestamp": pa.array(stamps_ms, pa.int64()).cast(
            spec.schema.field("event_timestamp").type
        ),
    }
    columns.update(counters)
    return pa.Table.from_pydict(columns, schema=spec.schema)


def counter_rows(entity: str, counter: WindowCounter) -> pa.Table:
    """The ``{entity}_counters`` feature rows: one per distinct (entity, event
    time) of the counter, in that order."""
    ids, times = counter.point_entities()
    return counter_table(
        entity, ids, times, named_counts(entity, counter.count_at_points())
    )
