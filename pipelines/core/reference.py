"""The feature job in one process: the reference (oracle) implementation.

Plain pyarrow / pandas / numpy, written for clarity: every step below is one
rule of :mod:`features.examples` (the spec), vectorized, no per-event Python.
The Beam job (``pipelines/build.py``) must produce the same tables; tests
compare the two. Outputs and layout on disk: :mod:`features.feature_tables`.

Usage::

    python -m pipelines.reference --input DIR --output DIR [--now-ms MS]

``--input`` is a generator or MovieLens output (``events/``,
``users.parquet``, ``ads.parquet``, ``contents.parquet``); its event files
are found and numbered as the Beam job does (:mod:`pipelines.core.event_files`),
and a JSONL line that does not decode is a dead letter with the job's reason,
as is an invalid row. The validation clock is ``--now-ms``, else the input's
``manifest.json`` ``validation_now_ms``, else the wall clock.

Choices the spec leaves open, fixed here (the Beam job follows them):

- Validation comes first; duplicates are removed among *valid* rows: each
  ``event_id`` keeps its winning copy, the first in ``(event_time, user_id,
  digest)`` order, whatever user or file each copy came under
  (:mod:`features.duplicates`).
- "Distinct time order" is ``(event_time, event_id)``, event ids compared
  byte-wise (UTF-8, which is code point order).
- Labels: clicks / conversions are matched on ``impression_id`` alone (any
  user); one in the window is enough.
- As-of joins: ``updated_at <= t``; when an entity has two rows with the same
  ``updated_at`` the later row of the table wins. ``ad_creative_category`` is
  as of the impression; a timeline's ``seq_category`` as of each event for ad
  events, and from the contents table (no versions) for organic ones.
- Counter windows ``1h`` / ``1d`` / ``7d`` are 3,600,000 / 86,400,000 /
  604,800,000 ms; an entity's events are its ad events (impression, click,
  conversion) whose ``user_id`` / ``ad_id`` / ``advertiser_id`` is it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features import vocab
from features.deadletter import DeadLetter
from features.event_table import event_table_reasons
from features.events import (
    CLICK_WINDOW,
    CONVERSION_WINDOW,
    EVENT_COLUMNS,
    EVENT_SCHEMA,
    SCHEMA_VERSION,
    decode_event,
    encode_event_table,
    events_from_records,
)
from features.examples import TIMELINE_SCHEMA, training_example_schema
from features.feature_tables import (
    AD_PROFILE_FEATURES,
    COUNT_NAMES,
    EVENT_TIMESTAMP,
    FEATURE_TABLES,
    LAYOUT_VERSION,
    USER_PROFILE_FEATURES,
    USER_SEQUENCE_LENGTH,
)
from features.fields import TIMESTAMP_TYPE
from features.registry import (
    COUNTER_ACTIONS,
    COUNTER_ENTITIES,
    COUNTER_WINDOWS,
    SPARSE_FEATURES,
    sequence_item_key,
    string_bucket,
)
from features.windows import TIMELINE_SEQUENCE_COLUMNS, window_positions
from pipelines.core.event_files import (
    PARQUET_BATCH_ROWS,
    InputFileError,
    event_files,
    jsonl_payloads,
    row_payloads,
)
from pipelines.core.kernels import (
    PLAIN_COLUMNS,
    BackgroundWrites,
    WindowCounter,
    distinct_sorted,
    parquet_options,
    timeline_order,
    winning_copies,
)

I64 = npt.NDArray[np.int64]

HOUR_MS: Final = 3_600_000
DAY_MS: Final = 86_400_000
WINDOW_MS: Final[Mapping[str, int]] = {"1h": HOUR_MS, "1d": DAY_MS, "7d": 7 * DAY_MS}
LABEL_WINDOWS_MS: Final[Mapping[str, int]] = {
    "click": int(CLICK_WINDOW.total_seconds() * 1000),
    "conversion": int(CONVERSION_WINDOW.total_seconds() * 1000),
}
_NUM_EMBEDDINGS: Final = {f.name: f.num_embeddings for f in SPARSE_FEATURES}


@dataclass(frozen=True)
class ReferenceOutput:
    """Everything the feature job produces (see :mod:`features.feature_tables`).

    Attributes:
        examples: ``training_example_schema()``, sorted by example_id.
        timelines: ``TIMELINE_SCHEMA``, sorted by user_id.
        dead_letters: rejected rows (EVENT_SCHEMA + ``reason``), input order.
        counts: :data:`~features.feature_tables.COUNT_NAMES` -> count.
        feature_tables: name -> table in ``FEATURE_TABLES[name].schema``.
        letters: every dead letter (rejected rows and input lines that never
            became rows), by file and line, as the job writes them.
    """

    examples: pa.Table
    timelines: pa.Table
    dead_letters: pa.Table
    counts: dict[str, int]
    feature_tables: dict[str, pa.Table]
    letters: tuple[DeadLetter, ...] = ()


@dataclass(frozen=True)
class EventOrigins:
    """Where each row of an events table came from, and what never became one.

    Attributes:
        files: the event files.
        file_index: (N,) each row's file, an index into ``files``.
        offsets: (N,) each row's 1-based row (Parquet) or line (JSONL) number.
        set_aside: dead letters of input lines that did not decode.
    """

    files: tuple[str, ...]
    file_index: npt.NDArray[np.int32]
    offsets: I64
    set_aside: tuple[DeadLetter, ...] = ()

    def letter(self, row: int, reason: str, payload: bytes) -> DeadLetter:
        """The dead letter of table row ``row``."""
        return DeadLetter(
            source=self.files[int(self.file_index[row])],
            partition=None,
            offset=int(self.offsets[row]),
            reason=reason,
            payload=payload,
        )


# --- small helpers -----------------------------------------------------------


def _ints(column: pa.ChunkedArray | pa.Array, missing: int = 0) -> I64:
    """An integer / timestamp column as int64 numpy, nulls as ``missing``."""
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    filled = pc.fill_null(column, missing)
    return np.asarray(filled.to_numpy(), dtype=np.int64)


def _vocab_ids(column: pa.ChunkedArray | pa.Array, values: tuple[str, ...]) -> I64:
    """Vocabulary ids (1-based, 0 for null or unknown) of a string column."""
    index = pc.index_in(column, value_set=pa.array(values, pa.string()))
    return _ints(index, missing=-1) + 1


def _as_of(key: I64, time_ms: I64, table: pd.DataFrame, key_name: str) -> pd.DataFrame:
    """The latest row of ``table`` with ``updated_at <= time_ms`` per query.

    Args:
        key, time_ms: (Q,) the queries.
        table: dimension rows with ``key_name``, ``updated_at`` (ms) and int
            attribute columns, in table order.
        key_name: the join key.

    Returns:
        (Q,) rows of the attribute columns, in query order; 0 where none.
    """
    left = pd.DataFrame({key_name: key, "t": time_ms, "_q": np.arange(key.size)})
    left = left.sort_values("t", kind="stable")
    # Stable sort: among equal updated_at, the later table row comes later,
    # and merge_asof takes the last match.
    right = table.sort_values("updated_at", kind="stable")
    joined = pd.merge_asof(
        left,
        right,
        left_on="t",
        right_on="updated_at",
        by=key_name,
        direction="backward",
        allow_exact_matches=True,
    )
    columns = [c for c in table.columns if c not in (key_name, "updated_at")]
    out = joined.sort_values("_q")[columns].fillna(0).astype(np.int64)
    return out.reset_index(drop=True)


def _user_attributes(users: pa.Table) -> pd.DataFrame:
    """Users table rows with the example's user sparse ids (table order)."""
    ages = _ints(users.column("age"))
    return pd.DataFrame(
        {
            "user_id": _ints(users.column("user_id")),
            "updated_at": _ints(users.column("updated_at")),
            # age_bucket(): 1 + index of the last bound <= age = bounds <= age.
            "user_age_bucket": np.searchsorted(
                vocab.AGE_BUCKET_BOUNDS, ages, side="right"
            ),
            "user_gender": _vocab_ids(users.column("gender"), vocab.GENDERS),
            "user_location": string_bucket(
                users.column("location"), _NUM_EMBEDDINGS["user_location"]
            ),
            "user_device": _vocab_ids(users.column("device"), vocab.DEVICES),
        }
    )


