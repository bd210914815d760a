"""``WindowCounter``: events of an entity per action in ``[t - w, t)`` windows.

For many queries and windows at once, from one sort of the events' distinct
``(entity, time)`` keys, prefix counts per action, and one binary search per
window shared by every action. Pure numpy; the counters of the batch job,
the streaming job and the reference are all counted by it.
"""

from __future__ import annotations

import numpy as np

from pipelines.core.columns import IntArray
from pipelines.core.ordering import INT64_HEADROOM, distinct_of_sorted, distinct_sorted


class WindowCounter:
    """Counts of an entity's events per action in ``[t - w, t)`` windows.

    Built once from events ``(entity id, time, action code)``; then
    :meth:`count` answers any queries ``(entity id, t)``. Every ``(entity,
    time)`` becomes one int64 key ``rank(entity) * span + time - base``, so
    one sorted array of the distinct event keys holds every entity's times in
    order; for each action a prefix count over those keys gives "events of
    the action before key k" at ``searchsorted(k)``. A window count is then
    two lookups, and the binary searches (one per window bound) are shared by
    all actions.

    Args:
        ids: (E,) entity of each (distinct) event.
        times: (E,) its time, epoch ms.
        actions: (E,) action code in ``1..num_actions`` (others are ignored).
        num_actions: number of action codes.
        windows_ms: the window lengths the queries will use.

    Example:
        >>> c = WindowCounter(np.array([1, 1, 1, 2]), np.array([0, 5, 10, 9]),
        ...                   np.array([1, 1, 2, 1]), 2, (6, 100))
        >>> [[x.tolist() for x in per_window] for per_window in
        ...  c.count(np.array([1, 2]), np.array([10, 10]))]
        [[[1, 1], [2, 1]], [[0, 0], [0, 0]]]
    """

    def __init__(
        self,
        ids: IntArray,
        times: IntArray,
        actions: IntArray,
        num_actions: int,
        windows_ms: tuple[int, ...],
    ) -> None:
        self._windows = windows_ms
        self._num_actions = num_actions
        self._entities = distinct_sorted(ids)
        widest = max(windows_ms, default=0)
        self._base = int(times.min()) - widest if times.size else 0
        top = int(times.max()) + 1 if times.size else 1
        self._span = top - self._base + 1
        if (self._entities.size + 1) * float(self._span) >= INT64_HEADROOM:
            raise ValueError("too many entities over too long a period for int64 keys")
        keys = self._keys(np.searchsorted(self._entities, ids), times)
        # Distinct keys (the points at which counts can change) and, for each
        # action, how many of its events lie before each of them.
        # (Plain sorts and sorted-needle searches: cheaper than np.unique's
        # inverse, an argsort, at millions of events.)
        ordered = np.sort(keys)
        self.points = distinct_of_sorted(ordered)
        self._before = np.zeros((num_actions, self.points.size + 1), dtype=np.int64)
        for code in range(1, num_actions + 1):
            mine = ordered if num_actions == 1 and np.all(actions == 1) else None
            if mine is None:
                mine = np.sort(keys[actions == code])
            self._before[code - 1, :-1] = np.searchsorted(mine, self.points)
            self._before[code - 1, -1] = mine.size

    def _keys(self, ranks: IntArray, times: IntArray) -> IntArray:
        return ranks * self._span + (times - self._base)

    def point_entities(self) -> tuple[IntArray, IntArray]:
        """Entity id and time of each distinct event key (sorted by both)."""
        ranks = self.points // self._span
        return self._entities[ranks], self.points - ranks * self._span + self._base

    def count(self, query_ids: IntArray, query_times: IntArray) -> list[list[IntArray]]:
        """``counts[action - 1][window]``: (Q,) int64 counts per query.

        Entities never seen count 0; times outside the events' range are fine.
        """
        if self._entities.size == 0:
            zeros = np.zeros(query_ids.size, dtype=np.int64)
            return [
                [zeros.copy() for _ in self._windows] for _ in range(self._num_actions)
            ]
        ranks = np.searchsorted(self._entities, query_ids)
        clipped = np.minimum(ranks, self._entities.size - 1)
        known = self._entities[clipped] == query_ids

        # Clamp each bound into the key range of its entity: any bound before
        # every event finds none before it, any after every event finds all.
        def search(bound: IntArray) -> IntArray:
            clamped = np.clip(bound, self._base, self._base + self._span - 1)
            return np.searchsorted(self.points, self._keys(clipped, clamped)[order])

        # Sorted needles make numpy's binary search much faster.
        order = np.argsort(self._keys(clipped, query_times), kind="stable")
        high = np.empty(query_ids.size, dtype=np.int64)
        high[order] = search(query_times)
        lows = []
        for window in self._windows:
            low = np.empty(query_ids.size, dtype=np.int64)
            low[order] = search(query_times - window)
            lows.append(low)
        return [
            [
                np.where(known, self._before[a, high] - self._before[a, low], 0)
                for low in lows
            ]
            for a in range(self._num_actions)
        ]

    def before(self, query_ids: IntArray, query_times: IntArray) -> list[IntArray]:
        """Per action, (Q,) events of the query's entity with time ``< t``."""
        if self._entities.size == 0:
            zeros = np.zeros(query_ids.size, dtype=np.int64)
            return [zeros.copy() for _ in range(self._num_actions)]
        ranks = np.searchsorted(self._entities, query_ids)
        clipped = np.minimum(ranks, self._entities.size - 1)
        known = self._entities[clipped] == query_ids
        clamped = np.clip(query_times, self._base, self._base + self._span - 1)
        keys = self._keys(clipped, clamped)
        # Sorted needles make numpy's binary search much faster.
        order = np.argsort(keys, kind="stable")
        high = np.empty(keys.size, dtype=np.int64)
        high[order] = np.searchsorted(self.points, keys[order])
        # Minus the events of entities ranked before (keys below rank * span).
        low = np.empty(keys.size, dtype=np.int64)
        low[order] = np.searchsorted(self.points, clipped[order] * self._span)
        return [
            np.where(known, self._before[a, high] - self._before[a, low], 0)
            for a in range(self._num_actions)
        ]

    def count_at_points(self) -> list[list[IntArray]]:
        """:meth:`count` at every distinct event key (in key order)."""
        high = np.arange(self.points.size)
        out = []
        lows = [
            np.searchsorted(self.points, self.points - window, side="left")
            for window in self._windows
        ]
        for a in range(self._num_actions):
            before = self._before[a]
            out.append([before[high] - before[low] for low in lows])
        return out


def count_in_windows(
    event_ids: IntArray,
    event_times: IntArray,
    query_ids: IntArray,
    query_times: IntArray,
    windows_ms: tuple[int, ...],
) -> list[IntArray]:
    """Events of each query's entity with time in ``[t - w, t)``, per window ``w``.

    Args:
        event_ids: entity of each event (already distinct events).
        event_times: time of each event (epoch ms).
        query_ids: entity of each query.
        query_times: the query's time ``t``; events at ``t`` are not counted.
        windows_ms: window lengths.

    Returns:
        One int64 count array (aligned with the queries) per window.

    Example:
        >>> [c.tolist() for c in count_in_windows(
        ...     np.array([1, 1, 1, 2]), np.array([0, 5, 10, 9]),
        ...     np.array([1, 2]), np.array([10, 10]), (6, 100))]
        [[1, 1], [2, 1]]
    """
    counter = WindowCounter(
        event_ids, event_times, np.ones(event_ids.size, np.int64), 1, windows_ms
    )
    return counter.count(query_ids, query_times)[0]
