"""Training examples and user timelines, as Arrow schemas, and what each value means.

A training example is one ad impression: its ids and context, one label per
training objective, the non-sequential features of :mod:`features.registry`,
and a reference into the user's timeline.

Sequences are stored at minimal cost: each user's events once, time-sorted, in
a **timeline** row whose per-event attributes are Arrow list columns. An Arrow
``ListArray`` is a jagged tensor: ``offsets`` (B + 1) plus flat ``values``::

    user   timeline (seq_action)        offsets   values
    u1     [click, view, like]          0         [click, view, like, view]
    u2     [view]                       3
                                        4

An example points into its user's timeline with ``timeline_cut``: the number of
timeline events strictly before the impression, so its history is
``timeline[:timeline_cut]`` and never sees the impression itself or anything
after it. Where windows are materialized (a batch about to be trained on, a
small test set), the same ``seq_*`` list columns sit on the example itself
(``training_example_schema(with_sequences=True)``).

Semantics (every producer of examples must compute exactly this; the Beam job
and the single-process reference are tested against each other):

- **Input**: valid events (:func:`features.event_table.validate_event_table`), each
  ``event_id`` counted once, across all users and inputs: its winning copy,
  the first in ``(event_time, user_id, digest)`` order, is the
  event; every other copy is a duplicate (:mod:`features.duplicates`).
- **Examples**: one per distinct impression; ``example_id`` = its event_id;
  ids, ``domain`` and ``surface`` from the impression event.
- **Labels**: ``label_click`` = 1 when a click with ``impression_id`` = the
  example's id has ``event_time`` in ``[t, t + CLICK_WINDOW)``, where ``t`` is
  the impression time; ``label_conversion`` likewise with a conversion and
  ``CONVERSION_WINDOW`` (measured from the impression, not the click).
- **Dimension attributes**: as-of join on ``updated_at``: the latest row of the
  users / ads table with ``updated_at <= t``; none → the missing id 0.
  ``user_age_bucket`` = :func:`features.vocab.age_bucket`; ``user_gender``,
  ``user_device`` = vocabulary ids (:func:`features.vocab.vocabulary_ids`);
  ``user_location`` = :func:`features.registry.string_bucket`;
  ``ad_creative_category`` from the ads table; ``ad_format`` and
  ``ad_objective`` from the impression event; ``domain`` and ``surface`` =
  vocabulary ids of the event; ``hour_of_day`` = UTC hour of ``t`` + 1.
- **Counters** (``{entity}_{action}_count_{window}``): the number of distinct
  events of that entity (user / ad / advertiser) and action (impression /
  click / conversion, each at its own event time) with event time in
  ``[t - window, t)``: strictly before the impression.
- **Timeline**: all of a user's distinct valid events, organic and ad, every
  action, sorted by ``(event_time, event_id)``. Per event: ``seq_item_id`` =
  :func:`features.registry.sequence_item_key` (raw key; hashed by the
  trainer), ``seq_action`` / ``seq_domain`` / ``seq_surface`` = vocabulary ids,
  ``seq_category`` = the ad's declared creative category (ads table, as of the
  event) or the content's category (contents table); 0 when unknown.
  ``timeline_cut`` = number of the user's timeline events with
  ``event_time < t``.
- **Window** (what the trainer sees): the last ``max_seq_len`` events of
  ``timeline[:timeline_cut]``, oldest first, plus ``seq_time_bucket`` =
  :func:`features.registry.time_bucket` of the seconds from each event to
  ``t``.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

from features.events import SCHEMA_VERSION
from features.fields import TIMESTAMP_TYPE
from features.registry import DENSE_FEATURES, SEQUENCE_FEATURES, SPARSE_FEATURES
from features.vocab import TRAINING_OBJECTIVES

LABEL_COLUMNS: Final = tuple(f"label_{o}" for o in TRAINING_OBJECTIVES)

# Sparse features whose value *is* an id column of the example (hashed when
# embedded) rather than a derived code; they appear once, as the raw id.
_RAW_ID_FEATURES: Final = ("user_id", "ad_id", "advertiser_id", "campaign_id")


def _meta(doc: str) -> dict[str, str]:
    return {"doc": doc}


def training_example_schema(*, with_sequences: bool = False) -> pa.Schema:
    """The Arrow schema of training examples.

    Args:
        with_sequences: add the materialized ``seq_*`` list columns (the last
            events before the impression, oldest first).

    Example:
        >>> schema = training_example_schema(with_sequences=True)
        >>> schema.field("seq_action").type
        ListType(list<item: int32>)
    """
    fields = [
        pa.field("schema_version", pa.int16(), False, _meta("contract version")),
        pa.field("example_id", pa.string(), False, _meta("event_id of the impression")),
        pa.field("event_time", TIMESTAMP_TYPE, False, _meta("impression time")),
        pa.field("user_id", pa.int64(), False, _meta("user")),
        pa.field("ad_id", pa.int64(), False, _meta("ad")),
        pa.field("advertiser_id", pa.int64(), False, _meta("advertiser")),
        pa.field("campaign_id", pa.int64(), False, _meta("campaign")),
    ]
    fields += [
        pa.field(name, pa.int8(), False, _meta(f"1 if a {name[6:]} was attributed"))
        for name in LABEL_COLUMNS
    ]
    fields += [
        pa.field(f.name, pa.int64(), False, _meta(f.doc))
        for f in SPARSE_FEATURES
        if f.name not in _RAW_ID_FEATURES
    ]
    fields += [
        pa.field(f.name, pa.float32(), False, _meta(f.doc)) for f in DENSE_FEATURES
    ]
    fields.append(
        pa.field(
            "timeline_cut",
            pa.int64(),
            False,
            _meta("timeline events of this user strictly before the impression"),
        )
    )
    if with_sequences:
        fields += [_sequence_field(f.name, f.doc) for f in SEQUENCE_FEATURES]
    return pa.schema(
        fields,
        metadata={"record": "training_example", "schema_version": str(SCHEMA_VERSION)},
    )


def _sequence_field(name: str, doc: str) -> pa.Field:
    value_type = pa.int64() if name == "seq_item_id" else pa.int32()
    return pa.field(name, pa.list_(value_type), False, _meta(doc))


# Timelines hold the raw per-event attributes; the time bucket depends on the
# impression, so it is derived at read time from ``event_time``.
TIMELINE_SCHEMA: Final = pa.schema(
    [
        pa.field("user_id", pa.int64(), False, _meta("user")),
        pa.field(
            "event_time",
            pa.list_(TIMESTAMP_TYPE),
            False,
            _meta("time of each event, ascending"),
        ),
    ]
    + [
        _sequence_field(f.name, f.doc)
        for f in SEQUENCE_FEATURES
        if f.name != "seq_time_bucket"
    ],
    metadata={"record": "timeline", "schema_version": str(SCHEMA_VERSION)},
)

# A slice of a timeline: events ``[segment_start, segment_start + len)`` of the
# user's full timeline. ``timeline_cut`` stays an index into the *full*
# timeline, so an example's window is read from a segment exactly as from the
# whole timeline (:mod:`features.windows`); a batch or Kafka message then
# carries each needed user's events once, and only those its windows reach.
TIMELINE_SEGMENT_SCHEMA: Final = TIMELINE_SCHEMA.append(
    pa.field(
        "segment_start",
        pa.int64(),
        False,
        _meta("index of the segment's first event in the user's full timeline"),
    )
).with_metadata({"record": "timeline_segment", "schema_version": str(SCHEMA_VERSION)})
