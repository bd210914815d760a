"""Convert MovieLens (ml-100k or ml-1m) into the project's event and dimension files.

Usage::

    python -m pipelines.movielens --source ML_DIR --output DIR

The source layout (ml-100k or ml-1m) is detected from its files
(:mod:`pipelines.sources.movielens_files`). The outputs are the same as the
synthetic generator's:

- ``DIR/events/date=YYYY-MM-DD/part-0.parquet``: events in
  :data:`features.events.EVENT_SCHEMA`, one hive partition per UTC day of
  ``event_time``, rows sorted by (event_time, user, movie, action);
- ``DIR/users.parquet`` (:data:`~features.dimensions.USER_SCHEMA`),
  ``DIR/ads.parquet`` (:data:`~features.dimensions.AD_SCHEMA`) and
  ``DIR/contents.parquet`` (:data:`~features.dimensions.CONTENT_SCHEMA`, empty:
  MovieLens has no organic content);
- ``DIR/manifest.json``: source, layout, counts per (domain, action) and the
  mapping choices below.

The reading (one reasonable reading of the MovieLens files)
-----------------------------------------------------------

Events. Each rating is an ad **impression** of the movie (``ad_id`` = movie
id) to the user at the rating's timestamp, with ``event_id`` ``ml-<user>-<movie>``
(unique: MovieLens has one rating per user and movie). A rating >= 4 is the
positive outcome: it also emits a **click** one second later
(``ml-<user>-<movie>-click``) and a **conversion** two seconds later
(``ml-<user>-<movie>-conversion``), both attributed to the impression
(``impression_id``) and carrying its ad fields, domain and surface; both delays
lie inside :data:`~features.events.CLICK_WINDOW` and
:data:`~features.events.CONVERSION_WINDOW`. Ratings 1-3 are negatives (an
impression alone). Click and conversion labels therefore **coincide** on
MovieLens, so per-objective numbers (click vs conversion heads) are equal there
by construction.

Domains and surfaces. MovieLens has none, so each (user, movie) pair gets one
by a seedless, reproducible hash: ``h = splitmix64((user_id << 32) | movie_id)``;
the top 53 bits of ``h`` as a uniform number ``u`` in [0, 1) give the domain
(``u < 0.50`` facebook, ``u < 0.85`` instagram, else messaging: 50/35/15 %),
and ``splitmix64(h) mod k`` picks one of the domain's ``k`` surfaces
(:data:`features.vocab.SURFACES_BY_DOMAIN`, uniformly). The assignment ignores
the data entirely, so **numbers measured on it say nothing about cross-domain
transfer**; it only exercises the multi-domain machinery on real interactions.

Ads (one row per movie of ``u.item`` / ``movies.dat``, rated or not):

- ``advertiser_id``: index of the movie's first genre in the stable genre order
  of ``u.genre`` (:data:`GENRES`: unknown=0, Action=1, ..., Western=18; the 1m
  list is the same order without "unknown"). A movie without a recognised
  genre gets 0 ("unknown").
- ``campaign_id``: release year (100k: from the release date, else the
  ``(YYYY)`` of the title; 1m: the ``(YYYY)`` at the end of the title); 0 when
  unknown.
- ``ad_format`` = "video", ``objective`` = "conversions" for every movie.
- ``creative_category``: :data:`GENRE_CATEGORY` maps each genre onto
  :data:`features.vocab.CATEGORIES` (Children's -> parenting, Documentary ->
  education, Musical -> music, everything else -> entertainment); a movie takes
  the category of its first genre (in :data:`GENRES` order) that does not map to
  "entertainment", else "entertainment".
- ``created_at`` = ``updated_at``: the release date (100k: ``dd-Mon-yyyy``;
  1m: January 1st of the title year, the only date it has), or the movie's
  first rating when unknown (or the data's first rating for a movie nobody
  rated). A release date *after* the movie's first rating (24 movies in 100k
  were rated before their listed release) is moved back to that first rating,
  so that every impression finds its ad row in a point-in-time join on
  ``updated_at``. Dimension times before 1995 are fine (only event times are
  bounded below).

Users (one row per user with at least one rating; 1m-dev's users.dat lists
6,040 users but only users 1-2999 have ratings there):

- ``age``: 100k exact years; 1m the age-bucket code itself (1, 18, 25, 35, 45,
  50, 56: each bucket's lower bound). Both are clipped into the contract's
  [13, 120], so 1m code 1 ("Under 18") becomes 13, and the few 100k users
  younger than 13 become 13.
- ``gender``: M -> "male", F -> "female", anything else -> "unknown".
- ``location``: "US-" + the first three digits of the zip code (the US
  sectional centre), "US-unk" when those are not digits (Canadian postal
  codes in 100k).
- ``device`` = "other" (MovieLens records none); occupation is dropped (not in
  the contract).
- ``signup_time`` = ``updated_at`` = the user's first rating.

The conversion is vectorized (numpy / pandas / pyarrow; no per-rating Python
loop) and every event table is checked with
:func:`features.event_table.validate_event_table` before anything is written.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features import vocab
from features.dimensions import AD_SCHEMA, CONTENT_SCHEMA, USER_SCHEMA
from features.event_table import validate_event_table
from features.events import EVENT_SCHEMA, SCHEMA_VERSION
from pipelines.sources.movielens_files import (
    GENRES,
    Ratings,
    detect_layout,
    read_movies,
    read_ratings,
    read_users,
)

DEFAULT_CATEGORY: Final = "entertainment"
GENRE_CATEGORY: Final[Mapping[str, str]] = {
    **{genre: DEFAULT_CATEGORY for genre in GENRES},
    "Children's": "parenting",
    "Documentary": "education",
    "Musical": "music",
}
"""Each MovieLens genre's creative category (a value of vocab.CATEGORIES)."""

