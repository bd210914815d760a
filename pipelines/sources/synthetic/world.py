"""The synthetic world: users, ads and organic content, with their latent truth.

Everything observable here ends up in the dimension tables (``users.parquet``,
``ads.parquet``, ``contents.parquet``); the latent variables (interest vectors,
domain mixes, activity rates, ad topics and qualities, popularities) stay in
memory and only drive behaviour. An ad's *declared* creative category is a
noisy copy of its latent topic, as advertiser-declared metadata is in reality,
so a model cannot read the topic off the ad table for free.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from features import vocab
from features.dimensions import AD_SCHEMA, CONTENT_SCHEMA, USER_SCHEMA
from pipelines.sources.synthetic.params import (
    DAY_MS,
    HOUR_MS,
    K_TOPICS,
    GeneratorConfig,
)
from pipelines.sources.synthetic.sampling import (
    FloatArray,
    IntArray,
    SegmentSampler,
    categorical,
    zipf_weights,
)

# Countries roughly in order of social-app user base; their Zipf weights make a
# few countries dominate, as in real traffic. Ten regions each, also skewed.
COUNTRIES = (
    "IN", "US", "ID", "BR", "MX", "PH", "VN", "BD", "NG", "TH",
    "EG", "PK", "TR", "GB", "FR", "DE", "CO", "IT", "AR", "JP",
    "ES", "MY", "CA", "PE", "ZA", "SA", "KR", "PL", "AU", "NL",
)  # fmt: skip
REGIONS_PER_COUNTRY = 10

GENDER_P = (0.49, 0.46, 0.05)  # female, male, unknown
DEVICE_P = (0.38, 0.47, 0.10, 0.05)  # ios, android, web, other
OBJECTIVE_P = (0.30, 0.25, 0.30, 0.15)  # traffic, engagement, conversions, messages
CONTENT_TYPE_P = (0.35, 0.20, 0.15, 0.20, 0.10)  # photo, video, text, reel, message

# P(ad format | campaign objective); rows follow vocab.AD_OBJECTIVES, columns
# vocab.AD_FORMATS. Message campaigns are nearly all click-to-message ads, so
# format and objective are strongly (not perfectly) correlated.
FORMAT_GIVEN_OBJECTIVE = np.array(
    [
        [0.35, 0.20, 0.25, 0.17, 0.03],  # traffic
        [0.25, 0.30, 0.10, 0.32, 0.03],  # engagement
        [0.30, 0.20, 0.35, 0.12, 0.03],  # conversions
        [0.08, 0.05, 0.04, 0.03, 0.80],  # messages
    ]
)

# How much each domain serves each format (multiplies ad popularity when an ad
# is picked). Reels belong to Instagram and Facebook's reels, click-to-message
# ads to Messenger; rows follow vocab.DOMAINS, columns vocab.AD_FORMATS.
FORMAT_WEIGHT_BY_DOMAIN = np.array(
    [
        [1.0, 1.0, 1.0, 0.7, 0.3],  # facebook
        [1.0, 1.0, 0.8, 1.6, 0.2],  # instagram
        [0.6, 0.3, 0.3, 0.05, 3.0],  # messaging
    ]
)


@dataclass(frozen=True)
class Users:
    """Users: observable attributes and latent behaviour drivers."""

    age: IntArray
    gender: IntArray  # index into vocab.GENDERS
    location: IntArray  # country * REGIONS_PER_COUNTRY + region
    device: IntArray  # index into vocab.DEVICES
    signup_ms: IntArray
    updated_ms: IntArray
    theta: FloatArray  # (U, K) interests over topics (latent)
    domain_mix: FloatArray  # (U, 3) share of activity per domain (latent)
    activity: FloatArray  # relative activity rate, mean 1 (latent)

    @property
    def age_bucket(self) -> IntArray:
        """Vocabulary age bucket (1-based) of each user, as features see it."""
        bounds = np.asarray(vocab.AGE_BUCKET_BOUNDS)
        return np.searchsorted(bounds, self.age, side="right").astype(np.int64)


@dataclass(frozen=True)
class Ads:
    """Ads: observable attributes and latent topic, quality and popularity."""

    advertiser: IntArray
    campaign: IntArray
    ad_format: IntArray  # index into vocab.AD_FORMATS
    objective: IntArray  # index into vocab.AD_OBJECTIVES
    creative_category: IntArray  # declared (noisy) category
    created_ms: IntArray
    updated_ms: IntArray
    topic: IntArray  # latent
    quality: FloatArray  # latent, logit units
    popularity: FloatArray  # latent, sums to 1


@dataclass(frozen=True)
class Contents:
    """Organic content: category (= its topic), type and popularity."""

    category: IntArray
    content_type: IntArray
    created_ms: IntArray
    popularity: FloatArray


@dataclass(frozen=True)
class World:
    """Everything the timelines are generated from."""

    users: Users
    ads: Ads
    contents: Contents
    topic_popularity: FloatArray
    ad_sampler: SegmentSampler  # groups: domain * (K + 1) + topic (K = any)
    content_sampler: SegmentSampler  # groups: topic (K = any)
    # Demographic effects the outcome model adds (drawn once per world).
    click_age_category: FloatArray  # (buckets, K)
    click_device_format: FloatArray  # (devices, formats)
    cvr_age_category: FloatArray  # (buckets, K)


def build_world(config: GeneratorConfig, rng: np.random.Generator) -> World:
    """Draw users, ads, contents and the demographic effects.

    Args:
        config: sizes and coefficients.
        rng: the generator's random stream (consumed in a fixed order).

    Returns:
        The world.
    """
    p = config.params
    topic_popularity = zipf_weights(K_TOPICS, p.topic_zipf, rng)
    users = _build_users(config, topic_popularity, rng)
    ads = _build_ads(config, topic_popularity, rng)
    contents = _build_contents(config, topic_popularity, rng)
    n_buckets = len(vocab.AGE_BUCKET_BOUNDS) + 1
    return World(
        users=users,
        ads=ads,
        contents=contents,
        topic_popularity=topic_popularity,
        ad_sampler=_ad_sampler(ads),
        content_sampler=_content_sampler(contents),
        click_age_category=rng.normal(0, p.click_demo_sigma, (n_buckets, K_TOPICS)),
        click_device_format=rng.normal(
            0, p.click_device_format_sigma, (len(vocab.DEVICES), len(vocab.AD_FORMATS))
        ),
        cvr_age_category=rng.normal(0, p.cvr_demo_sigma, (n_buckets, K_TOPICS)),
    )


def _before(
    start_ms: int, low_ms: int, high_ms: int, n: int, rng: np.random.Generator
) -> IntArray:
    """``n`` times uniformly between ``high_ms`` and ``low_ms`` before start."""
    return start_ms - rng.integers(low_ms, high_ms, n, dtype=np.int64)


def _updated(created: IntArray, start_ms: int, rng: np.random.Generator) -> IntArray:
    """A last-update time between creation and the period start."""
    span = (start_ms - created).astype(np.float64)
    return created + (rng.random(created.size) * span).astype(np.int64)


def _build_users(
    config: GeneratorConfig, topic_popularity: FloatArray, rng: np.random.Generator
) -> Users:
    p, n = config.params, config.users
    # Ages: 13 + Gamma skews young with a long tail to the elderly (median ~31).
    age = np.clip(13 + rng.gamma(2.0, 11.0, n), 13, 90).astype(np.int64)
    gender = categorical(GENDER_P, n, rng)
    country = categorical(
        1.0 / np.arange(1, len(COUNTRIES) + 1, dtype=np.float64), n, rng
    )
    region = categorical(
        1.0 / np.arange(1, REGIONS_PER_COUNTRY + 1, dtype=np.float64) ** 0.7, n, rng
    )
    device = categorical(DEVICE_P, n, rng)
    signup = _before(config.start_ms, 30 * DAY_MS, 12 * 365 * DAY_MS, n, rng)
    updated = _updated(signup, config.start_ms, rng)
    theta = rng.dirichlet(p.interest_concentration * topic_popularity, n)
    # Tiny alphas can underflow whole rows to ~0; a floor keeps every row a
    # proper distribution without changing its shape measurably.
    theta = np.maximum(theta, 1e-12)
    theta /= theta.sum(axis=1, keepdims=True)
    domain_mix = rng.dirichlet(
        p.domain_concentration * np.asarray(p.domain_weights) * len(p.domain_weights),
        n,
    )
    # Log-normal activity normalised to mean 1: the heavy tail of power users.
    activity = rng.lognormal(0.0, p.activity_sigma, n)
    activity /= np.exp(p.activity_sigma**2 / 2)
    return Users(
        age=age,
        gender=gender,
        location=country * REGIONS_PER_COUNTRY + region,
        device=device,
        signup_ms=signup,
        updated_ms=updated,
        theta=theta,
        domain_mix=domain_mix,
        activity=activity,
    )


def _build_ads(
    config: GeneratorConfig, topic_popularity: FloatArray, rng: np.random.Generator
) -> Ads:
    p, n = config.params, config.ads
    n_adv = max(1, min(n, round(n / p.ads_per_advertiser)))
    # Every advertiser runs at least one ad; the rest follow Zipf sizes.
    advertiser = np.concatenate(
        [
            rng.permutation(n_adv),
            categorical(zipf_weights(n_adv, p.advertiser_zipf, rng), n - n_adv, rng),
        ]
    )
    advertiser = advertiser[rng.permutation(n)]
    # Advertisers specialise: their ads mostly share one topic.
    adv_topic = categorical(topic_popularity, n_adv, rng)
    own = rng.random(n) < p.advertiser_topic_loyalty
    topic = np.where(own, adv_topic[advertiser], categorical(topic_popularity, n, rng))
    # Campaigns: ~one per four ads of the advertiser; the objective belongs to
    # the campaign, and the creative format follows the objective.
    ads_of_adv = np.bincount(advertiser, minlength=n_adv)
    campaigns_of_adv = 1 + ads_of_adv // 4
    first_campaign = np.concatenate([[0], np.cumsum(campaigns_of_adv)[:-1]])
    local = (rng.random(n) * campaigns_of_adv[advertiser]).astype(np.int64)
    campaign = first_campaign[advertiser] + local
    campaign_objective = categorical(OBJECTIVE_P, int(campaigns_of_adv.sum()), rng)
    objective = campaign_objective[campaign]
    ad_format = SegmentSampler.from_matrix(FORMAT_GIVEN_OBJECTIVE).sample(
        objective, rng
    )
    accurate = rng.random(n) < p.creative_category_accuracy
    creative_category = np.where(accurate, topic, rng.integers(0, K_TOPICS, n))
    created = _before(config.start_ms, HOUR_MS, 60 * DAY_MS, n, rng)
    return Ads(
        advertiser=advertiser,
        campaign=campaign,
        ad_format=ad_format,
        objective=objective,
        creative_category=creative_category,
        created_ms=created,
        updated_ms=_updated(created, config.start_ms, rng),
        topic=topic,
        quality=rng.normal(0.0, p.ad_quality_sigma, n),
        popularity=zipf_weights(n, p.ad_zipf, rng),
    )


def _build_contents(
    config: GeneratorConfig, topic_popularity: FloatArray, rng: np.random.Generator
) -> Contents:
    p, n = config.params, config.n_contents
    return Contents(
        category=categorical(topic_popularity, n, rng),
        content_type=categorical(CONTENT_TYPE_P, n, rng),
        created_ms=_before(config.start_ms, HOUR_MS, 30 * DAY_MS, n, rng),
        popularity=zipf_weights(n, p.content_zipf, rng),
    )


def _ad_sampler(ads: Ads) -> SegmentSampler:
    """Ads by (domain, topic) and by domain alone (topic index K = "any").

    Weight = popularity x how much the domain serves the ad's format.
    """
    n, n_dom = ads.topic.size, len(vocab.DOMAINS)
    ids = np.arange(n, dtype=np.int64)
    groups, weights, items = [], [], []
    for d in range(n_dom):  # 3 domains x 2 views: a loop over groups, not events
        w = ads.popularity * FORMAT_WEIGHT_BY_DOMAIN[d, ads.ad_format]
        base = d * (K_TOPICS + 1)
        groups += [base + ads.topic, np.full(n, base + K_TOPICS)]
        weights += [w, w]
        items += [ids, ids]
    return SegmentSampler.build(
        np.concatenate(groups),
        np.concatenate(weights),
        n_dom * (K_TOPICS + 1),
        item_ids=np.concatenate(items),
    )


def _content_sampler(contents: Contents) -> SegmentSampler:
    """Contents by topic, plus group K = any topic (for topics with none)."""
    n = contents.category.size
    return SegmentSampler.build(
        np.concatenate([contents.category, np.full(n, K_TOPICS)]),
        np.concatenate([contents.popularity, contents.popularity]),
        K_TOPICS + 1,
        item_ids=np.concatenate([np.arange(n), np.arange(n)]),
    )


def _dimension_table(schema: pa.Schema, *columns: pa.Array) -> pa.Table:
    """A dimension table of ``schema``: the ids ``0..n-1``, then ``columns``."""
    ids = pa.array(np.arange(len(columns[0]), dtype=np.int64))
    return pa.Table.from_arrays([ids, *columns], schema=schema)


def _strings(values: tuple[str, ...], codes: npt.ArrayLike) -> pa.Array:
    """Arrow strings from vocabulary codes (one vectorized take)."""
    return pa.array(values, pa.string()).take(pa.array(codes))


def _times(ms: IntArray) -> pa.Array:
    return pa.array(ms, pa.int64()).cast(pa.timestamp("ms", tz="UTC"))


LOCATIONS = tuple(
    f"{country}-{region + 1:02d}"
    for country in COUNTRIES
    for region in range(REGIONS_PER_COUNTRY)
)


def users_table(users: Users) -> pa.Table:
    """The observable user dimension table (USER_SCHEMA)."""
    return _dimension_table(
        USER_SCHEMA,
        pa.array(users.age),
        _strings(vocab.GENDERS, users.gender),
        _strings(LOCATIONS, users.location),
        _strings(vocab.DEVICES, users.device),
        _times(users.signup_ms),
        _times(users.updated_ms),
    )


def ads_table(ads: Ads) -> pa.Table:
    """The observable ad dimension table (AD_SCHEMA); no latent columns."""
    return _dimension_table(
        AD_SCHEMA,
        pa.array(ads.advertiser.astype(np.int64)),
        pa.array(ads.campaign.astype(np.int64)),
        _strings(vocab.AD_FORMATS, ads.ad_format),
        _strings(vocab.AD_OBJECTIVES, ads.objective),
        _strings(vocab.CATEGORIES, ads.creative_category),
        _times(ads.created_ms),
        _times(ads.updated_ms),
    )


def contents_table(contents: Contents) -> pa.Table:
    """The organic content dimension table (CONTENT_SCHEMA)."""
    return _dimension_table(
        CONTENT_SCHEMA,
        _strings(vocab.CONTENT_TYPES, contents.content_type),
        _strings(vocab.CATEGORIES, contents.category),
        _times(contents.created_ms),
    )
