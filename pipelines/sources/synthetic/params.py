"""The knobs of the synthetic world: sizes (:class:`GeneratorConfig`) and the
behavioural model's coefficients (:class:`ModelParams`).

Sizes come from the CLI (:mod:`pipelines.sources.generator_arguments`);
coefficients have defaults chosen so that the data looks like ads logs (CTR
of a few percent, most events organic, a heavy tail of very active users)
*and* so that each signal a recommender is supposed to learn is strong
enough to be learnable at a few million events. Tests may override
coefficients (e.g. switch the sequence effect off) to check that an effect
is really caused by its term.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from features import vocab
from pipelines.sources.generator_arguments import GeneratorArguments

GENERATOR_VERSION = "synthetic-1.0.0"

DAY_MS = 86_400_000
HOUR_MS = 3_600_000

K_TOPICS = len(vocab.CATEGORIES)


@dataclass(frozen=True, kw_only=True)
class ModelParams:
    """Coefficients of the behavioural model (see each field's comment)."""

    # --- users -----------------------------------------------------------
    # Total Dirichlet concentration of interests; spread over topics in
    # proportion to topic popularity (mean alpha ~0.2: each user cares about a
    # handful of topics, which is what makes personalisation pay off).
    interest_concentration: float = 4.0
    # Log-normal sigma of per-user activity. 1.5 gives the heavy tail of real
    # logs: at 50k users the most active user has 100-200x the mean activity.
    activity_sigma: float = 1.5
    # Global domain weights and how tightly each user's mix clusters around
    # them (Dirichlet concentration): most users use every app, in their own mix.
    domain_weights: tuple[float, ...] = (0.5, 0.35, 0.15)
    domain_concentration: float = 4.0

    # --- catalogue --------------------------------------------------------
    topic_zipf: float = 0.8  # skew of topic popularity among ads and content
    ad_zipf: float = 1.0  # ad popularity
    content_zipf: float = 1.0  # content popularity
    advertiser_zipf: float = 0.7  # advertiser sizes: a few big ones, a long tail
    ads_per_advertiser: float = 9.0
    advertiser_topic_loyalty: float = 0.9  # ads share their advertiser's topic
    creative_category_accuracy: float = 0.85  # declared category = true topic
    ad_quality_sigma: float = 0.5  # latent creative quality (logit units)

    # --- timelines --------------------------------------------------------
    mean_session_events: float = 8.0  # geometric session length
    mean_gap_ms: float = 40_000.0  # exponential gap between events in a session
    # Share of a session's organic events about its intent topic (the rest
    # follow the user's long-term interests).
    intent_stickiness: float = 0.8
    # Share of base events that are ad impressions, per domain.
    ad_share: tuple[float, ...] = (0.32, 0.30, 0.22)
    # Impressions: probability the ad is targeted (topic drawn from the user)
    # rather than picked by global popularity; and, if targeted, probability
    # the topic is the session intent rather than a long-term interest.
    targeted_share: float = 0.6
    targeted_intent_share: float = 0.5

    # --- clicks -----------------------------------------------------------
    # Domain intercepts (logit); the effects below raise the realised CTR to
    # roughly 1.5% (facebook), 1.2% (instagram) and 3% (messaging).
    click_base_logit: tuple[float, ...] = (-6.15, -6.5, -5.7)
    click_interest: float = 2.5  # x theta_u[topic]: long-term interest
    # x log1p(organic events about the ad's topic in the last
    # `recent_window_ms`, strictly before the impression): the sequence signal.
    click_recent: float = 0.8
    recent_window_ms: int = HOUR_MS
    click_quality: float = 1.0  # x q_a
    click_demo_sigma: float = 0.35  # age bucket x category effects
    click_device_format_sigma: float = 0.2  # device x format effects
    click_hour_amplitude: float = 0.25  # evening peak (cosine, max at 21h UTC)

    # Drift (the freshness scenario; 0 = off, the default, which adds nothing
    # to any draw): per domain, logit units added to the click
    # and conversion intercepts per day since the start, so base rates move
    # over the days and a model frozen on early days goes out of calibration.
    base_logit_drift_per_day: tuple[float, ...] = (0.0, 0.0, 0.0)

    # --- conversions (given a click) --------------------------------------
    cvr_base_logit: tuple[float, ...] = (-3.4, -3.6, -3.0)
    # Per campaign objective (traffic, engagement, conversions, messages):
    # conversion-objective campaigns are optimised for it and convert most.
    cvr_objective: tuple[float, ...] = (-0.3, -0.6, 1.2, 0.3)
    cvr_interest: float = 1.5
    cvr_quality: float = 0.5
    cvr_demo_sigma: float = 0.3

    # --- delays (log-normal, milliseconds) -------------------------------
    click_delay_median_ms: float = 15_000.0
    click_delay_sigma: float = 1.3
    conversion_delay_median_ms: float = 2 * HOUR_MS
    conversion_delay_sigma: float = 1.4


@dataclass(frozen=True, kw_only=True)
class GeneratorConfig(GeneratorArguments):
    """What to generate: the CLI's arguments (sizes, period and seed:
    :class:`~pipelines.sources.generator_arguments.GeneratorArguments`) and the
    behavioural coefficients.

    Args:
        params: behavioural coefficients.
    """

    params: ModelParams = field(default_factory=ModelParams)

    @property
    def n_contents(self) -> int:
        """Organic content items (``contents`` or 5 x ads)."""
        return self.contents if self.contents is not None else 5 * self.ads

    @property
    def start_ms(self) -> int:
        """Epoch milliseconds of the period start (UTC midnight)."""
        start = dt.datetime.combine(self.start, dt.time(), tzinfo=dt.UTC)
        return int(start.timestamp()) * 1000

    @property
    def end_ms(self) -> int:
        """Epoch milliseconds of the period end (exclusive)."""
        return self.start_ms + self.days * DAY_MS
