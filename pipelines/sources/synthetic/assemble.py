"""Turn base events and outcomes into the event table and the truth table.

Clicks and conversions copy their impression's user, domain, surface and ad
fields; every event is put in time order, numbered, and given a string id;
a few events are then logged twice (at-least-once delivery). All of it is
array indexing plus one sort.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from features import vocab
from features.events import EVENT_SCHEMA
from pipelines.sources.synthetic.outcomes import Outcomes
from pipelines.sources.synthetic.sampling import IntArray
from pipelines.sources.synthetic.timelines import BaseEvents
from pipelines.sources.synthetic.world import Ads

CLICK = vocab.ACTIONS.index("click")
CONVERSION = vocab.ACTIONS.index("conversion")

TRUTH_SCHEMA = pa.schema(
    [
        pa.field("impression_id", pa.string(), False),
        pa.field("domain", pa.string(), False),
        pa.field("p_click", pa.float64(), False),
        pa.field("p_conversion", pa.float64(), False),
        pa.field("clicked", pa.int8(), False),
        pa.field("converted", pa.int8(), False),
    ],
    metadata={"record": "generator_truth"},
)


@dataclass(frozen=True)
class Assembled:
    """The event table (time order, duplicates adjacent) and the truth table."""

    events: pa.Table
    truth: pa.Table
    duplicates: int
    counts: dict[str, dict[str, int]]  # domain -> action -> events written
    max_events_per_user: int  # as written (the heavy tail)
    users_with_events: int


def id_prefix(seed: int) -> str:
    """Event-id prefix: ids from different seeds never collide when merged."""
    return f"s{seed}-"


# Four ASCII digits per uint32: ids are written four digits per numpy pass.
_DIGITS4 = (
    np.frombuffer(
        "".join(f"{i:04d}" for i in range(10_000)).encode("ascii"), dtype=np.uint8
    )
    .copy()
    .view(np.uint32)
)
ID_MIN_DIGITS = 8


def _validity(valid: np.ndarray | None) -> tuple[pa.Buffer | None, int]:
    """Arrow validity bitmap and null count of a boolean mask (None: no nulls)."""
    if valid is None:
        return None, 0
    return (
        pa.py_buffer(np.packbits(valid, bitorder="little")),
        int(valid.size - np.count_nonzero(valid)),
    )


def id_digits(count: int) -> int:
    """Digits of the ids of ``count`` events: a multiple of 4, at least 8."""
    needed = len(str(max(count - 1, 0)))
    return max(ID_MIN_DIGITS, -(-needed // 4) * 4)


def id_strings(
    prefix: str, numbers: IntArray, digits: int, valid: np.ndarray | None = None
) -> pa.Array:
    """``prefix + zero-padded number`` as an Arrow string array, built in numpy.

    Casting int64 to string in Arrow is slow per value; fixed-width ids
    let us write the UTF-8 bytes and offsets directly, four digits per pass
    (and they sort like the numbers). Null entries take no bytes.

    Args:
        prefix: ASCII prefix.
        numbers: non-negative integers below ``10**digits``.
        digits: digits per id, a multiple of 4.
        valid: optional mask; False entries become null.

    Returns:
        A string array of ``len(numbers)`` ids.
    """
    n = numbers.size
    head = np.frombuffer(prefix.encode("ascii"), dtype=np.uint8)
    groups = digits // 4
    rest = np.asarray(numbers if valid is None else numbers[valid], dtype=np.int64)
    m = rest.size
    if m and int(rest.max()) < 2**32:
        rest = rest.astype(np.uint32)  # 32-bit division is markedly faster
    quads = np.empty((m, groups), dtype=np.uint32)
    for g in range(groups - 1, -1, -1):
        rest, low = np.divmod(rest, 10_000)
        quads[:, g] = _DIGITS4[low]
    rows = np.empty((m, head.size + digits), dtype=np.uint8)
    rows[:, : head.size] = head
    rows[:, head.size :] = quads.view(np.uint8).reshape(m, digits)
    size = head.size + digits
    offsets = np.zeros(n + 1, dtype=np.int32)
    if valid is None:
        offsets[1:] = np.arange(1, n + 1, dtype=np.int32) * size
    else:
        np.cumsum(valid * np.int32(size), out=offsets[1:])
    bitmap, nulls = _validity(valid)
    return pa.StringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(rows), bitmap, nulls
    )


def nullable_ints(values: IntArray, valid: np.ndarray) -> pa.Array:
    """An int64 Arrow array with nulls where ``valid`` is False (zero-copy data)."""
    bitmap, nulls = _validity(valid)
    data = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(
        pa.int64(), data.size, [bitmap, pa.py_buffer(data)], null_count=nulls
    )


def vocab_strings(
    values: tuple[str, ...],
    codes: npt.NDArray[np.integer[Any]],
    valid: np.ndarray | None = None,
) -> pa.Array:
    """Strings from vocabulary codes: one Arrow ``take`` with int8 indices."""
    indices = np.ascontiguousarray(codes, dtype=np.int8)
    bitmap, nulls = _validity(valid)
    index_array = pa.Array.from_buffers(
        pa.int8(), indices.size, [bitmap, pa.py_buffer(indices)], null_count=nulls
    )
    return pa.array(values, pa.string()).take(index_array)


def time_order(times: IntArray) -> IntArray:
    """Stable argsort of event times, via a sort of unique packed keys.

    ``time << bits | row`` makes every key unique, so sorting the values (much
    faster than ``argsort``) gives the stable order and the result cannot
    depend on the sort algorithm or CPU.
    """
    n = times.size
    if n == 0:
        return np.empty(0, dtype=np.int64)
    rel = times - times.min()
    bits = max(1, int(n - 1).bit_length())
    if int(rel.max()).bit_length() + bits > 62:
        return np.asarray(np.argsort(times, kind="stable"), dtype=np.int64)
    keys: IntArray = (rel << bits) | np.arange(n, dtype=np.int64)
    keys.sort()
    keys &= (1 << bits) - 1
    return keys


def build_tables(
    base: BaseEvents,
    outcomes: Outcomes,
    ads: Ads,
    *,
    seed: int,
    duplicate_rate: float,
    rng: np.random.Generator,
) -> Assembled:
    """Build the event and truth tables.

    Args:
        base: organic events and impressions.
        outcomes: per-impression truth and follow-up times.
        ads: the ads (for their ids and attributes).
        seed: the run's seed (id prefix).
        duplicate_rate: probability an event is logged twice.
        rng: the random stream.

    Returns:
        The tables and the number of duplicates injected.
    """
    rows = _all_rows(base, outcomes)
    order = time_order(rows.times)
    number = np.empty(order.size, dtype=np.int64)  # event number = time rank
    number[order] = np.arange(order.size, dtype=np.int64)

    # At-least-once logging: each event is re-emitted with this probability,
    # right after the original, with the same id.
    dup = rng.random(order.size) < duplicate_rate
    emitted = np.repeat(np.arange(order.size, dtype=np.int64), 1 + dup)
    ids = _Ids(id_prefix(seed), id_digits(order.size))
    written = order[emitted]
    events = _event_table(base, ads, rows, written, emitted, number, ids)
    user = base.user[rows.parent[written]]
    per_user = np.bincount(user) if written.size else np.zeros(1, dtype=np.int64)
    return Assembled(
        events=events,
        truth=_truth_table(base, outcomes, number, ids),
        duplicates=int(dup.sum()),
        counts=_counts(base.domain[rows.parent[written]], rows.actions[written]),
        max_events_per_user=int(per_user.max()),
        users_with_events=int(np.count_nonzero(per_user)),
    )


@dataclass(frozen=True)
class _Rows:
    """Base events then follow-ups (clicks, then conversions), unordered."""

    parent: IntArray
    """The base event each row copies its context from: itself for base
    events, its impression for follow-ups."""
    times: IntArray
    actions: npt.NDArray[np.int8]
    follow_up: npt.NDArray[np.bool_]


@dataclass(frozen=True)
class _Ids:
    """How event ids are spelled: a prefix and a fixed number of digits."""

    prefix: str
    digits: int

    def of(self, numbers: IntArray, valid: np.ndarray | None = None) -> pa.Array:
        """The ids of event ``numbers`` (null where ``valid`` is False)."""
        return id_strings(self.prefix, numbers, self.digits, valid=valid)


def _all_rows(base: BaseEvents, outcomes: Outcomes) -> _Rows:
    n_base = base.user.size
    clicked_imp = outcomes.impression[outcomes.clicked]
    converted_imp = outcomes.impression[outcomes.converted]
    parent = np.concatenate(
        [np.arange(n_base, dtype=np.int64), clicked_imp, converted_imp]
    )
    times = np.concatenate([base.time_ms, outcomes.click_ms, outcomes.conversion_ms])
    actions = np.concatenate(
        [
            base.action,
            np.full(clicked_imp.size, CLICK, dtype=np.int8),
            np.full(converted_imp.size, CONVERSION, dtype=np.int8),
        ]
    )
    return _Rows(parent, times, actions, np.arange(parent.size) >= n_base)


def _event_table(
    base: BaseEvents,
    ads: Ads,
    rows: _Rows,
    written: IntArray,
    emitted: IntArray,
    number: IntArray,
    ids: _Ids,
) -> pa.Table:
    """EVENT_SCHEMA rows of the ``written`` rows (numbered ``emitted``)."""
    src = rows.parent[written]
    ad = base.ad[src]
    is_ad = ad >= 0
    ad_safe = np.where(is_ad, ad, 0)
    content = base.content[src]  # -1 for impressions and their follow-ups
    follow_up = rows.follow_up[written]
    impression_number = np.where(follow_up, number[src], 0)
    columns = [
        pa.array(np.ones(written.size, dtype=np.int16)),
        ids.of(emitted),
        pa.array(rows.times[written], pa.int64()).cast(
            EVENT_SCHEMA.field("event_time").type
        ),
        pa.array(base.user[src]),
        vocab_strings(vocab.DOMAINS, base.domain[src]),
        vocab_strings(vocab.SURFACES, base.surface[src]),
        vocab_strings(vocab.ACTIONS, rows.actions[written]),
        nullable_ints(ad_safe, is_ad),
        nullable_ints(ads.advertiser[ad_safe], is_ad),
        nullable_ints(ads.campaign[ad_safe], is_ad),
        vocab_strings(vocab.AD_FORMATS, ads.ad_format[ad_safe], is_ad),
        vocab_strings(vocab.AD_OBJECTIVES, ads.objective[ad_safe], is_ad),
        ids.of(impression_number, valid=follow_up),
        nullable_ints(np.maximum(content, 0), content >= 0),
    ]
    return pa.Table.from_arrays(columns, schema=EVENT_SCHEMA)


def _truth_table(
    base: BaseEvents, outcomes: Outcomes, number: IntArray, ids: _Ids
) -> pa.Table:
    """One row per impression, in time order like the events."""
    imp_number = number[outcomes.impression]
    by_time = np.argsort(imp_number)
    return pa.Table.from_arrays(
        [
            ids.of(imp_number[by_time]),
            vocab_strings(vocab.DOMAINS, base.domain[outcomes.impression][by_time]),
            pa.array(outcomes.p_click[by_time]),
            pa.array(outcomes.p_conversion[by_time]),
            pa.array(outcomes.clicked[by_time].astype(np.int8)),
            pa.array(outcomes.converted[by_time].astype(np.int8)),
        ],
        schema=TRUTH_SCHEMA,
    )


def _counts(
    domain: npt.NDArray[np.int8], action: npt.NDArray[np.int8]
) -> dict[str, dict[str, int]]:
    """Events written per domain and action, by name."""
    per_pair = np.bincount(
        domain.astype(np.int64) * len(vocab.ACTIONS) + action,
        minlength=len(vocab.DOMAINS) * len(vocab.ACTIONS),
    ).reshape(len(vocab.DOMAINS), len(vocab.ACTIONS))
    return {
        domain: {a: int(per_pair[d, i]) for i, a in enumerate(vocab.ACTIONS)}
        for d, domain in enumerate(vocab.DOMAINS)
    }
