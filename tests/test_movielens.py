"""Tests of the MovieLens conversion (:mod:`pipelines.sources.movielens`).

The tests on real data read GroupLens files in place from the shared data
folder (next to the repository, or ``$GEM_SHARED_DATA``) and
skip when it is absent; the files are never copied into the repository. The
tiny synthetic directories written under ``tmp_path`` test the same logic
without them.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from features import vocab
from features.dimensions import AD_SCHEMA, CONTENT_SCHEMA, USER_SCHEMA
from features.event_table import validate_event_table
from features.events import CLICK_WINDOW, CONVERSION_WINDOW, EVENT_SCHEMA
from pipelines.movielens import main
from pipelines.sources import movielens
from pipelines.sources.movielens import assign_domains, run
from pipelines.sources.movielens_files import GENRES, LayoutError, detect_layout

SHARED_DATA = Path(
    os.environ.get("GEM_SHARED_DATA")
    or Path(__file__).resolve().parents[1].parent / "shared" / "data"
)


def shared_source(name: str) -> Path:
    """A MovieLens folder of the shared data, or skip the test."""
    path = SHARED_DATA / name
    if not path.is_dir():
        pytest.skip(
            f"shared MovieLens data not found at {path} "
            "(set GEM_SHARED_DATA to the folder holding it)"
        )
    return path


def read_events(output: Path) -> pa.Table:
    """All event part files of an output directory, in partition order."""
    parts = sorted((output / "events").glob("date=*/part-0.parquet"))
    assert parts, f"no event partitions under {output / 'events'}"
    return pa.concat_tables(pq.read_table(p) for p in parts)


def time_ms(table: pa.Table, column: str) -> np.ndarray:
    """A timestamp column as epoch milliseconds."""
    millis: np.ndarray = pc.cast(table.column(column), pa.int64()).to_numpy()
    return millis


def assert_valid_output(output: Path) -> pa.Table:
    """Schemas, partitioning and contract validity of one output; its events."""
    for part in (output / "events").glob("date=*/part-0.parquet"):
        table = pq.read_table(part)
        assert table.schema.equals(EVENT_SCHEMA, check_metadata=True), part
        days = np.unique(time_ms(table, "event_time") // 86_400_000)
        assert len(days) == 1, part
        date = np.datetime64(int(days[0]), "D").astype(str)
        assert part.parent.name == f"date={date}"
    for name, schema in (
        ("users", USER_SCHEMA),
        ("ads", AD_SCHEMA),
        ("contents", CONTENT_SCHEMA),
    ):
        table = pq.read_table(output / f"{name}.parquet")
        assert table.schema.equals(schema, check_metadata=True), name
    events = read_events(output)
    valid, rejected = validate_event_table(events)
    assert rejected.num_rows == 0, rejected.column("reason").unique().to_pylist()
    assert valid.num_rows == events.num_rows
    ids = events.column("event_id")
    assert pc.count_distinct(ids).as_py() == events.num_rows
    return events


def assert_attribution(events: pa.Table) -> None:
    """Clicks / conversions follow their impression inside the windows."""
    frame = events.to_pandas()
    frame["ms"] = time_ms(events, "event_time")
    imps = frame[frame["action"] == "impression"].set_index("event_id")
    same = ["user_id", "domain", "surface", "ad_id", "advertiser_id", "campaign_id"]
    for action, window in (("click", CLICK_WINDOW), ("conversion", CONVERSION_WINDOW)):
        follow = frame[frame["action"] == action]
        imp = imps.loc[follow["impression_id"]]
        for column in same:
            assert (follow[column].to_numpy() == imp[column].to_numpy()).all()
        delay = follow["ms"].to_numpy() - imp["ms"].to_numpy()
        assert (delay > 0).all()
        assert (delay <= window / dt.timedelta(milliseconds=1)).all()
    clicks = frame[frame["action"] == "click"].set_index("impression_id")["ms"]
    convs = frame[frame["action"] == "conversion"].set_index("impression_id")["ms"]
    assert sorted(clicks.index) == sorted(convs.index)
    assert (convs.loc[clicks.index].to_numpy() >= clicks.to_numpy()).all()
    assert (np.diff(frame["ms"].to_numpy()) >= 0).all()  # sorted by time


# --------------------------------------------------------------------------
# Real data: ml-100k


@pytest.fixture(scope="module")
def ml100k() -> Path:
    """The shared ml-100k folder (skips when absent)."""
    return shared_source("movielens-100k")


@pytest.fixture(scope="module")
def ml100k_out(ml100k: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ml-100k converted once for the module."""
    output = tmp_path_factory.mktemp("ml100k")
    run(ml100k, output)
    return output


