"""What to generate (sizes, period, seed), importable without numpy or pyarrow.

:class:`GeneratorArguments` is the part of
:class:`pipelines.sources.synthetic.params.GeneratorConfig` that ``python -m
pipelines.generate`` takes as flags (the config adds the behavioural
coefficients); each field carries its default and, as
:func:`features.config_flags.flag` metadata, its help, so the command lists
its flags before the generator (numpy, pyarrow) loads.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import field

from features.config_flags import flag, flag_field, iso_date, positive_int


@dataclasses.dataclass(frozen=True, kw_only=True)
class GeneratorArguments:
    """Sizes, period and seed of a synthetic data set (the generator's
    manifest records them as its ``arguments``).

    Args:
        users: number of users.
        ads: number of ads.
        days: length of the period in days.
        seed: seed of ``numpy.random.default_rng``; same config, same events.
        start: first day of the period (UTC midnight).
        events_per_user_day: mean base events (organic + impressions) per user
            and day.
        contents: organic content items (default 5 x ads).
        duplicate_rate: probability that an event is logged twice.
    """

    users: int = field(metadata=flag("users in the world", type=positive_int))
    ads: int = field(metadata=flag("ads in the world", type=positive_int))
    days: int = field(metadata=flag("days of events", type=positive_int))
    seed: int = flag_field(0, "random seed: same seed, same data set")
    start: dt.date = flag_field(dt.date(2026, 10, 1), "first day (UTC)", type=iso_date)
    events_per_user_day: float = flag_field(10.0, "mean events per user and day")
    contents: int | None = flag_field(
        None, "organic content items (default 5 x ads)", type=positive_int
    )
    duplicate_rate: float = flag_field(
        0.002, "probability that an event is logged twice (same event_id)"
    )

    def __post_init__(self) -> None:
        if self.users < 1 or self.ads < 1 or self.days < 1:
            raise ValueError("users, ads and days must be at least 1")
        if self.contents is not None and self.contents < 1:
            raise ValueError("contents must be at least 1")
        if not 0.0 <= self.duplicate_rate < 1.0:
            raise ValueError("duplicate_rate must be in [0, 1)")
        if self.events_per_user_day <= 0:
            raise ValueError("events_per_user_day must be positive")
        if self.seed < 0:
            raise ValueError("seed must be non-negative")
