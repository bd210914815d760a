"""Dimension tables: users, ads and organic content.

Events carry ids; the attributes live here, one row per entity version
(``updated_at`` says from when the row holds, which is what point-in-time
joins and Feast's ``timestamp_field`` need).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from features import vocab
from features.fields import (
    FieldSpec,
    arrow_schema,
    check_fields,
    int_field,
    string_field,
    time_field,
)

USER_FIELDS: Final[tuple[FieldSpec, ...]] = (
    int_field("user_id", "the user", min_value=0),
    int_field("age", "age in years", min_value=vocab.MIN_AGE, max_value=vocab.MAX_AGE),
    string_field("gender", "self-declared gender", allowed=vocab.GENDERS),
    string_field("location", "coarse location: country code and region, e.g. 'US-07'"),
    string_field("device", "primary device", allowed=vocab.DEVICES),
    time_field("signup_time", "when the account was created"),
    time_field("updated_at", "from when this row's values hold"),
)

AD_FIELDS: Final[tuple[FieldSpec, ...]] = (
    int_field("ad_id", "the ad", min_value=0),
    int_field("advertiser_id", "the advertiser running the ad", min_value=0),
    int_field("campaign_id", "the campaign the ad belongs to", min_value=0),
    string_field("ad_format", "creative format", allowed=vocab.AD_FORMATS),
    string_field("objective", "campaign objective", allowed=vocab.AD_OBJECTIVES),
    string_field(
        "creative_category",
        "category the advertiser declared for the creative",
        allowed=vocab.CATEGORIES,
    ),
    time_field("created_at", "when the ad was created"),
    time_field("updated_at", "from when this row's values hold"),
)

CONTENT_FIELDS: Final[tuple[FieldSpec, ...]] = (
    int_field("content_id", "the organic content item", min_value=0),
    string_field("content_type", "kind of content", allowed=vocab.CONTENT_TYPES),
    string_field(
        "content_category", "category of the content", allowed=vocab.CATEGORIES
    ),
    time_field("created_at", "when the content was posted"),
)

USER_SCHEMA: Final = arrow_schema(USER_FIELDS, "user")
AD_SCHEMA: Final = arrow_schema(AD_FIELDS, "ad")
CONTENT_SCHEMA: Final = arrow_schema(CONTENT_FIELDS, "content")


def validate_user(record: Mapping[str, Any]) -> str | None:
    """The reason a user row is invalid, or None.

    Example:
        >>> validate_user({"user_id": 1, "age": 9})
        "field 'age' is 9, below the minimum 13"
    """
    return check_fields(USER_FIELDS, record)


def validate_ad(record: Mapping[str, Any]) -> str | None:
    """The reason an ad row is invalid, or None."""
    return check_fields(AD_FIELDS, record)


def validate_content(record: Mapping[str, Any]) -> str | None:
    """The reason a content row is invalid, or None."""
    return check_fields(CONTENT_FIELDS, record)