@pytest.fixture(scope="module")
def ml100k_ratings(ml100k: Path) -> pd.DataFrame:
    """u.data read independently of the module under test."""
    return pd.read_csv(
        ml100k / "u.data", sep="\t", header=None, names=["u", "m", "r", "t"]
    )


def test_100k_counts(ml100k_out: Path, ml100k_ratings: pd.DataFrame) -> None:
    """100,000 impressions; clicks = conversions = ratings >= 4."""
    events = read_events(ml100k_out)
    actions = events.column("action").value_counts().to_pylist()
    counts = {c["values"]: c["counts"] for c in actions}
    positives = int((ml100k_ratings["r"] >= 4).sum())
    assert counts == {
        "impression": 100_000,
        "click": positives,
        "conversion": positives,
    }
    manifest = json.loads((ml100k_out / "manifest.json").read_text())
    assert manifest["layout"] == "ml-100k"
    by = manifest["counts_by_domain_action"]
    assert sum(by[d]["impression"] for d in vocab.DOMAINS) == 100_000
    assert sum(by[d]["click"] for d in vocab.DOMAINS) == positives
    assert manifest["counts"]["users"] == 943
    assert manifest["counts"]["ads"] == 1682
    assert pq.read_table(ml100k_out / "contents.parquet").num_rows == 0


def test_100k_valid_and_ordered(ml100k_out: Path) -> None:
    """Schemas, partitions, contract validity, attribution and ordering."""
    events = assert_valid_output(ml100k_out)
    assert_attribution(events)


def test_100k_users_match_u_user(ml100k: Path, ml100k_out: Path) -> None:
    """Every user's age and gender come from u.user."""
    raw = pd.read_csv(
        ml100k / "u.user",
        sep="|",
        header=None,
        names=["user_id", "age", "gender", "occupation", "zip"],
        dtype={"zip": str},
    ).set_index("user_id")
    users = pq.read_table(ml100k_out / "users.parquet").to_pandas()
    users = users.set_index("user_id")
    assert len(users) == len(raw) == 943
    raw = raw.loc[users.index]
    np.testing.assert_array_equal(users["age"], raw["age"].clip(lower=13))
    expected_gender = raw["gender"].map({"M": "male", "F": "female"})
    np.testing.assert_array_equal(users["gender"], expected_gender)
    us = raw["zip"].str.match(r"^\d{3}")
    assert (users.loc[us, "location"] == "US-" + raw.loc[us, "zip"].str[:3]).all()
    assert (users.loc[~us, "location"] == "US-unk").all()
    assert (users["device"] == "other").all()


def test_100k_signup_is_first_rating(
    ml100k_out: Path, ml100k_ratings: pd.DataFrame
) -> None:
    """signup_time = updated_at = the user's first rating."""
    users = pq.read_table(ml100k_out / "users.parquet")
    first = ml100k_ratings.groupby("u")["t"].min() * 1000
    ids = users.column("user_id").to_numpy()
    np.testing.assert_array_equal(time_ms(users, "signup_time"), first.loc[ids])
    np.testing.assert_array_equal(time_ms(users, "updated_at"), first.loc[ids])


