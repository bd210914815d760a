"""A request's online feature rows as the flat model inputs.

Every value is computed as training computes it (:mod:`features.model_inputs`
hashes ids, squashes counters and buckets times for both): request-time
features (``domain``, ``surface``, ``hour_of_day``, each history event's
``seq_time_bucket``) from the request, the rest from the rows. A user
without rows (a cold start) gets the missing id 0, zero counters and an
empty history, as an example of a user the tables do not know.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from features.feature_tables import FEATURE_TABLES, USER_PROFILE_FEATURES, counter_names
from features.model_inputs import (
    DENSE_NAMES,
    SEQUENCE_NAMES,
    dense_inputs,
    hour_of_day,
    sequence_ids,
    sequence_time_buckets,
    sparse_ids,
)
from features.registry import COUNTER_ENTITIES
from features.vocab import DOMAINS, SURFACES
from features.windows import TIME_BUCKET_FEATURE


@dataclass(frozen=True)
class FlatInputs:
    """The five flat inputs (:mod:`features.model_inputs`) as numpy."""

    sparse: npt.NDArray[np.int64]
    seq_values: npt.NDArray[np.int64]
    seq_lengths: npt.NDArray[np.int64]
    dense: npt.NDArray[np.float32]
    domain: npt.NDArray[np.int64]


def history(
    sequence: dict[str, Any] | None, request_ms: int, max_seq_len: int
) -> dict[str, npt.NDArray[Any]]:
    """The user's window: the last ``max_seq_len`` events of the sequence row
    strictly before the request, oldest first, with their time buckets."""
    if sequence is None:
        return {name: np.zeros(0, dtype=np.int64) for name in SEQUENCE_NAMES}
    times = np.asarray(sequence["seq_event_time_ms"], dtype=np.int64)
    stop = int(np.searchsorted(times, request_ms, side="left"))
    start = max(0, stop - max_seq_len)
    window = {
        name: np.asarray(sequence[name], dtype=np.int64)[start:stop]
        for name in SEQUENCE_NAMES
        if name != TIME_BUCKET_FEATURE
    }
    window[TIME_BUCKET_FEATURE] = sequence_time_buckets(times[start:stop], request_ms)
    return window


def _column(rows: Sequence[dict[str, Any] | None], name: str) -> npt.NDArray[Any]:
    return np.asarray(
        [0 if r is None or r[name] is None else r[name] for r in rows], dtype=np.float64
    )


def request_inputs(
    *,
    user_id: int,
    user: dict[str, dict[str, Any] | None],
    ad_ids: Sequence[int],
    ads: Sequence[dict[str, dict[str, Any] | None]],
    advertisers: Sequence[dict[str, dict[str, Any] | None]],
    domain: str,
    surface: str,
    request_ms: int,
    max_seq_len: int,
) -> FlatInputs:
    """The flat inputs of one request (rows by view, as :mod:`serving.online`
    reads them; ``advertisers[i]`` is the advertiser of ``ads[i]``)."""
    b = len(ad_ids)
    profile = user["user_profile"]
    ad_profiles = [a["ad_profile"] for a in ads]
    columns: dict[str, npt.ArrayLike] = {
        "user_id": np.full(b, user_id, dtype=np.int64),
        "ad_id": np.asarray(ad_ids, dtype=np.int64),
        "domain": np.full(b, DOMAINS.index(domain) + 1, dtype=np.int64),
        "surface": np.full(b, SURFACES.index(surface) + 1, dtype=np.int64),
        "hour_of_day": np.full(b, hour_of_day(request_ms), dtype=np.int64),
    }
    for name in USER_PROFILE_FEATURES:
        value = 0 if profile is None else profile[name] or 0
        columns[name] = np.full(b, value, dtype=np.int64)
    for name in FEATURE_TABLES["ad_profile"].feature_names:
        columns[name] = _column(ad_profiles, name).astype(np.int64)
    counters: dict[str, npt.ArrayLike] = {}
    per_entity = {
        "user": [user["user_counters"]] * b,
        "ad": [a["ad_counters"] for a in ads],
        "advertiser": [a["advertiser_counters"] for a in advertisers],
    }
    for entity in COUNTER_ENTITIES:
        for name in counter_names(entity):
            counters[name] = _column(per_entity[entity], name)
    assert set(counters) == set(DENSE_NAMES)
    window = history(user["user_sequence"], request_ms, max_seq_len)
    length = len(window[SEQUENCE_NAMES[0]])
    tiled = {name: np.tile(values, b) for name, values in window.items()}
    return FlatInputs(
        sparse=sparse_ids(columns, b),
        seq_values=sequence_ids(tiled, length * b),
        seq_lengths=np.full(b, length, dtype=np.int64),
        dense=dense_inputs(counters, b),
        domain=np.full(b, DOMAINS.index(domain), dtype=np.int64),
    )