def _ad_attributes(ads: pa.Table) -> pd.DataFrame:
    """Ads table rows with the ad profile's ids (table order)."""
    return pd.DataFrame(
        {
            "ad_id": _ints(ads.column("ad_id")),
            "updated_at": _ints(ads.column("updated_at")),
            "advertiser_id": _ints(ads.column("advertiser_id")),
            "campaign_id": _ints(ads.column("campaign_id")),
            "ad_format": _vocab_ids(ads.column("ad_format"), vocab.AD_FORMATS),
            "ad_objective": _vocab_ids(ads.column("objective"), vocab.AD_OBJECTIVES),
            "ad_creative_category": _vocab_ids(
                ads.column("creative_category"), vocab.CATEGORIES
            ),
        }
    )


# --- the steps ---------------------------------------------------------------


@dataclass(frozen=True)
class _Events:
    """Distinct valid events sorted by (event_time, event_id), as arrays."""

    table: pa.Table  # EVENT_SCHEMA rows, sorted
    time: I64
    user: I64
    action: I64  # vocab.ACTIONS id
    ad: I64  # 0 for organic events (use is_ad)
    advertiser: I64
    is_ad: npt.NDArray[np.bool_]

    def entity(self, name: str) -> I64:
        """The user / ad / advertiser id column."""
        return {"user": self.user, "ad": self.ad, "advertiser": self.advertiser}[name]


