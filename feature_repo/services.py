"""Feast feature services: what each model reads, versioned.

- ``gem_ranking_v1``: the GEM foundation model (the trainer): every view, the
  behaviour sequence included.
- ``vertical_ranking_v1``: the small vertical (student) models: profiles and
  counters, no sequence (they take the teacher's outputs instead).
- ``user_context_v1``: one user's profile, counters and sequence, the
  per-request user lookup at serving time.

Model features that are not in any view come with the request:
:data:`REQUEST_FEATURES` (the impression's context) and the entity keys.
"""

from __future__ import annotations

from typing import Final

from feast import FeatureService, FeatureView
from views import VIEWS

REQUEST_FEATURES: Final = ("domain", "surface", "hour_of_day")
"""Sparse features of the registry taken from the impression, not from Feast."""

_NON_SEQUENTIAL: Final = (
    "user_profile",
    "ad_profile",
    "user_counters",
    "ad_counters",
    "advertiser_counters",
)


def make_services(views: dict[str, FeatureView]) -> dict[str, FeatureService]:
    """Every feature service, by name, over the given views."""
    specs = {
        "gem_ranking_v1": (
            tuple(views),
            "GEM foundation model: all features, with the behaviour sequence",
        ),
        "vertical_ranking_v1": (
            _NON_SEQUENTIAL,
            "vertical (student) models: profiles and counters, no sequence",
        ),
        "user_context_v1": (
            ("user_profile", "user_counters", "user_sequence"),
            "one user's profile, counters and sequence (serving-time lookup)",
        ),
    }
    return {
        name: FeatureService(
            name=name,
            features=[views[v] for v in names],
            description=doc,
            tags={"contract": "features.registry"},
        )
        for name, (names, doc) in specs.items()
    }


SERVICES: Final = make_services(VIEWS)

gem_ranking_v1 = SERVICES["gem_ranking_v1"]
vertical_ranking_v1 = SERVICES["vertical_ranking_v1"]
user_context_v1 = SERVICES["user_context_v1"]