def test_100k_ads_join_events(ml100k_out: Path) -> None:
    """Event ad fields equal the ads table; ads exist before their impressions."""
    ads = pq.read_table(ml100k_out / "ads.parquet").to_pandas().set_index("ad_id")
    events = read_events(ml100k_out)
    frame = events.to_pandas()
    row = ads.loc[frame["ad_id"]]
    for column in ("advertiser_id", "campaign_id", "ad_format", "objective"):
        np.testing.assert_array_equal(frame[column], row[column])
    updated = (ads["updated_at"] - pd.Timestamp(0, tz="UTC")) // pd.Timedelta("1ms")
    first = pd.Series(time_ms(events, "event_time")).groupby(frame["ad_id"]).min()
    assert (updated.loc[first.index] <= first).all()
    assert ads.loc[1, "campaign_id"] == 1995  # Toy Story
    assert ads.loc[1, "creative_category"] == "parenting"  # Children's
    assert ads.loc[1, "advertiser_id"] == 3  # Animation
    assert set(ads["creative_category"]) <= set(vocab.CATEGORIES)


def test_100k_domain_shares(ml100k_out: Path) -> None:
    """Impressions split near 50/35/15 over the domains; all surfaces used."""
    events = read_events(ml100k_out)
    imps = events.filter(pc.equal(events.column("action"), "impression"))
    domains = imps.column("domain").to_numpy(zero_copy_only=False)
    for domain, share in movielens.DOMAIN_SHARES.items():
        assert abs(np.mean(domains == domain) - share) < 0.01, domain
    pairs = set(
        zip(
            domains,
            imps.column("surface").to_numpy(zero_copy_only=False),
            strict=True,
        )
    )
    expected = {(d, s) for d, ss in vocab.SURFACES_BY_DOMAIN.items() for s in ss}
    assert pairs == expected


def test_100k_deterministic(ml100k: Path, ml100k_out: Path, tmp_path: Path) -> None:
    """A second conversion writes byte-identical files."""
    again = tmp_path / "again"
    run(ml100k, again)
    first = sorted(p.relative_to(ml100k_out) for p in ml100k_out.rglob("*.*"))
    second = sorted(p.relative_to(again) for p in again.rglob("*.*"))
    assert first == second
    for rel in first:
        assert (ml100k_out / rel).read_bytes() == (again / rel).read_bytes(), rel


# --------------------------------------------------------------------------
# Real data: ml-1m-dev


def test_1m_dev_converts(tmp_path: Path) -> None:
    """The 1m dev split converts quickly and validly."""
    source = shared_source("movielens-1m-dev")
    started = time.perf_counter()
    manifest = run(source, tmp_path / "out")
    elapsed = time.perf_counter() - started
    with (source / "ratings.dat").open("rb") as file:
        ratings = sum(1 for _ in file)
    assert ratings == 438_885
    assert manifest["layout"] == "ml-1m"
    assert manifest["counts"]["ratings"] == ratings
    events = assert_valid_output(tmp_path / "out")
    actions = pc.value_counts(events.column("action")).to_pylist()
    counts = {c["values"]: c["counts"] for c in actions}
    assert counts["impression"] == ratings
    assert (
        counts["click"]
        == counts["conversion"]
        == manifest["counts"]["positive_ratings"]
    )
    users = pq.read_table(tmp_path / "out" / "users.parquet").to_pandas()
    assert set(users["age"]) <= {13, 18, 25, 35, 45, 50, 56}
    assert users["user_id"].max() <= 2999
    assert elapsed < 20, f"1m-dev conversion took {elapsed:.1f} s"


# --------------------------------------------------------------------------
# Tiny synthetic layouts (no shared data needed)


def _ts(text: str) -> int:
    """Epoch seconds of a UTC ISO time."""
    return int(dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp())


def _genre_flags(*names: str) -> str:
    """The 19 u.item genre flags for the named genres."""
    return "|".join("1" if g in names else "0" for g in GENRES)


