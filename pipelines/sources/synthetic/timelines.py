"""Users' timelines: sessions of organic engagement and ad impressions.

Each user gets a number of sessions proportional to a heavy-tailed activity
rate. A session happens in one app (domain, drawn from the user's mix), at an
hour drawn from a diurnal profile, and has an *intent* topic drawn from the
user's interests: most of its organic events are about that topic, which is
what gives recent behaviour predictive power beyond long-term interests.
Impressions in the session pick an ad either by global popularity or
targeted at the user (topic = session intent or a long-term interest).

Everything is drawn per session or per event as whole arrays: sessions are
expanded to events with ``np.repeat`` and in-session times are a segmented
cumulative sum, so no Python code runs per event.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from features import vocab
from pipelines.sources.synthetic.params import (
    DAY_MS,
    HOUR_MS,
    K_TOPICS,
    GeneratorConfig,
)
from pipelines.sources.synthetic.sampling import IntArray, SegmentSampler, categorical
from pipelines.sources.synthetic.world import World

# Sessions started per UTC hour (relative): a night trough, a lunch bump and an
# evening peak around 20h.
DIURNAL = np.array(
    [0.9, 0.6, 0.4, 0.3, 0.3, 0.4, 0.7, 1.1, 1.4, 1.5, 1.5, 1.6,
     1.7, 1.6, 1.5, 1.5, 1.6, 1.8, 2.0, 2.2, 2.3, 2.2, 1.8, 1.3]
)  # fmt: skip

_S = vocab.SURFACES.index
# P(surface | domain) over vocab.SURFACES; zero where the domain lacks it.
SURFACE_GIVEN_DOMAIN = np.zeros((len(vocab.DOMAINS), len(vocab.SURFACES)))
for _d, _weights in enumerate(
    (
        {
            "feed": 0.55,
            "stories": 0.12,
            "reels": 0.15,
            "marketplace": 0.08,
            "video": 0.10,
        },
        {"feed": 0.45, "stories": 0.25, "reels": 0.20, "explore": 0.10},
        {"inbox": 0.35, "thread": 0.65},
    )
):
    for _name, _w in _weights.items():
        SURFACE_GIVEN_DOMAIN[_d, _S(_name)] = _w
# Reel ads and reel content are shown in the reels surface (where there is one).
REEL_ON_REELS = 0.8

_ORGANIC = tuple(vocab.ACTIONS.index(a) for a in vocab.ORGANIC_ACTIONS)
# P(organic action | domain) over vocab.ORGANIC_ACTIONS (view, like, comment,
# share, message): "message" exists only in messaging.
ORGANIC_ACTION_GIVEN_DOMAIN = np.array(
    [
        [0.78, 0.14, 0.04, 0.04, 0.00],  # facebook
        [0.74, 0.21, 0.03, 0.02, 0.00],  # instagram
        [0.30, 0.05, 0.00, 0.03, 0.62],  # messaging
    ]
)
IMPRESSION = vocab.ACTIONS.index("impression")

CodeArray = npt.NDArray[np.int8]


@dataclass(frozen=True)
class BaseEvents:
    """Organic events and impressions, one entry per event, session order.

    ``ad`` is -1 for organic events, ``content`` -1 for impressions; ``topic``
    is the latent topic (the content's category or the ad's true topic).
    """

    user: IntArray
    time_ms: IntArray
    domain: CodeArray  # index into vocab.DOMAINS
    surface: CodeArray  # index into vocab.SURFACES
    action: CodeArray  # index into vocab.ACTIONS
    ad: IntArray
    content: IntArray
    topic: CodeArray
    sessions: int

    @property
    def is_impression(self) -> npt.NDArray[np.bool_]:
        """Mask of ad impressions."""
        return np.asarray(self.action == IMPRESSION, dtype=np.bool_)


def generate_timelines(
    config: GeneratorConfig, world: World, rng: np.random.Generator
) -> BaseEvents:
    """Draw every user's sessions and their organic events and impressions.

    Args:
        config: sizes and coefficients.
        world: users, ads and contents.
        rng: the random stream.

    Returns:
        The base events (before clicks, conversions and duplicates).
    """
    interests = SegmentSampler.from_matrix(world.users.theta)
    sessions = _draw_sessions(config, world, interests, rng)
    ev_session, time_ms = _session_events(config, sessions, rng)
    n = ev_session.size
    user = sessions.user[ev_session]
    domain = sessions.domain[ev_session]
    intent = sessions.intent[ev_session]

    is_ad = rng.random(n) < np.asarray(config.params.ad_share)[domain]
    drawn = _Drawn(
        ad=np.full(n, -1, dtype=np.int64),
        content=np.full(n, -1, dtype=np.int64),
        topic=np.empty(n, dtype=np.int64),
        action=np.full(n, IMPRESSION, dtype=np.int64),
        is_reel=np.zeros(n, dtype=bool),
    )
    context = _Context(config, world, interests, user, domain, intent)
    _draw_organic(np.flatnonzero(~is_ad), drawn, context, rng)
    _draw_impressions(np.flatnonzero(is_ad), drawn, context, rng)
    surface = SegmentSampler.from_matrix(SURFACE_GIVEN_DOMAIN).sample(domain, rng)
    has_reels = SURFACE_GIVEN_DOMAIN[domain, _S("reels")] > 0
    to_reels = drawn.is_reel & has_reels & (rng.random(n) < REEL_ON_REELS)
    surface[to_reels] = _S("reels")

    # Codes are stored as int8: the assembly gathers every column in time
    # order, and random gathers of 1-byte arrays stay in cache.
    return BaseEvents(
        user=user,
        time_ms=time_ms,
        domain=domain.astype(np.int8),
        surface=surface.astype(np.int8),
        action=drawn.action.astype(np.int8),
        ad=drawn.ad,
        content=drawn.content,
        topic=drawn.topic.astype(np.int8),
        sessions=sessions.user.size,
    )


@dataclass(frozen=True)
class _Sessions:
    """Every user's sessions: whose, how many events, when, in which app and
    about which topic."""

    user: IntArray
    length: IntArray
    start_ms: IntArray
    domain: IntArray
    intent: IntArray


@dataclass(frozen=True)
class _Context:
    """What the per-event draws read: the run's settings and world, the
    users' interests, and each event's user, domain and session intent."""

    config: GeneratorConfig
    world: World
    interests: SegmentSampler
    user: IntArray
    domain: IntArray
    intent: IntArray


@dataclass(frozen=True)
class _Drawn:
    """Per event, what the organic and impression draws fill in."""

    ad: IntArray
    content: IntArray
    topic: IntArray
    action: IntArray
    is_reel: npt.NDArray[np.bool_]


def _draw_sessions(
    config: GeneratorConfig,
    world: World,
    interests: SegmentSampler,
    rng: np.random.Generator,
) -> _Sessions:
    """Sessions per user by activity, each with a length, a start (day and
    diurnal hour), a domain from the user's mix and an intent topic."""
    p, users = config.params, world.users
    expected = config.days * config.events_per_user_day * users.activity
    per_user = rng.poisson(expected / p.mean_session_events)
    s_user = np.repeat(np.arange(per_user.size, dtype=np.int64), per_user)
    n_sessions = s_user.size
    s_len = rng.geometric(1.0 / p.mean_session_events, n_sessions).astype(np.int64)
    s_start = (
        config.start_ms
        + rng.integers(0, config.days, n_sessions, dtype=np.int64) * DAY_MS
        + categorical(DIURNAL, n_sessions, rng) * HOUR_MS
        + rng.integers(0, HOUR_MS, n_sessions, dtype=np.int64)
    )
    cum_mix = np.cumsum(users.domain_mix, axis=1)[s_user]
    u = rng.random(n_sessions)
    s_domain = (u > cum_mix[:, 0]).astype(np.int64) + (u > cum_mix[:, 1])
    s_intent = interests.sample(s_user, rng)
    return _Sessions(s_user, s_len, s_start, s_domain, s_intent)