POSITIVE_RATING: Final = 4
CLICK_DELAY_MS: Final = 1_000
CONVERSION_DELAY_MS: Final = 2_000

DOMAIN_SHARES: Final[Mapping[str, float]] = {
    "facebook": 0.50,
    "instagram": 0.35,
    "messaging": 0.15,
}
AD_FORMAT: Final = "video"
AD_OBJECTIVE: Final = "conversions"
DEVICE: Final = "other"
UNKNOWN_LOCATION: Final = "US-unk"

_MS_PER_DAY: Final = 86_400_000
_ACTIONS: Final = ("impression", "click", "conversion")


@dataclass(frozen=True)
class Converted:
    """Everything one conversion produces, before it is written."""

    events: pa.Table
    users: pa.Table
    ads: pa.Table
    contents: pa.Table
    manifest: dict[str, Any]


# --------------------------------------------------------------------------
# The reading


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on a uint64 array (wrapping arithmetic).

    Example:
        >>> int(splitmix64(np.array([0], dtype=np.uint64))[0])
        16294208416658607535
    """
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def assign_domains(
    user_id: np.ndarray, movie_id: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Domain codes (into vocab.DOMAINS) and surface codes (into vocab.SURFACES).

    Seedless and reproducible: a function of (user_id, movie_id) only (see the
    module docstring).
    """
    key = (user_id.astype(np.uint64) << np.uint64(32)) | movie_id.astype(np.uint64)
    h = splitmix64(key)
    uniform = (h >> np.uint64(11)).astype(np.float64) * 2.0**-53
    bounds = np.cumsum([DOMAIN_SHARES[d] for d in vocab.DOMAINS])[:-1]
    domain = np.searchsorted(bounds, uniform, side="right").astype(np.int64)
    per_domain = [vocab.SURFACES_BY_DOMAIN[d] for d in vocab.DOMAINS]
    n_surfaces = np.array([len(s) for s in per_domain], dtype=np.uint64)
    pick = (splitmix64(h) % n_surfaces[domain]).astype(np.int64)
    # Surface code = position in vocab.SURFACES of the domain's pick-th surface.
    width = max(len(s) for s in per_domain)
    table = np.zeros((len(per_domain), width), dtype=np.int64)
    for d, surfaces in enumerate(per_domain):
        table[d, : len(surfaces)] = [vocab.SURFACES.index(s) for s in surfaces]
    return domain, table[domain, pick]