def _distinct_sorted(valid: pa.Table) -> _Events:
    """Each event_id once (its winning copy), in distinct time order."""
    keep = winning_copies(valid)
    distinct = valid if keep.all() else valid.filter(pa.array(keep))
    # Integer sort on time; only events with equal times compare their ids.
    order = timeline_order([_ints(distinct.column("event_time"))], distinct["event_id"])
    table = distinct.take(pa.array(order))
    action = _vocab_ids(table.column("action"), vocab.ACTIONS)
    return _Events(
        table=table,
        time=_ints(table.column("event_time")),
        user=_ints(table.column("user_id")),
        action=action,
        ad=_ints(table.column("ad_id")),
        advertiser=_ints(table.column("advertiser_id")),
        is_ad=action <= len(vocab.AD_ACTIONS),
    )


_ACTION_ID: Final = vocab.vocabulary_ids(vocab.ACTIONS)


def _labels(events: _Events, impressions: I64) -> dict[str, npt.NDArray[np.int8]]:
    """label_<objective> per impression (rows ``impressions`` of ``events``)."""
    impression_ids = events.table.column("event_id").take(pa.array(impressions))
    labels = {}
    for objective, window in LABEL_WINDOWS_MS.items():
        rows = np.flatnonzero(events.action == _ACTION_ID[objective])
        target = pc.index_in(
            events.table.column("impression_id").take(pa.array(rows)),
            value_set=impression_ids,
        )
        which = _ints(target, missing=-1)
        matched = which >= 0
        delay = events.time[rows[matched]] - events.time[impressions[which[matched]]]
        hit = which[matched][(delay >= 0) & (delay < window)]
        label = np.zeros(impressions.size, dtype=np.int8)
        label[hit] = 1
        labels[f"label_{objective}"] = label
    return labels


def _window_counters(events: _Events) -> dict[str, WindowCounter]:
    """Per entity kind, the windowed counts of its ad events (by action)."""
    code = np.zeros(events.action.size, dtype=np.int64)
    for number, action in enumerate(COUNTER_ACTIONS, start=1):
        code[events.action == _ACTION_ID[action]] = number
    windows = tuple(WINDOW_MS[w] for w in COUNTER_WINDOWS)
    ad = events.is_ad
    return {
        entity: WindowCounter(
            events.entity(entity)[ad],
            events.time[ad],
            code[ad],
            len(COUNTER_ACTIONS),
            windows,
        )
        for entity in COUNTER_ENTITIES
    }