@pytest.fixture
def tiny_100k(tmp_path: Path) -> Path:
    """A five-rating ml-100k-layout directory with the awkward cases."""
    source = tmp_path / "ml-100k"
    source.mkdir()
    ratings = [
        (1, 10, 5, _ts("1997-10-01T12:00:00")),
        (1, 11, 2, _ts("1997-10-02T12:00:00")),
        (2, 10, 4, _ts("1997-10-01T23:59:59")),  # click crosses midnight
        (2, 12, 3, _ts("1997-10-03T08:00:00")),
        (3, 13, 4, _ts("1998-03-01T08:00:00")),  # rated before its release
    ]
    (source / "u.data").write_text(
        "".join(f"{u}\t{m}\t{r}\t{t}\n" for u, m, r, t in ratings)
    )
    (source / "u.user").write_text(
        "1|24|M|technician|85711\n2|7|F|student|T8H1N\n3|40|M|other|02139\n"
    )
    url = "http://us.imdb.com/M/title-exact?x"
    items = [
        f"10|Misérables, Les (1995)|01-Jan-1995||{url}|{_genre_flags('Drama')}",
        f"11|Toy Story (1995)|01-Jan-1995||{url}|"
        + _genre_flags("Animation", "Children's", "Comedy"),
        f"12|unknown||||{_genre_flags('unknown')}",
        f"13|Future Film (1998)|01-Jun-1998||{url}|{_genre_flags('Musical')}",
        f"14|Never Rated (1960)|05-May-1960||{url}|{_genre_flags('Documentary')}",
    ]
    (source / "u.item").write_bytes(("\n".join(items) + "\n").encode("latin-1"))
    return source


def test_tiny_100k(tiny_100k: Path, tmp_path: Path) -> None:
    """Every rule of the reading on a hand-made ml-100k directory."""
    output = tmp_path / "out"
    manifest = run(tiny_100k, output)
    events = assert_valid_output(output)
    assert_attribution(events)
    assert events.num_rows == 5 + 2 * 3
    assert manifest["counts"]["positive_ratings"] == 3
    by = manifest["counts_by_domain_action"]
    assert sum(c for d in by.values() for c in d.values()) == 11

    frame = events.to_pandas().set_index("event_id")
    assert frame.loc["ml-1-10", "action"] == "impression"
    assert frame.loc["ml-1-10-click", "impression_id"] == "ml-1-10"
    assert frame.loc["ml-1-10-conversion", "impression_id"] == "ml-1-10"
    assert "ml-1-11-click" not in frame.index  # rating 2: negative
    assert (output / "events" / "date=1997-10-02" / "part-0.parquet").is_file()
    midnight = pq.read_table(output / "events" / "date=1997-10-02" / "part-0.parquet")
    assert "ml-2-10-click" in midnight.column("event_id").to_pylist()

    users = pq.read_table(output / "users.parquet").to_pandas().set_index("user_id")
    assert users["age"].to_dict() == {1: 24, 2: 13, 3: 40}
    assert users["gender"].to_dict() == {1: "male", 2: "female", 3: "male"}
    assert users["location"].to_dict() == {1: "US-857", 2: "US-unk", 3: "US-021"}

    ads = pq.read_table(output / "ads.parquet").to_pandas().set_index("ad_id")
    assert ads["advertiser_id"].to_dict() == {10: 8, 11: 3, 12: 0, 13: 12, 14: 7}
    years = {10: 1995, 11: 1995, 12: 0, 13: 1998, 14: 1960}
    assert ads["campaign_id"].to_dict() == years
    assert ads["creative_category"].to_dict() == {
        10: "entertainment",
        11: "parenting",
        12: "entertainment",
        13: "music",
        14: "education",
    }
    assert (ads["ad_format"] == "video").all()
    assert (ads["objective"] == "conversions").all()
    created = ads["created_at"].dt.strftime("%Y-%m-%dT%H:%M:%S").to_dict()
    assert created == {
        10: "1995-01-01T00:00:00",
        11: "1995-01-01T00:00:00",
        12: "1997-10-03T08:00:00",  # unknown release: first rating
        13: "1998-03-01T08:00:00",  # released after its first rating
        14: "1960-05-05T00:00:00",  # never rated: release date, pre-1995 is fine
    }
    assert (ads["updated_at"] == ads["created_at"]).all()
    assert manifest["adjustments"]["ads_created_at_moved_back_to_first_rating"] == 1
    assert manifest["adjustments"]["ages_raised_to_min"] == 1