def build_ads(movies: pd.DataFrame, ratings: Ratings) -> pa.Table:
    """The ads table (see the module docstring), sorted by ad_id."""
    flags = movies[list(GENRES)].to_numpy(np.int8) > 0
    advertiser = np.where(flags.any(axis=1), flags.argmax(axis=1), 0)
    categories = np.array([GENRE_CATEGORY[g] for g in GENRES], dtype=object)
    special = flags & (categories != DEFAULT_CATEGORY)[None, :]
    category = np.where(
        special.any(axis=1), categories[special.argmax(axis=1)], DEFAULT_CATEGORY
    )
    movie_id = movies["movie_id"].to_numpy(np.int64)
    first_ms = _first_time_ms(ratings.movie_id, ratings.time_s, movie_id)
    data_start_ms = int(ratings.time_s.min()) * 1000 if len(ratings.time_s) else 0
    release = movies["release_ms"].to_numpy(np.float64)
    created = np.where(
        np.isnan(release),
        np.where(first_ms >= 0, first_ms, data_start_ms),
        release,
    ).astype(np.int64)
    rated = first_ms >= 0
    created = np.where(rated, np.minimum(created, first_ms), created)
    order = np.argsort(movie_id, kind="stable")
    created_arr = pa.array(created[order], EVENT_SCHEMA.field("event_time").type)
    n = len(movie_id)
    return pa.Table.from_arrays(
        [
            pa.array(movie_id[order], pa.int64()),
            pa.array(advertiser[order].astype(np.int64), pa.int64()),
            pa.array(movies["year"].to_numpy(np.int64)[order], pa.int64()),
            pa.array([AD_FORMAT] * n, pa.string()),
            pa.array([AD_OBJECTIVE] * n, pa.string()),
            pa.array(category[order].tolist(), pa.string()),
            created_arr,
            created_arr,
        ],
        schema=AD_SCHEMA,
    )


def _first_time_ms(
    ids: np.ndarray, time_s: np.ndarray, wanted: np.ndarray
) -> np.ndarray:
    """Earliest time (epoch ms) per id of ``wanted``; -1 for ids never seen."""
    first = pd.Series(time_s).groupby(ids).min() * 1000
    result: np.ndarray = first.reindex(wanted).fillna(-1).to_numpy(np.int64)
    return result


def build_users(users: pd.DataFrame, ratings: Ratings) -> pa.Table:
    """The users table for users with at least one rating, sorted by user_id."""
    rated_ids = np.unique(ratings.user_id)
    users = users.set_index("user_id")
    missing = np.setdiff1d(rated_ids, users.index.to_numpy())
    if len(missing):
        raise ValueError(
            f"{len(missing)} rated user id(s) missing from the user file, "
            f"e.g. {missing[:5].tolist()}"
        )
    rows = users.loc[rated_ids]
    age = np.clip(rows["age"].to_numpy(np.int64), vocab.MIN_AGE, vocab.MAX_AGE)
    gender = rows["gender"].map({"M": "male", "F": "female"}).fillna("unknown")
    prefix = rows["zip"].str.slice(0, 3)
    location = np.where(
        prefix.str.fullmatch(r"\d{3}"), "US-" + prefix, UNKNOWN_LOCATION
    )
    first_ms = _first_time_ms(ratings.user_id, ratings.time_s, rated_ids)
    times = pa.array(first_ms, EVENT_SCHEMA.field("event_time").type)
    return pa.Table.from_arrays(
        [
            pa.array(rated_ids, pa.int64()),
            pa.array(age, pa.int64()),
            pa.array(gender.tolist(), pa.string()),
            pa.array(location.tolist(), pa.string()),
            pa.array([DEVICE] * len(rated_ids), pa.string()),
            times,
            times,
        ],
        schema=USER_SCHEMA,
    )