def _counter_columns(
    entity: str, counts: list[list[I64]]
) -> dict[str, npt.NDArray[np.float32]]:
    """``counts[action][window]`` as the float32 counter columns of ``entity``."""
    return {
        f"{entity}_{action}_count_{window}": count.astype(np.float32)
        for action, per_window in zip(COUNTER_ACTIONS, counts, strict=True)
        for window, count in zip(COUNTER_WINDOWS, per_window, strict=True)
    }


def _timeline_cut(events: _Events, user: I64, time_ms: I64) -> I64:
    """Events of each user (any action) strictly before each time."""
    every = WindowCounter(events.user, events.time, np.ones_like(events.user), 1, ())
    return every.before(user, time_ms)[0]


def _timelines(
    events: _Events, ad_attributes: pd.DataFrame, contents: pa.Table
) -> tuple[pa.Table, I64]:
    """TIMELINE_SCHEMA rows (sorted by user) and each event's timeline order.

    Returns:
        ``(timelines, order)``: ``order`` sorts events by (user, time, id).
    """
    table = events.table
    content = _ints(table.column("content_id"))
    # seq_category: ads as of the event (declared category); contents by id.
    ad_category = _as_of(
        events.ad,
        events.time,
        ad_attributes[["ad_id", "updated_at", "ad_creative_category"]],
        "ad_id",
    )["ad_creative_category"].to_numpy()
    content_ids = _ints(contents.column("content_id"))
    content_category = _vocab_ids(contents.column("content_category"), vocab.CATEGORIES)
    # The contents table has no versions: the last row of an id wins. A
    # trailing 0 is what an unknown id (position -1) reads.
    ids, last = np.unique(content_ids[::-1], return_index=True)
    categories = np.append(content_category[::-1][last], 0)
    where = _ints(pc.index_in(pa.array(content), value_set=pa.array(ids)), -1)
    organic_category = categories[where]
    category = np.where(events.is_ad, ad_category, organic_category)
    per_event = {
        "seq_item_id": sequence_item_key(events.ad, content, events.is_ad),
        "seq_action": events.action,
        "seq_domain": _vocab_ids(table.column("domain"), vocab.DOMAINS),
        "seq_surface": _vocab_ids(table.column("surface"), vocab.SURFACES),
        "seq_category": category,
    }
    # Events are in (time, id) order already; a stable sort by user keeps it.
    order = np.argsort(events.user, kind="stable")
    sorted_users = events.user[order]
    starts = np.flatnonzero(np.diff(sorted_users, prepend=sorted_users[:1] - 1))
    users = sorted_users[starts]
    offsets = pa.array(np.append(starts, order.size).astype(np.int32), pa.int32())
    arrays: list[pa.Array] = [pa.array(users, pa.int64())]
    for field in TIMELINE_SCHEMA:
        if field.name == "user_id":
            continue
        if field.name == "event_time":
            values = pa.array(events.time[order], pa.int64()).cast(TIMESTAMP_TYPE)
        else:
            values = pa.array(per_event[field.name][order], field.type.value_type)
        arrays.append(pa.ListArray.from_arrays(offsets, values))
    return pa.Table.from_arrays(arrays, schema=TIMELINE_SCHEMA), order


