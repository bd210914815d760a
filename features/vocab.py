"""Closed vocabularies of the event contract.

Each vocabulary is an ordered tuple of strings. The position of a value is its
embedding id (0 is never used by a value: it is kept for "missing / padding"),
so vocabularies are **append-only**: reordering or removing a value changes the
ids every trained model and stored example refer to.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

DOMAINS: Final = ("facebook", "instagram", "messaging")

# Surfaces each domain serves. A surface name may appear in several domains
# ("feed"); the (domain, surface) pair is what validation checks.
SURFACES_BY_DOMAIN: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "facebook": ("feed", "stories", "reels", "marketplace", "video"),
        "instagram": ("feed", "stories", "reels", "explore"),
        "messaging": ("inbox", "thread"),
    }
)
SURFACES: Final = (
    "feed",
    "stories",
    "reels",
    "marketplace",
    "video",
    "explore",
    "inbox",
    "thread",
)

# Ad actions are about an ad (and carry its ids); organic actions are about a
# piece of content and carry no ad fields.
AD_ACTIONS: Final = ("impression", "click", "conversion")
ORGANIC_ACTIONS: Final = ("view", "like", "comment", "share", "message")
ACTIONS: Final = AD_ACTIONS + ORGANIC_ACTIONS

AD_FORMATS: Final = ("image", "video", "carousel", "reel", "click_to_message")
# The advertiser's campaign objective (a property of the ad), not to be confused
# with the training objectives (click, conversion) the model predicts.
AD_OBJECTIVES: Final = ("traffic", "engagement", "conversions", "messages")
# Training objectives: one label column and one head per (domain, objective).
TRAINING_OBJECTIVES: Final = ("click", "conversion")

GENDERS: Final = ("female", "male", "unknown")
DEVICES: Final = ("ios", "android", "web", "other")
CONTENT_TYPES: Final = ("photo", "video", "text", "reel", "message")

# Creative / content categories. The generator's latent topics are these
# categories; an ad's *declared* creative category is a noisy view of its topic.
CATEGORIES: Final = (
    "apparel",
    "beauty",
    "travel",
    "food",
    "gaming",
    "finance",
    "auto",
    "home",
    "fitness",
    "tech",
    "entertainment",
    "education",
    "pets",
    "sports",
    "music",
    "parenting",
    "health",
    "real_estate",
    "jobs",
    "local_business",
)

# Age buckets (lower bounds, years). Bucket id = 1 + index of the last bound <= age.
AGE_BUCKET_BOUNDS: Final = (13, 18, 25, 35, 45, 55, 65)
MIN_AGE: Final = 13
MAX_AGE: Final = 120


def vocabulary_ids(values: tuple[str, ...]) -> Mapping[str, int]:
    """Map each value of a vocabulary to its embedding id (1-based; 0 = missing).

    Example:
        >>> vocabulary_ids(("a", "b"))["b"]
        2
    """
    return MappingProxyType({value: i + 1 for i, value in enumerate(values)})


def age_bucket(age: int) -> int:
    """Bucket id of an age in years (1-based; 0 = missing or below the minimum).

    Example:
        >>> age_bucket(30), age_bucket(70), age_bucket(5)
        (3, 7, 0)
    """
    bucket = 0
    for i, bound in enumerate(AGE_BUCKET_BOUNDS):
        if age >= bound:
            bucket = i + 1
    return bucket