def _session_events(
    config: GeneratorConfig, sessions: _Sessions, rng: np.random.Generator
) -> tuple[IntArray, IntArray]:
    """Each event's session and time: in-session times are a segmented
    cumulative sum of gaps (the first gap is 0)."""
    s_len = sessions.length
    ev_session = np.repeat(np.arange(s_len.size, dtype=np.int64), s_len)
    gaps = 1 + rng.exponential(config.params.mean_gap_ms, ev_session.size).astype(
        np.int64
    )
    first = np.cumsum(s_len) - s_len  # index of each session's first event
    gaps[first] = 0
    elapsed = np.cumsum(gaps)
    offset = elapsed - np.repeat(elapsed[first], s_len)
    # A session that would run past the period end is moved earlier, so base
    # events stay inside the period and only clicks and conversions spill over
    # (by less than the conversion window).
    duration = offset[first + s_len - 1]
    s_start = sessions.start_ms - np.maximum(
        sessions.start_ms + duration - (config.end_ms - 1), 0
    )
    return ev_session, s_start[ev_session] + offset


def _draw_organic(
    org: IntArray, drawn: _Drawn, context: _Context, rng: np.random.Generator
) -> None:
    """Organic events ``org``: content of the session's intent topic, else of
    a long-term interest, and an action by domain."""
    org_topic = _intent_or_interest(
        context.intent[org],
        context.user[org],
        context.config.params.intent_stickiness,
        context.interests,
        rng,
    )
    content_group = np.where(
        context.world.content_sampler.nonempty[org_topic], org_topic, K_TOPICS
    )
    org_content = context.world.content_sampler.sample(content_group, rng)
    drawn.content[org] = org_content
    drawn.topic[org] = context.world.contents.category[org_content]
    action_pick = SegmentSampler.from_matrix(ORGANIC_ACTION_GIVEN_DOMAIN).sample(
        context.domain[org], rng
    )
    drawn.action[org] = np.asarray(_ORGANIC)[action_pick]
    drawn.is_reel[org] = context.world.contents.content_type[org_content] == (
        vocab.CONTENT_TYPES.index("reel")
    )


