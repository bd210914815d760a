"""Feast entities: the join keys of the feature tables.

One entity per distinct ``FeatureTable.entity`` of :mod:`features.feature_tables`
(user, ad, advertiser), named after the key without its ``_id`` suffix.
"""

from __future__ import annotations

from feast import Entity, ValueType

from features.feature_tables import FEATURE_TABLES

_DESCRIPTIONS = {
    "user_id": "a person who sees ads and organic content",
    "ad_id": "an ad (creative) of a campaign",
    "advertiser_id": "the advertiser owning an ad's campaign",
}


def _entity(join_key: str) -> Entity:
    # Keys are int64 in every table (the contract's entity key type).
    return Entity(
        name=join_key.removesuffix("_id"),
        join_keys=[join_key],
        value_type=ValueType.INT64,
        description=_DESCRIPTIONS[join_key],
    )


ENTITIES: dict[str, Entity] = {
    key: _entity(key)
    for key in dict.fromkeys(t.entity for t in FEATURE_TABLES.values())
}
"""Entity by join key, for every key a feature table uses."""

# Module-level names so `feast apply` finds each object (it scans attributes).
user = ENTITIES["user_id"]
ad = ENTITIES["ad_id"]
advertiser = ENTITIES["advertiser_id"]