def build_events(ratings: Ratings, ads: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """The event table and the counts per (domain, action) (3 x 3 int array).

    Rows are sorted by (event_time, user_id, ad_id, action) so the output does
    not depend on the order of the source file.
    """
    ad_ids = ads.column("ad_id").to_numpy()
    index = pd.Index(ad_ids)
    row = index.get_indexer(ratings.movie_id)
    if (row < 0).any():
        unknown = np.unique(ratings.movie_id[row < 0])
        raise ValueError(
            f"{len(unknown)} rated movie id(s) missing from the movie file, "
            f"e.g. {unknown[:5].tolist()}"
        )
    domain, surface = assign_domains(ratings.user_id, ratings.movie_id)
    pos = np.flatnonzero(ratings.rating >= POSITIVE_RATING)
    n, p = len(ratings.user_id), len(pos)
    # Impressions, then clicks, then conversions (before sorting).
    source = np.concatenate([np.arange(n), pos, pos])
    action = np.repeat(np.arange(3, dtype=np.int64), [n, p, p])
    delay = np.array([0, CLICK_DELAY_MS, CONVERSION_DELAY_MS], dtype=np.int64)
    time_ms = ratings.time_s[source] * 1000 + delay[action]
    user = ratings.user_id[source]
    movie = ratings.movie_id[source]
    order = np.lexsort((action, movie, user, time_ms))
    source, action, time_ms = source[order], action[order], time_ms[order]
    user, movie = user[order], movie[order]
    dom, surf, ad_row = domain[source], surface[source], row[source]

    counts = np.bincount(dom * 3 + action, minlength=9).reshape(3, 3)

    user_str = pc.cast(pa.array(user, pa.int64()), pa.string())
    movie_str = pc.cast(pa.array(movie, pa.int64()), pa.string())
    impression_id = pc.binary_join_element_wise("ml", user_str, movie_str, "-")
    suffix = pa.array(["", "-click", "-conversion"]).take(pa.array(action))
    event_id = pc.binary_join_element_wise(impression_id, suffix, "")
    impression_ref = pc.if_else(
        pa.array(action > 0), impression_id, pa.scalar(None, pa.string())
    )
    total = len(source)
    ad_rows = pa.array(ad_row)
    return (
        pa.Table.from_arrays(
            [
                pa.array(np.full(total, SCHEMA_VERSION, dtype=np.int16), pa.int16()),
                event_id,
                pa.array(time_ms, EVENT_SCHEMA.field("event_time").type),
                pa.array(user, pa.int64()),
                pa.array(vocab.DOMAINS).take(pa.array(dom)),
                pa.array(vocab.SURFACES).take(pa.array(surf)),
                pa.array(_ACTIONS).take(pa.array(action)),
                pa.array(movie, pa.int64()),
                ads.column("advertiser_id").take(ad_rows).combine_chunks(),
                ads.column("campaign_id").take(ad_rows).combine_chunks(),
                ads.column("ad_format").take(ad_rows).combine_chunks(),
                ads.column("objective").take(ad_rows).combine_chunks(),
                impression_ref,
                pa.nulls(total, pa.int64()),
            ],
            schema=EVENT_SCHEMA,
        ),
        counts,
    )


def convert(source: Path, *, now: int | None = None) -> Converted:
    """Read a MovieLens directory and build every output table and the manifest.

    Args:
        source: a directory in the ml-100k or ml-1m layout.
        now: the clock for event validation (epoch ms); the wall clock if None.

    Raises:
        LayoutError: the directory is not a known MovieLens layout.
        ValueError: inconsistent files, or events the contract rejects.
    """
    layout = detect_layout(source)
    ratings = read_ratings(source, layout)
    users_raw = read_users(source, layout)
    movies, unknown_genres = read_movies(source, layout)
    ads = build_ads(movies, ratings)
    users = build_users(users_raw, ratings)
    events, counts = build_events(ratings, ads)
    _, rejected = validate_event_table(events, now=now)
    if rejected.num_rows:
        reasons = rejected.column("reason").unique().to_pylist()[:5]
        raise ValueError(
            f"{rejected.num_rows} converted events break the event contract: "
            + "; ".join(reasons)
        )

    release = movies["release_ms"].to_numpy(np.float64)
    first_ms = _first_time_ms(
        ratings.movie_id, ratings.time_s, movies["movie_id"].to_numpy(np.int64)
    )
    moved_back = int(np.sum((first_ms >= 0) & (release > first_ms)))
    raw_age = users_raw.set_index("user_id")["age"]
    raw_age = raw_age[raw_age.index.isin(np.unique(ratings.user_id))]
    times = events.column("event_time")
    manifest: dict[str, Any] = {
        "source": str(source.resolve()),
        "layout": layout,
        "schema_version": SCHEMA_VERSION,
        "counts": {
            "ratings": len(ratings.user_id),
            "positive_ratings": int(counts[:, 1].sum()),
            "events": events.num_rows,
            "users": users.num_rows,
            "users_in_source": len(users_raw),
            "ads": ads.num_rows,
            "ads_rated": int(np.sum(first_ms >= 0)),
            "contents": 0,
        },
        "counts_by_domain_action": {
            domain: {a: int(counts[d, i]) for i, a in enumerate(_ACTIONS)}
            for d, domain in enumerate(vocab.DOMAINS)
        },
        "event_time_range": (
            [_iso(pc.min(times).as_py()), _iso(pc.max(times).as_py())]
            if events.num_rows
            else None
        ),
        "adjustments": {
            "ages_raised_to_min": int(np.sum(raw_age < vocab.MIN_AGE)),
            "ages_lowered_to_max": int(np.sum(raw_age > vocab.MAX_AGE)),
            "ads_created_at_moved_back_to_first_rating": moved_back,
            "ads_without_release_date": int(np.sum(np.isnan(release))),
            "unknown_genre_names": unknown_genres,
        },
        "mapping": _mapping_choices(),
    }
    return Converted(
        events=events,
        users=users,
        ads=ads,
        contents=CONTENT_SCHEMA.empty_table(),
        manifest=manifest,
    )


def _iso(value: Any) -> str:
    """ISO-8601 form of a timezone-aware datetime."""
    return str(value.isoformat())


def _mapping_choices() -> dict[str, Any]:
    """The reading's choices, as recorded in the manifest."""
    return {
        "impression": "every rating, at its timestamp; event_id ml-<user>-<movie>",
        "positive": f"rating >= {POSITIVE_RATING}",
        "click": f"positive rating, impression time + {CLICK_DELAY_MS} ms",
        "conversion": f"positive rating, impression time + {CONVERSION_DELAY_MS} ms",
        "labels_coincide": True,
        "domain_shares": dict(DOMAIN_SHARES),
        "domain_hash": (
            "h = splitmix64((user_id << 32) | movie_id); u = (h >> 11) / 2**53; "
            "domain by cumulative shares in vocab.DOMAINS order; surface = "
            "SURFACES_BY_DOMAIN[domain][splitmix64(h) % len(...)]"
        ),
        "cross_domain_transfer": "not measurable: the domain is a hash, not data",
        "ad_id": "movie id",
        "advertiser_id": "index of the first genre in GENRES (u.genre order)",
        "genres": list(GENRES),
        "campaign_id": "release year, 0 if unknown",
        "ad_format": AD_FORMAT,
        "objective": AD_OBJECTIVE,
        "creative_category": {
            "rule": "first genre (GENRES order) not mapped to entertainment",
            "genre_category": dict(GENRE_CATEGORY),
        },
        "ad_created_at": (
            "release date (1m: Jan 1 of title year), else first rating; "
            "never after the movie's first rating"
        ),
        "age": (
            f"100k years; 1m bucket code; clipped to [{vocab.MIN_AGE}, {vocab.MAX_AGE}]"
        ),
        "gender": {"M": "male", "F": "female", "other": "unknown"},
        "location": f"'US-' + first 3 zip digits, else {UNKNOWN_LOCATION!r}",
        "device": DEVICE,
        "signup_time": "the user's first rating",
        "users": "only users with at least one rating",
        "contents": "none (MovieLens has no organic content)",
    }


# --------------------------------------------------------------------------
# Writing


def write_outputs(converted: Converted, output: Path, *, overwrite: bool) -> None:
    """Write events (hive-partitioned by UTC day), dimensions and the manifest.

    Raises:
        FileExistsError: ``output/events`` exists and ``overwrite`` is False
            (stale day partitions would otherwise mix with the new ones).
    """
    events_dir = output / "events"
    if events_dir.exists():
        if not overwrite:
            raise FileExistsError(
                f"{events_dir} already exists; pass --overwrite to replace it"
            )
        shutil.rmtree(events_dir)
    events_dir.mkdir(parents=True)
    events = converted.events
    times = pc.cast(events.column("event_time"), pa.int64()).to_numpy()
    day = times // _MS_PER_DAY
    starts = np.concatenate([[0], np.flatnonzero(np.diff(day)) + 1])
    ends = np.append(starts[1:], len(day))
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        date = np.datetime64(int(day[start]), "D").astype(str)
        part = events_dir / f"date={date}"
        part.mkdir()
        pq.write_table(events.slice(start, end - start), part / "part-0.parquet")
    pq.write_table(converted.users, output / "users.parquet")
    pq.write_table(converted.ads, output / "ads.parquet")
    pq.write_table(converted.contents, output / "contents.parquet")
    manifest = dict(converted.manifest)
    manifest["counts"] = {**manifest["counts"], "days": len(starts) if len(day) else 0}
    (output / "manifest.json").write_text(
        json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )


def run(source: Path, output: Path, *, overwrite: bool = False) -> dict[str, Any]:
    """Convert ``source`` into ``output``; returns the manifest written."""
    converted = convert(source)
    output.mkdir(parents=True, exist_ok=True)
    write_outputs(converted, output, overwrite=overwrite)
    result: dict[str, Any] = json.loads(
        (output / "manifest.json").read_text(encoding="utf-8")
    )
    return result
