"""What users do with the ads they see: true probabilities and realised outcomes.

The click model is a logistic model whose terms are the signals a ranking
model should recover:

- a domain intercept and a format x domain effect (CTR differs by app and by
  how well a format fits it);
- long-term interest ``beta * theta_u[topic_a]``;
- recent behaviour ``gamma * log1p(n)``, with ``n`` the user's organic events
  about the ad's topic in the last ``recent_window_ms`` strictly before the
  impression. Sessions concentrate on an intent topic, so this term carries
  information ``theta_u`` does not: it is what a sequence model can learn and
  a bag-of-ids model cannot;
- latent ad quality, age bucket x topic and device x format effects, and an
  hour-of-day effect.

Conversions (post-click) have their own logistic model. The true
unconditional conversion probability of an impression is ``p_click *
p_cvr_given_click``; outcomes are sampled from exactly these probabilities,
which is what makes ``truth.parquet`` a Bayes-optimal predictor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from features.events import CLICK_WINDOW, CONVERSION_WINDOW
from pipelines.sources.synthetic.params import (
    DAY_MS,
    HOUR_MS,
    K_TOPICS,
    GeneratorConfig,
)
from pipelines.sources.synthetic.sampling import FloatArray, IntArray
from pipelines.sources.synthetic.timelines import BaseEvents
from pipelines.sources.synthetic.world import World

CLICK_WINDOW_MS = int(CLICK_WINDOW.total_seconds() * 1000)
CONVERSION_WINDOW_MS = int(CONVERSION_WINDOW.total_seconds() * 1000)

# Click effect of each ad format in each domain (rows vocab.AD_FORMATS,
# columns vocab.DOMAINS): reels do best on Instagram, click-to-message ads in
# Messenger and poorly elsewhere.
FORMAT_DOMAIN_CLICK = np.array(
    [
        [0.00, -0.10, -0.20],  # image
        [0.10, 0.10, -0.30],  # video
        [0.15, 0.00, -0.20],  # carousel
        [0.10, 0.30, -0.50],  # reel
        [-0.30, -0.40, 0.60],  # click_to_message
    ]
)

_MAX_RESAMPLE = 64


@dataclass(frozen=True)
class Outcomes:
    """Per impression (in base-event order): truth and realised outcomes.

    Attributes:
        impression: index of each impression among the base events.
        p_click: true click probability.
        p_cvr: true conversion probability given a click.
        recent: the user's recent same-topic organic events (the sequence
            signal), kept for diagnostics only.
        clicked, converted: realised outcomes (bool).
        click_ms: click time for clicked impressions (``clicked`` order).
        conversion_ms: conversion time for converted impressions.
    """

    impression: IntArray
    p_click: FloatArray
    p_cvr: FloatArray
    recent: IntArray
    clicked: np.ndarray
    converted: np.ndarray
    click_ms: IntArray
    conversion_ms: IntArray

    @property
    def p_conversion(self) -> FloatArray:
        """Unconditional conversion probability of each impression."""
        return self.p_click * self.p_cvr


def recent_topic_counts(
    events: BaseEvents, rows: IntArray, topics: IntArray, window_ms: int
) -> IntArray:
    """Organic events of the same user about ``topics`` in the window before.

    For row ``i``: the number of organic events of ``events.user[rows[i]]``
    about ``topics[i]`` with time in ``[t - window_ms, t)``, ``t`` being the
    row's time. Vectorized as two ``searchsorted`` calls on the sorted key
    ``(user, topic, time)`` packed into one int64.

    Args:
        events: the base events.
        rows: indices of the events to count for (impressions).
        topics: the topic to count per row.
        window_ms: window length.

    Returns:
        Counts, int64.
    """
    organic = np.flatnonzero(events.content >= 0)
    t0 = int(events.time_ms.min()) if events.time_ms.size else 0
    span = int(events.time_ms.max()) - t0 + 1 if events.time_ms.size else 1
    n_keys = (int(events.user.max()) + 1 if events.user.size else 1) * K_TOPICS
    if n_keys * span >= 2**62:
        raise OverflowError("too many users x period for packed int64 keys")
    topic = events.topic[organic].astype(np.int64)
    key = (events.user[organic] * K_TOPICS + topic) * span + (
        events.time_ms[organic] - t0
    )
    key.sort()
    t = events.time_ms[rows] - t0
    group = (events.user[rows] * K_TOPICS + topics) * span
    hi = np.searchsorted(key, group + t, side="left")  # strictly before t
    lo = np.searchsorted(key, group + np.maximum(t - window_ms, 0), side="left")
    return (hi - lo).astype(np.int64)


def simulate_outcomes(
    config: GeneratorConfig,
    world: World,
    events: BaseEvents,
    rng: np.random.Generator,
) -> Outcomes:
    """True probabilities, sampled outcomes and follow-up times per impression.

    Args:
        config: coefficients.
        world: users and ads (latent variables included).
        events: base events.
        rng: the random stream.

    Returns:
        The outcomes.
    """
    p, users, ads = config.params, world.users, world.ads
    imp = np.flatnonzero(events.is_impression)
    u, a = events.user[imp], events.ad[imp]
    d = events.domain[imp].astype(np.int64)
    t = events.time_ms[imp]
    topic, fmt = ads.topic[a], ads.ad_format[a]
    bucket = users.age_bucket[u]
    interest = users.theta[u, topic]
    recent = recent_topic_counts(events, imp, topic, p.recent_window_ms)
    hour = (t // HOUR_MS) % 24

    click_logit = (
        np.asarray(p.click_base_logit)[d]
        + FORMAT_DOMAIN_CLICK[fmt, d]
        + p.click_interest * interest
        + p.click_recent * np.log1p(recent)
        + p.click_quality * ads.quality[a]
        + world.click_age_category[bucket, topic]
        + world.click_device_format[users.device[u], fmt]
        + p.click_hour_amplitude * np.cos(2 * np.pi * (hour - 21) / 24)
    )
    cvr_logit = (
        np.asarray(p.cvr_base_logit)[d]
        + np.asarray(p.cvr_objective)[ads.objective[a]]
        + p.cvr_interest * interest
        + p.cvr_quality * ads.quality[a]
        + world.cvr_age_category[bucket, topic]
    )
    if any(p.base_logit_drift_per_day):  # off by default: no change at all
        drift = np.asarray(p.base_logit_drift_per_day)[d] * (
            (t - config.start_ms) / DAY_MS
        )
        click_logit = click_logit + drift
        cvr_logit = cvr_logit + drift
    p_click = _sigmoid(click_logit)
    p_cvr = _sigmoid(cvr_logit)
    # Both uniforms are drawn for every impression so the stream (and so every
    # later draw) does not depend on how many clicks happened.
    clicked = rng.random(imp.size) < p_click
    converted = clicked & (rng.random(imp.size) < p_cvr)

    # Delays, strictly inside the attribution windows (1 ms .. window - 1 ms).
    click_delay = _truncated_lognormal(
        p.click_delay_median_ms,
        p.click_delay_sigma,
        np.full(int(clicked.sum()), CLICK_WINDOW_MS - 1),
        rng,
    )
    click_ms = t[clicked] + click_delay
    delay_of_converted = click_delay[converted[clicked]]
    conversion_delay = _truncated_lognormal(
        p.conversion_delay_median_ms,
        p.conversion_delay_sigma,
        CONVERSION_WINDOW_MS - 1 - delay_of_converted,
        rng,
    )
    conversion_ms = t[converted] + delay_of_converted + conversion_delay
    return Outcomes(
        impression=imp,
        p_click=p_click,
        p_cvr=p_cvr,
        recent=recent,
        clicked=clicked,
        converted=converted,
        click_ms=click_ms,
        conversion_ms=conversion_ms,
    )


def _sigmoid(x: FloatArray) -> FloatArray:
    return 1.0 / (1.0 + np.exp(-x))


def _truncated_lognormal(
    median_ms: float, sigma: float, high: IntArray, rng: np.random.Generator
) -> IntArray:
    """Log-normal delays in whole ms, resampled until in ``[1, high]``.

    Resampling (rather than clipping) keeps the shape of the distribution
    inside the window instead of piling mass on its edge. Only the few
    out-of-range draws are redrawn each round; after ``_MAX_RESAMPLE`` rounds
    (practically never) the rest are clipped.
    """
    high = np.asarray(high, dtype=np.int64)
    mu = np.log(median_ms)
    out = np.rint(rng.lognormal(mu, sigma, high.size)).astype(np.int64)
    bad = np.flatnonzero((out < 1) | (out > high))
    for _ in range(_MAX_RESAMPLE):
        if bad.size == 0:
            break
        out[bad] = np.rint(rng.lognormal(mu, sigma, bad.size)).astype(np.int64)
        bad = bad[(out[bad] < 1) | (out[bad] > high[bad])]
    return np.clip(out, 1, np.maximum(high, 1))