def _draw_impressions(
    imp: IntArray, drawn: _Drawn, context: _Context, rng: np.random.Generator
) -> None:
    """Impressions ``imp``: an ad targeted at the user (topic from the user)
    or picked by popularity (any topic)."""
    p = context.config.params
    imp_topic = _intent_or_interest(
        context.intent[imp],
        context.user[imp],
        p.targeted_intent_share,
        context.interests,
        rng,
    )
    targeted = rng.random(imp.size) < p.targeted_share
    base = context.domain[imp] * (K_TOPICS + 1)
    wanted = np.where(targeted, imp_topic, K_TOPICS)
    group = base + wanted
    group = np.where(context.world.ad_sampler.nonempty[group], group, base + K_TOPICS)
    imp_ad = context.world.ad_sampler.sample(group, rng)
    drawn.ad[imp] = imp_ad
    drawn.topic[imp] = context.world.ads.topic[imp_ad]
    drawn.is_reel[imp] = context.world.ads.ad_format[imp_ad] == vocab.AD_FORMATS.index(
        "reel"
    )


def _intent_or_interest(
    intent: IntArray,
    user: IntArray,
    p_intent: float,
    interests: SegmentSampler,
    rng: np.random.Generator,
) -> IntArray:
    """The session intent with probability ``p_intent``, else a fresh draw from
    the user's long-term interests (only drawn where needed)."""
    out = intent.copy()
    other = np.flatnonzero(rng.random(intent.size) >= p_intent)
    out[other] = interests.sample(user[other], rng)
    return out