def _examples(
    events: _Events,
    user_attributes: pd.DataFrame,
    ad_attributes: pd.DataFrame,
    counters: Mapping[str, WindowCounter],
) -> pa.Table:
    """One training example per distinct impression, sorted by example_id."""
    table = events.table
    imp = np.flatnonzero(events.action == _ACTION_ID["impression"])
    rows = table.take(pa.array(imp))
    t, user = events.time[imp], events.user[imp]
    columns: dict[str, npt.ArrayLike | pa.Array | pa.ChunkedArray] = {
        "schema_version": np.full(imp.size, SCHEMA_VERSION, dtype=np.int16),
        "example_id": rows.column("event_id"),
        "event_time": rows.column("event_time"),
        "user_id": user,
        "ad_id": events.ad[imp],
        "advertiser_id": events.advertiser[imp],
        "campaign_id": _ints(rows.column("campaign_id")),
    }
    columns |= _labels(events, imp)
    user_attrs = _as_of(user, t, user_attributes, "user_id")
    for name in USER_PROFILE_FEATURES:
        columns[name] = user_attrs[name].to_numpy()
    ad_attrs = _as_of(
        events.ad[imp],
        t,
        ad_attributes[["ad_id", "updated_at", "ad_creative_category"]],
        "ad_id",
    )
    columns["ad_format"] = _vocab_ids(rows.column("ad_format"), vocab.AD_FORMATS)
    columns["ad_objective"] = _vocab_ids(rows.column("objective"), vocab.AD_OBJECTIVES)
    columns["ad_creative_category"] = ad_attrs["ad_creative_category"].to_numpy()
    columns["domain"] = _vocab_ids(rows.column("domain"), vocab.DOMAINS)
    columns["surface"] = _vocab_ids(rows.column("surface"), vocab.SURFACES)
    columns["hour_of_day"] = (t // HOUR_MS) % 24 + 1
    for entity in COUNTER_ENTITIES:
        counts = counters[entity].count(events.entity(entity)[imp], t)
        columns |= _counter_columns(entity, counts)
    columns["timeline_cut"] = _timeline_cut(events, user, t)
    schema = training_example_schema()
    examples = pa.Table.from_arrays(
        [pa.array(columns[f.name], f.type) for f in schema], schema=schema
    )
    return examples.take(
        pc.sort_indices(examples, sort_keys=[("example_id", "ascending")])
    )


# --- feature tables ----------------------------------------------------------


def _frame_table(frame: pd.DataFrame, name: str) -> pa.Table:
    """A feature table from a frame holding its columns (times in ms)."""
    spec = FEATURE_TABLES[name]
    frame = frame.sort_values([spec.entity, EVENT_TIMESTAMP], kind="stable")
    arrays = []
    for field in spec.schema:
        values = frame[field.name].to_numpy()
        if field.name == EVENT_TIMESTAMP:
            arrays.append(pa.array(values, pa.int64()).cast(TIMESTAMP_TYPE))
        else:
            arrays.append(pa.array(values, field.type))
    return pa.Table.from_arrays(arrays, schema=spec.schema)


def _counter_table(counter: WindowCounter, entity: str) -> pa.Table:
    """``<entity>_counters``: a row at each distinct ad event time of the entity."""
    key, time_ms = counter.point_entities()
    frame = pd.DataFrame(
        {
            f"{entity}_id": key,
            EVENT_TIMESTAMP: time_ms,
            **_counter_columns(entity, counter.count_at_points()),
        }
    )
    return _frame_table(frame, f"{entity}_counters")


def _user_sequence_table(events: _Events, timelines: pa.Table) -> pa.Table:
    """``user_sequence``: last events before the end of each active (user, hour)."""
    points = pd.DataFrame(
        {"user_id": events.user, "hour_end": (events.time // HOUR_MS + 1) * HOUR_MS}
    ).drop_duplicates()
    points = points.sort_values(["user_id", "hour_end"]).reset_index(drop=True)
    user, hour_end = points["user_id"].to_numpy(), points["hour_end"].to_numpy()
    cut = _timeline_cut(events, user, hour_end)
    positions, offsets, columns = window_positions(
        user, cut, timelines, USER_SEQUENCE_LENGTH
    )
    take = pa.array(positions, pa.int64())
    list_offsets = pa.array(offsets.astype(np.int32), pa.int32())
    spec = FEATURE_TABLES["user_sequence"]
    arrays: list[pa.Array] = [
        pa.array(user, pa.int64()),
        pa.array(hour_end, pa.int64()).cast(TIMESTAMP_TYPE),
        pa.ListArray.from_arrays(
            list_offsets, columns["event_time"].take(take).cast(pa.int64())
        ),
    ]
    arrays += [
        pa.ListArray.from_arrays(list_offsets, columns[name].take(take))
        for name in TIMELINE_SEQUENCE_COLUMNS
    ]
    return pa.Table.from_arrays(arrays, schema=spec.schema)


def _feature_tables(
    events: _Events,
    timelines: pa.Table,
    user_attributes: pd.DataFrame,
    ad_attributes: pd.DataFrame,
    counters: Mapping[str, WindowCounter],
) -> dict[str, pa.Table]:
    users = user_attributes.rename(columns={"updated_at": EVENT_TIMESTAMP})
    ads = ad_attributes.rename(columns={"updated_at": EVENT_TIMESTAMP})
    tables = {
        "user_profile": _frame_table(
            users[["user_id", EVENT_TIMESTAMP, *USER_PROFILE_FEATURES]], "user_profile"
        ),
        "ad_profile": _frame_table(
            ads[["ad_id", EVENT_TIMESTAMP, *AD_PROFILE_FEATURES]], "ad_profile"
        ),
    }
    for entity in COUNTER_ENTITIES:
        tables[f"{entity}_counters"] = _counter_table(counters[entity], entity)
    tables["user_sequence"] = _user_sequence_table(events, timelines)
    return tables


# --- the job -----------------------------------------------------------------


def build_reference(
    events: pa.Table,
    users: pa.Table,
    ads: pa.Table,
    contents: pa.Table,
    *,
    now_ms: int | None = None,
    origins: EventOrigins | None = None,
) -> ReferenceOutput:
    """Run the whole feature job in memory.

    Args:
        events: raw events in EVENT_SCHEMA (duplicates and invalid rows allowed).
        users: USER_SCHEMA rows (versions by ``updated_at``).
        ads: AD_SCHEMA rows (versions by ``updated_at``).
        contents: CONTENT_SCHEMA rows.
        now_ms: validation clock (epoch ms); the wall clock when None.
        origins: where the rows came from (:func:`read_event_input`); None:
            one source, ``events``, numbered by row from 1.

    Returns:
        Examples, timelines, dead letters, counts and feature tables.
    """
    if origins is None:
        origins = EventOrigins(
            ("events",),
            np.zeros(events.num_rows, np.int32),
            np.arange(1, events.num_rows + 1, dtype=np.int64),
        )
    valid, dead_letters, letters = _validate(events, origins, now_ms)
    distinct = _distinct_sorted(valid)
    user_attributes = _user_attributes(users)
    ad_attributes = _ad_attributes(ads)
    timelines, _ = _timelines(distinct, ad_attributes, contents)
    counters = _window_counters(distinct)
    examples = _examples(distinct, user_attributes, ad_attributes, counters)
    counts = {
        "events_read": events.num_rows + len(origins.set_aside),
        "events_valid": valid.num_rows,
        "events_dead_lettered": len(letters),
        "duplicates_removed": valid.num_rows - distinct.table.num_rows,
        "events_distinct": distinct.table.num_rows,
        "timeline_events": int(
            pc.sum(pc.list_value_length(timelines.column("event_time"))).as_py() or 0
        ),
        "timelines": timelines.num_rows,
        "impressions": int(np.sum(distinct.action == _ACTION_ID["impression"])),
        "examples": examples.num_rows,
    }
    assert tuple(counts) == COUNT_NAMES
    return ReferenceOutput(
        examples=examples,
        timelines=timelines,
        dead_letters=dead_letters,
        counts=counts,
        feature_tables=_feature_tables(
            distinct, timelines, user_attributes, ad_attributes, counters
        ),
        letters=letters,
    )


def _validate(
    events: pa.Table, origins: EventOrigins, now_ms: int | None
) -> tuple[pa.Table, pa.Table, tuple[DeadLetter, ...]]:
    """Valid rows, rejected rows (with ``reason``) and every dead letter,
    by file and line; a rejected row's payload is its wire JSON, as the
    job's."""
    reasons = event_table_reasons(events, now=now_ms)
    bad = pd.notna(reasons)
    rows = np.flatnonzero(bad)
    rejected = events.take(pa.array(rows, pa.int64()))
    wire = encode_event_table(rejected)
    letters = [
        origins.letter(int(row), reasons[row], payload)
        for row, payload in zip(rows, wire, strict=True)
    ]
    letters += origins.set_aside
    order = {path: i for i, path in enumerate(origins.files)}
    letters.sort(key=lambda letter: (order.get(letter.source, -1), letter.offset))
    valid = events if not rows.size else events.filter(pa.array(~bad))
    rejected = rejected.append_column(
        "reason", pa.array(reasons[bad].tolist(), pa.string())
    )
    return valid, rejected, tuple(letters)


# --- files -------------------------------------------------------------------

OUTPUT_PARTS: Final = (
    "examples",
    "timelines",
    "feature_tables",
    "dead_letters",
    "summary.json",
)


def _dead_letter_lines(letters: Sequence[DeadLetter]) -> str:
    """JSONL of dead letters (:meth:`DeadLetter.to_json`), as the job writes."""
    return "".join(letter.to_json() + "\n" for letter in letters)


def write_output(output: ReferenceOutput, out: Path, *, now_ms: int) -> None:
    """Write the reference's outputs in the layout of
    :data:`features.feature_tables.OUTPUT_LAYOUT` (one part-0 per folder).

    Parquet files with the Beam job's settings (:func:`parquet_options`), on
    a writer thread (as the Beam job's writers do) while the next is prepared.
    """
    writes = BackgroundWrites()
    try:
        _write_files(output, out, writes)
        writes.wait()
    finally:
        writes.close()
    (out / "dead_letters").mkdir(parents=True, exist_ok=True)
    (out / "dead_letters" / "part-0.jsonl").write_text(
        _dead_letter_lines(output.letters), encoding="utf-8"
    )
    summary = {
        "layout_version": LAYOUT_VERSION,
        "now_ms": now_ms,
        "counts": output.counts,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def _write_parquet(table: pa.Table, path: Path, plain: Sequence[str] = ()) -> None:
    pq.write_table(table, path, **parquet_options(table.schema, plain))


def _write_files(output: ReferenceOutput, out: Path, writes: BackgroundWrites) -> None:
    examples = output.examples
    days = _ints(examples.column("event_time")) // DAY_MS
    for day in distinct_sorted(days):
        date = str(np.datetime64(int(day), "D"))
        part = out / "examples" / f"date={date}" / "part-0.parquet"
        part.parent.mkdir(parents=True, exist_ok=True)
        rows = examples.filter(pa.array(days == day))
        writes.submit(_write_parquet, rows, part, PLAIN_COLUMNS["examples"])
    (out / "examples").mkdir(parents=True, exist_ok=True)
    (out / "timelines").mkdir(parents=True, exist_ok=True)
    part = out / "timelines" / "part-0.parquet"
    writes.submit(_write_parquet, output.timelines, part, PLAIN_COLUMNS["timelines"])
    (out / "feature_tables").mkdir(parents=True, exist_ok=True)
    for name, table in output.feature_tables.items():
        path = out / "feature_tables" / f"{name}.parquet"
        writes.submit(_write_parquet, table, path, PLAIN_COLUMNS.get(name, ()))


def read_input(source: Path) -> tuple[pa.Table, pa.Table, pa.Table, pa.Table]:
    """Events (EVENT_SCHEMA) and the users / ads / contents tables of a data set
    whose event files all parse (a generated one); :func:`read_event_input`
    reads any, setting aside what does not decode."""
    from pipelines.sources.synthetic.writer import read_event_file

    files = event_files(source)
    events = (
        pa.concat_tables([read_event_file(Path(f)) for f in files])
        if files
        else EVENT_SCHEMA.empty_table()
    )
    return (events, *_dimensions(source))


def _dimensions(source: Path) -> tuple[pa.Table, pa.Table, pa.Table]:
    return (
        _dimension(source / "users.parquet"),
        _dimension(source / "ads.parquet"),
        _dimension(source / "contents.parquet"),
    )


def _dimension(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowException) as error:
        raise InputFileError(
            f"{path}: cannot read the dimension table ({error})"
        ) from error


def read_event_input(
    source: Path, now_ms: int | None
) -> tuple[pa.Table, EventOrigins, pa.Table, pa.Table, pa.Table]:
    """Events, where each came from, and the dimension tables of any input
    the Beam job reads.

    Parquet rows become rows; a JSONL line, or a row of a Parquet file of
    foreign column types, becomes a row when it decodes
    (:func:`features.events.decode_event`, with the job's clock ``now_ms``),
    and a dead letter with the job's reason when not.
    """
    files = event_files(source)
    tables: list[pa.Table] = []
    file_index: list[npt.NDArray[np.int32]] = []
    offsets: list[I64] = []
    set_aside: list[DeadLetter] = []
    for index, path in enumerate(files):
        if path.endswith(".jsonl"):
            with open(path, "rb") as handle:
                lines = list(jsonl_payloads(handle))
            table, numbers = _decoded(path, lines, now_ms, set_aside)
        else:
            table, numbers = _parquet_events(path, now_ms, set_aside)
        tables.append(table)
        file_index.append(np.full(table.num_rows, index, np.int32))
        offsets.append(numbers)
    events = pa.concat_tables(tables) if tables else EVENT_SCHEMA.empty_table()
    origins = EventOrigins(
        tuple(files),
        np.concatenate(file_index) if file_index else np.zeros(0, np.int32),
        np.concatenate(offsets) if offsets else np.zeros(0, np.int64),
        tuple(set_aside),
    )
    return (events, origins, *_dimensions(source))


def _parquet_events(
    path: str, now_ms: int | None, set_aside: list[DeadLetter]
) -> tuple[pa.Table, I64]:
    """A Parquet file's rows and their numbers, in the job's batches: a batch
    of foreign column types row by row (:mod:`pipelines.core.event_files`)."""
    tables: list[pa.Table] = [EVENT_SCHEMA.empty_table()]
    numbers: list[I64] = []
    first = 1
    try:
        batches = pq.ParquetFile(path).iter_batches(
            batch_size=PARQUET_BATCH_ROWS, columns=list(EVENT_COLUMNS)
        )
        for batch in batches:
            table = pa.Table.from_batches([batch])
            try:
                events = table.cast(EVENT_SCHEMA)
                rows = np.arange(first, first + table.num_rows, dtype=np.int64)
            except pa.ArrowException:
                payloads = list(enumerate(row_payloads(table), start=first))
                events, rows = _decoded(path, payloads, now_ms, set_aside)
            tables.append(events)
            numbers.append(rows)
            first += table.num_rows
    except (OSError, pa.ArrowException, ValueError) as error:
        raise InputFileError(f"{path}: cannot read events ({error})") from error
    return pa.concat_tables(tables), np.concatenate([np.zeros(0, np.int64), *numbers])


def _decoded(
    path: str,
    payloads: Sequence[tuple[int, bytes]],
    now_ms: int | None,
    set_aside: list[DeadLetter],
) -> tuple[pa.Table, I64]:
    """The events of ``(line or row number, wire message)`` pairs that
    decode, with their numbers; the others' dead letters are added to
    ``set_aside``."""
    records = []
    numbers = []
    for number, payload in payloads:
        decoded = decode_event(payload, now=now_ms)
        if decoded.event is not None:
            records.append(decoded.event)
            numbers.append(number)
            continue
        reason = decoded.reason or "invalid event"
        set_aside.append(
            DeadLetter(
                source=path,
                partition=None,
                offset=number,
                reason=reason,
                payload=payload,
            )
        )
    table = events_from_records(records) if records else EVENT_SCHEMA.empty_table()
    return table.cast(EVENT_SCHEMA), np.asarray(numbers, dtype=np.int64)


def validation_clock(source: Path, now_ms: int | None) -> int:
    """``now_ms``, else the input manifest's ``validation_now_ms``, else now."""
    if now_ms is not None:
        return now_ms
    try:
        manifest = json.loads((source / "manifest.json").read_text())
        return int(manifest["validation_now_ms"])
    except (OSError, ValueError, KeyError, TypeError):
        return time.time_ns() // 1_000_000