def test_tiny_1m(tmp_path: Path) -> None:
    """A hand-made ml-1m directory, with a latin-1 title and unrated users."""
    source = tmp_path / "ml-1m"
    source.mkdir()
    (source / "ratings.dat").write_text(
        f"1::1::5::{_ts('2000-12-31T22:12:40')}\n"
        f"1::2::3::{_ts('2000-12-31T22:13:00')}\n"
        f"2::3::4::{_ts('2001-01-05T10:00:00')}\n"
    )
    (source / "users.dat").write_text(
        "1::F::1::10::48067\n2::M::56::16::98107-2117\n3::M::25::15::55117\n"
    )
    movies = (
        "1::Misérables, Les (1995)::Drama|Musical\n"
        "2::Toy Story (1995)::Animation|Children's|Comedy\n"
        "3::No Year Documentary::Documentary\n"
    )
    (source / "movies.dat").write_bytes(movies.encode("latin-1"))
    output = tmp_path / "out"
    manifest = run(source, output)
    assert manifest["layout"] == "ml-1m"
    events = assert_valid_output(output)
    assert_attribution(events)
    assert events.num_rows == 3 + 2 * 2
    users = pq.read_table(output / "users.parquet").to_pandas().set_index("user_id")
    assert list(users.index) == [1, 2]  # user 3 has no rating
    assert users["age"].to_dict() == {1: 13, 2: 56}
    assert users["location"].to_dict() == {1: "US-480", 2: "US-981"}
    ads = pq.read_table(output / "ads.parquet").to_pandas().set_index("ad_id")
    assert ads["campaign_id"].to_dict() == {1: 1995, 2: 1995, 3: 0}
    assert ads["advertiser_id"].to_dict() == {1: 8, 2: 3, 3: 7}
    assert ads["creative_category"].to_dict() == {
        1: "music",
        2: "parenting",
        3: "education",
    }
    assert ads.loc[3, "created_at"] == pd.Timestamp("2001-01-05T10:00:00Z")


# --------------------------------------------------------------------------
# Layout errors, CLI and the domain hash


def test_unknown_layout_is_a_clear_error(tmp_path: Path) -> None:
    """A folder with neither u.data nor ratings.dat names what was looked for."""
    (tmp_path / "README").write_text("not movielens\n")
    with pytest.raises(LayoutError, match=r"u\.data.*ratings\.dat"):
        detect_layout(tmp_path)
    with pytest.raises(LayoutError, match="not a directory"):
        detect_layout(tmp_path / "missing")
    (tmp_path / "ratings.dat").write_text("1::1::5::978300760\n")
    with pytest.raises(LayoutError, match=r"users\.dat, movies\.dat"):
        detect_layout(tmp_path)


def test_cli(
    tiny_100k: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 0 on success, 2 with a message on a bad layout or existing output."""
    output = tmp_path / "out"
    args = ["--source", str(tiny_100k), "--output", str(output)]
    assert main(args) == 0
    assert "ml-100k: 5 ratings -> 11 events" in capsys.readouterr().out
    assert main(args) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--source", str(empty), "--output", str(output)]) == 2
    assert "looked for 'u.data'" in capsys.readouterr().err


def test_domain_hash_is_pinned() -> None:
    """The (user, movie) -> (domain, surface) assignment never changes."""
    domain, surface = assign_domains(
        np.array([1, 1, 2, 196, 943]), np.array([1, 2, 1, 242, 1682])
    )
    assert domain.tolist() == [0, 1, 1, 0, 0]
    assert surface.tolist() == [4, 5, 5, 4, 4]
    many_users = np.repeat(np.arange(1, 1001), 200)
    many_movies = np.tile(np.arange(1, 201), 1000)
    d, s = assign_domains(many_users, many_movies)
    shares = np.bincount(d, minlength=3) / len(d)
    np.testing.assert_allclose(shares, [0.50, 0.35, 0.15], atol=0.005)
    for code, name in enumerate(vocab.DOMAINS):
        allowed = {vocab.SURFACES.index(x) for x in vocab.SURFACES_BY_DOMAIN[name]}
        assert set(s[d == code].tolist()) == allowed
