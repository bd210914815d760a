"""The synthetic event generator: contract, determinism and realism."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from features import vocab
from features.dimensions import AD_SCHEMA, CONTENT_SCHEMA, USER_SCHEMA
from features.event_table import validate_event_table
from features.events import (
    CLICK_WINDOW,
    CONVERSION_WINDOW,
    EVENT_COLUMNS,
    EVENT_SCHEMA,
    validate_event,
)
from pipelines import generate as cli
from pipelines.sources.synthetic import (
    TRUTH_SCHEMA,
    Generated,
    GeneratorConfig,
    ModelParams,
    generate,
    generate_dataset,
    read_events,
    validation_now_ms,
)
from pipelines.sources.synthetic.assemble import id_strings, time_order
from pipelines.sources.synthetic.sampling import SegmentSampler

SMALL = GeneratorConfig(users=3000, ads=300, days=2, seed=11)
# Large enough for rates of rare events to be compared with some confidence.
MEDIUM = GeneratorConfig(users=12000, ads=1000, days=2, seed=5)


@pytest.fixture(scope="module")
def small() -> Generated:
    return generate(SMALL)


@pytest.fixture(scope="module")
def medium() -> Generated:
    return generate(MEDIUM)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The SMALL data set written in both formats."""
    root = tmp_path_factory.mktemp("generated")
    for fmt in ("parquet", "jsonl"):
        generate_dataset(SMALL, root / fmt, fmt)
    return {"parquet": root / "parquet", "jsonl": root / "jsonl"}


def _frame(table: pa.Table) -> pd.DataFrame:
    frame = table.to_pandas()
    frame["t"] = table.column("event_time").cast(pa.int64()).to_numpy()
    return frame


# --- contract ---------------------------------------------------------------


def test_events_have_the_event_schema_and_all_are_valid(small: Generated) -> None:
    assert small.events.schema.equals(EVENT_SCHEMA, check_metadata=True)
    valid, rejected = validate_event_table(
        small.events, now=validation_now_ms(small.config)
    )
    assert rejected.num_rows == 0, rejected.column("reason").to_pylist()[:5]
    assert valid.num_rows == small.events.num_rows > 50_000


def test_dimension_and_truth_tables_have_their_schemas(
    written: dict[str, Path],
) -> None:
    out = written["parquet"]
    for name, schema in (
        ("users", USER_SCHEMA),
        ("ads", AD_SCHEMA),
        ("contents", CONTENT_SCHEMA),
        ("truth", TRUTH_SCHEMA),
    ):
        table = pq.read_table(out / f"{name}.parquet")
        assert table.schema.equals(schema), name
        assert table.num_rows > 0
    users = pq.read_table(out / "users.parquet")
    assert users.num_rows == SMALL.users
    ages = users.column("age").to_numpy()
    assert ages.min() >= 13
    assert ages.max() <= 90
    assert 25 <= np.median(ages) <= 40  # skewed young, long tail
    locations = users.column("location").to_pylist()
    assert all(len(loc) == 5 and loc[2] == "-" for loc in locations)
    assert pq.read_table(out / "ads.parquet").num_rows == SMALL.ads
    assert pq.read_table(out / "contents.parquet").num_rows == SMALL.n_contents


def test_same_seed_gives_identical_events_and_files(
    small: Generated, written: dict[str, Path], tmp_path: Path
) -> None:
    again = generate(SMALL)
    assert again.events.equals(small.events)
    assert again.truth.equals(small.truth)
    generate_dataset(SMALL, tmp_path / "again")
    for path in sorted((written["parquet"] / "events").rglob("*.parquet")):
        twin = tmp_path / "again" / path.relative_to(written["parquet"])
        assert twin.read_bytes() == path.read_bytes()
    other = generate(dataclasses.replace(SMALL, seed=12))
    assert not other.events.equals(small.events)


def test_parquet_and_jsonl_read_back_to_the_same_events(
    small: Generated, written: dict[str, Path]
) -> None:
    from_parquet = read_events(written["parquet"])
    from_jsonl = read_events(written["jsonl"])
    assert from_parquet.schema.equals(EVENT_SCHEMA, check_metadata=True)
    assert from_parquet.equals(small.events)
    assert from_jsonl.equals(small.events)


def test_jsonl_lines_pass_validate_event(written: dict[str, Path]) -> None:
    now = validation_now_ms(SMALL)
    files = sorted((written["jsonl"] / "events").glob("date=*/part-0.jsonl"))
    assert len(files) >= SMALL.days
    lines = 0
    for path in files:
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)
                assert isinstance(record["event_time"], int)
                assert validate_event(record, now=now) is None, record
                lines += 1
    assert lines == read_events(written["parquet"]).num_rows


def test_hive_dataset_reads_exactly_the_event_columns(
    written: dict[str, Path], small: Generated
) -> None:
    dataset = ds.dataset(written["parquet"] / "events", partitioning="hive")
    table = dataset.to_table(columns=list(EVENT_COLUMNS))
    assert table.schema.remove_metadata() == EVENT_SCHEMA.remove_metadata()
    assert table.num_rows == small.events.num_rows
    # Each file holds only events of its own date (follow-ups included).
    for fragment in dataset.get_fragments():
        day = Path(fragment.path).parent.name.removeprefix("date=")
        times = fragment.to_table(columns=["event_time"]).column("event_time")
        dates = {d.isoformat() for d in pc.cast(times, pa.date32()).to_pylist()}
        assert dates == {day}


def test_only_follow_ups_spill_past_the_period(small: Generated) -> None:
    frame = _frame(small.events)
    late = frame[frame["t"] >= SMALL.end_ms]  # follow-ups of late impressions
    assert late["action"].isin(["click", "conversion"]).all()
    assert frame["t"].min() >= SMALL.start_ms
    assert frame["t"].max() < SMALL.end_ms + CONVERSION_WINDOW.total_seconds() * 1000


def test_manifest_records_arguments_counts_and_duplicates(
    written: dict[str, Path], small: Generated
) -> None:
    manifest = json.loads((written["parquet"] / "manifest.json").read_text())
    assert manifest["seed"] == SMALL.seed
    assert manifest["arguments"]["users"] == SMALL.users
    assert manifest["generator_version"]
    assert manifest["events"] == small.events.num_rows
    counted = (
        small.events.group_by(["domain", "action"]).aggregate([("action", "count")])
    ).to_pylist()
    for row in counted:
        assert manifest["counts"][row["domain"]][row["action"]] == row["action_count"]
    total = sum(sum(per.values()) for per in manifest["counts"].values())
    assert total == small.events.num_rows
    assert manifest["duplicates"] == small.duplicates > 0


# --- ids, duplicates, attribution ---------------------------------------------


def test_duplicates_are_exact_copies_and_counted(small: Generated) -> None:
    frame = small.events.to_pandas()
    ids = frame["event_id"]
    assert len(ids) - ids.nunique() == small.duplicates
    # A duplicate is the whole event again, not just a reused id.
    assert len(frame) - len(frame.drop_duplicates()) == small.duplicates
    # ~duplicate_rate of events (binomial, generous bounds).
    expected = SMALL.duplicate_rate * frame["event_id"].nunique()
    assert 0.5 * expected < small.duplicates < 1.5 * expected
    none = generate(dataclasses.replace(SMALL, duplicate_rate=0.0))
    assert none.duplicates == 0
    assert none.events.column("event_id").to_pandas().is_unique


def test_every_follow_up_has_an_earlier_impression_in_its_window(
    small: Generated,
) -> None:
    frame = _frame(small.events).drop_duplicates("event_id")
    impressions = frame[frame["action"] == "impression"].set_index("event_id")
    context = ["user_id", "domain", "surface", "ad_id", "advertiser_id"]
    context += ["campaign_id", "ad_format", "objective"]
    windows = {
        "click": CLICK_WINDOW.total_seconds() * 1000,
        "conversion": CONVERSION_WINDOW.total_seconds() * 1000,
    }
    for action, window in windows.items():
        follow = frame[frame["action"] == action]
        assert len(follow) > 10, action
        assert follow["impression_id"].isin(impressions.index).all()
        imp = impressions.loc[follow["impression_id"]]
        delay = follow["t"].to_numpy() - imp["t"].to_numpy()
        assert (delay > 0).all(), action
        assert (delay < window).all(), action
        for column in context:
            assert (follow[column].to_numpy() == imp[column].to_numpy()).all()
    # One click at most per impression; conversions follow a click.
    clicks = frame[frame["action"] == "click"]
    assert clicks["impression_id"].is_unique
    conversions = frame[frame["action"] == "conversion"]
    assert conversions["impression_id"].isin(clicks["impression_id"]).all()
    merged = conversions.merge(clicks, on="impression_id", suffixes=("", "_click"))
    assert (merged["t"] > merged["t_click"]).all()


def test_truth_covers_each_impression_exactly_once(small: Generated) -> None:
    truth = small.truth.to_pandas()
    events = small.events.to_pandas().drop_duplicates("event_id")
    impression_ids = events.loc[events["action"] == "impression", "event_id"]
    assert truth["impression_id"].is_unique
    assert set(truth["impression_id"]) == set(impression_ids)
    clicked = set(events.loc[events["action"] == "click", "impression_id"])
    converted = set(events.loc[events["action"] == "conversion", "impression_id"])
    assert (truth["clicked"] == truth["impression_id"].isin(clicked)).all()
    assert (truth["converted"] == truth["impression_id"].isin(converted)).all()
    assert ((truth["p_click"] > 0) & (truth["p_click"] < 1)).all()
    assert (truth["p_conversion"] <= truth["p_click"]).all()
    domains = events.set_index("event_id").loc[truth["impression_id"], "domain"]
    assert (domains.to_numpy() == truth["domain"].to_numpy()).all()


def test_events_carry_no_latent_variables(small: Generated) -> None:
    assert small.events.column_names == list(EVENT_COLUMNS)
    names = " ".join(small.events.column_names)
    assert "p_" not in names
    assert "topic" not in names


def test_ad_fields_match_the_ad_table(written: dict[str, Path]) -> None:
    events = read_events(written["parquet"]).to_pandas()
    ads = pq.read_table(written["parquet"] / "ads.parquet").to_pandas()
    ad_events = events[events["action"].isin(vocab.AD_ACTIONS)]
    joined = ad_events.merge(ads, on="ad_id", suffixes=("", "_ad"))
    assert len(joined) == len(ad_events)
    for column in ("advertiser_id", "campaign_id", "ad_format", "objective"):
        assert (joined[column] == joined[f"{column}_ad"]).all(), column
    organic = events[~events["action"].isin(vocab.AD_ACTIONS)]
    assert organic["content_id"].max() < SMALL.n_contents


# --- realism --------------------------------------------------------------------


def test_mix_of_organic_events_and_impressions(medium: Generated) -> None:
    counts = medium.counts
    base = {
        d: sum(n for a, n in per.items() if a not in ("click", "conversion"))
        for d, per in counts.items()
    }
    organic = sum(
        n
        for per in counts.values()
        for a, n in per.items()
        if a in vocab.ORGANIC_ACTIONS
    )
    assert 0.65 <= organic / sum(base.values()) <= 0.75
    # Messages only in messaging; every domain is used by the same users.
    assert counts["facebook"]["message"] == counts["instagram"]["message"] == 0
    assert counts["messaging"]["message"] > 0
    frame = medium.events.select(["user_id", "domain"]).to_pandas()
    per_user = frame.groupby("user_id")["domain"].nunique()
    active = frame["user_id"].value_counts()
    assert (per_user[active[active >= 200].index] == 3).mean() > 0.85
    assert (per_user[active[active >= 50].index] >= 2).mean() > 0.9
    # Domain shares follow the global weights (.5/.35/.15) roughly.
    shares = frame["domain"].value_counts(normalize=True)
    assert shares["facebook"] > shares["instagram"] > shares["messaging"] > 0.05


def test_activity_has_a_heavy_tail() -> None:
    data = generate(GeneratorConfig(users=5000, ads=200, days=2, seed=3))
    per_user = np.bincount(data.events.column("user_id").to_numpy(), minlength=5000)
    assert data.max_events_per_user == per_user.max()
    assert per_user.max() > 25 * per_user.mean()  # log-normal sigma 1.5
    top = np.sort(per_user)[::-1]
    assert top[: len(top) // 100].sum() > 0.12 * top.sum()  # top 1% of users
    assert (per_user == 0).mean() < 0.5


def test_diurnal_pattern(medium: Generated) -> None:
    times = medium.events.column("event_time")
    hours = np.bincount(pc.hour(times).to_numpy(), minlength=24)
    assert hours[19:22].mean() > 3 * hours[2:5].mean()


def test_domains_differ_in_ctr(medium: Generated) -> None:
    truth = medium.truth.to_pandas()
    ctr = truth.groupby("domain")["clicked"].mean()
    assert (ctr > 0.003).all()
    assert (ctr < 0.06).all()
    assert ctr["messaging"] > 1.3 * ctr["facebook"]
    assert ctr["facebook"] > ctr["instagram"]
    # And not by chance: two-proportion z-scores.
    n = truth.groupby("domain")["clicked"].size()
    for high, low in (("messaging", "facebook"), ("messaging", "instagram")):
        pooled = (ctr[high] * n[high] + ctr[low] * n[low]) / (n[high] + n[low])
        se = np.sqrt(pooled * (1 - pooled) * (1 / n[high] + 1 / n[low]))
        assert (ctr[high] - ctr[low]) / se > 3, (high, low)


def test_recent_same_topic_events_raise_ctr_in_observable_data(
    medium: Generated,
) -> None:
    """What a sequence model can see: content categories and declared ad
    categories only (no latent topic)."""
    world = medium.world
    frame = _frame(medium.events).drop_duplicates("event_id")
    organic = frame[frame["content_id"].notna()].copy()
    organic["category"] = world.contents.category[organic["content_id"].astype(int)]
    imps = frame[frame["action"] == "impression"].copy()
    imps["category"] = world.ads.creative_category[imps["ad_id"].astype(int)]
    clicked = set(frame.loc[frame["action"] == "click", "impression_id"])
    imps["clicked"] = imps["event_id"].isin(clicked)
    last = pd.merge_asof(
        imps.sort_values("t"),
        organic[["t", "user_id", "category"]]
        .rename(columns={"t": "t_org"})
        .sort_values("t_org"),
        left_on="t",
        right_on="t_org",
        by=["user_id", "category"],
        allow_exact_matches=False,
    )
    recent = (last["t"] - last["t_org"]) < 3_600_000
    ctr_recent = last.loc[recent, "clicked"].mean()
    ctr_none = last.loc[~recent, "clicked"].mean()
    assert recent.sum() > 1000
    assert (~recent).sum() > 1000
    assert ctr_recent > 2.5 * ctr_none


def test_the_sequence_term_causes_the_recent_topic_lift(medium: Generated) -> None:
    """Same world and timelines without the recent-events term: the lift of
    impressions with recent same-topic events shrinks to what long-term
    interest explains."""

    def lift(data: Generated) -> float:
        recent = data.outcomes.recent > 0
        p = data.outcomes.p_click
        return float(p[recent].mean() / p[~recent].mean())

    params = dataclasses.replace(ModelParams(), click_recent=0.0)
    without = generate(dataclasses.replace(MEDIUM, params=params))
    assert np.array_equal(without.outcomes.recent, medium.outcomes.recent)
    assert lift(medium) > 2.0 * lift(without)
    assert lift(medium) > 4.0


def test_ads_catalogue_structure(medium: Generated) -> None:
    ads = medium.world.ads
    formats = np.asarray(vocab.AD_FORMATS)[ads.ad_format]
    objectives = np.asarray(vocab.AD_OBJECTIVES)[ads.objective]
    ctm = formats == "click_to_message"
    assert (objectives[ctm] == "messages").mean() > 0.7
    accuracy = (ads.creative_category == ads.topic).mean()
    assert 0.8 < accuracy < 0.95  # a noisy view of the latent topic
    per_advertiser = np.bincount(ads.advertiser)
    assert 6 <= per_advertiser.mean() <= 12
    assert per_advertiser.max() > 30
    # Campaigns belong to one advertiser and have one objective.
    frame = pd.DataFrame(
        {"campaign": ads.campaign, "adv": ads.advertiser, "obj": ads.objective}
    )
    assert (frame.groupby("campaign")[["adv", "obj"]].nunique() == 1).all().all()
    # Formats lean to their domains: reels in instagram, click-to-message in
    # messaging.
    events = medium.events.filter(pc.equal(medium.events["action"], "impression"))
    table = events.select(["domain", "ad_format"]).to_pandas()
    share = pd.crosstab(table["domain"], table["ad_format"], normalize="index")
    assert share.loc["messaging", "click_to_message"] > 0.3
    assert share.loc["instagram", "reel"] > share.loc["messaging", "reel"] * 5


def test_organic_events_follow_the_session_intent(medium: Generated) -> None:
    base = medium.base
    organic = base.content >= 0
    theta = medium.world.users.theta
    # Topics of organic events are concentrated on the user's interests.
    interest = theta[base.user[organic], base.topic[organic].astype(int)]
    uniform = 1 / theta.shape[1]
    assert np.median(interest) > 3 * uniform


def test_tiny_and_empty_worlds(tmp_path: Path) -> None:
    # One user, seed chosen so that user has no session at all.
    empty = GeneratorConfig(users=1, ads=1, days=1, seed=2)
    data, manifest = generate_dataset(empty, tmp_path / "empty")
    assert data.events.num_rows == manifest["events"] == 0
    assert read_events(tmp_path / "empty").schema.equals(EVENT_SCHEMA)
    tiny = GeneratorConfig(users=50, ads=3, days=3, contents=2, duplicate_rate=0.5)
    data, _ = generate_dataset(tiny, tmp_path / "tiny", "jsonl")
    _, rejected = validate_event_table(data.events, now=validation_now_ms(tiny))
    assert rejected.num_rows == 0
    assert read_events(tmp_path / "tiny").equals(data.events)


# --- helpers and CLI ------------------------------------------------------------


def test_id_strings_are_fixed_width_and_nullable() -> None:
    numbers = np.array([0, 7, 12345, 99_999_999])
    ids = id_strings("s3-", numbers, 8)
    assert ids.to_pylist() == [
        "s3-00000000",
        "s3-00000007",
        "s3-00012345",
        "s3-99999999",
    ]
    valid = np.array([True, False, True, False])
    ids = id_strings("x", numbers, 12, valid=valid)
    assert ids.to_pylist() == ["x000000000000", None, "x000000012345", None]
    ids.validate(full=True)


def test_time_order_is_stable() -> None:
    times = np.array([5, 3, 5, 1, 3, 5])
    assert time_order(times).tolist() == [3, 1, 4, 0, 2, 5]
    assert time_order(times).tolist() == np.argsort(times, kind="stable").tolist()


def test_segment_sampler_draws_within_each_group() -> None:
    rng = np.random.default_rng(0)
    sampler = SegmentSampler.build([0, 0, 2, 2], [1.0, 3.0, 1.0, 1.0], groups=3)
    assert sampler.nonempty.tolist() == [True, False, True]
    draws = sampler.sample(np.zeros(40_000, dtype=np.int64), rng)
    assert set(np.unique(draws)) == {0, 1}
    assert abs((draws == 1).mean() - 0.75) < 0.01
    draws = sampler.sample(np.full(1000, 2), rng)
    assert set(np.unique(draws)) == {2, 3}


def test_cli_writes_the_output_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli"
    status = cli.main(
        [
            "--users", "300", "--ads", "40", "--days", "2", "--seed", "4",
            "--output", str(out), "--format", "jsonl", "--start", "2026-03-01",
            "--events-per-user-day", "5", "--contents", "100",
            "--duplicate-rate", "0.01",
        ]
    )  # fmt: skip
    assert status == 0
    summary = json.loads(capsys.readouterr().out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert summary["events"] == manifest["events"] > 0
    assert manifest["arguments"]["contents"] == 100
    assert manifest["arguments"]["format"] == "jsonl"
    assert (out / "events" / "date=2026-03-01" / "part-0.jsonl").exists()
    for name in ("users", "ads", "contents", "truth"):
        assert (out / f"{name}.parquet").exists()
    events = read_events(out)
    first = events.column("event_time")[0].as_py()
    assert first >= dt.datetime(2026, 3, 1, tzinfo=dt.UTC)


def test_cli_defaults_are_the_config_s() -> None:
    args = cli.build_parser().parse_args(["--users", "3", "--ads", "2", "--days", "1"])
    assert cli.config_from_args(args) == GeneratorConfig(users=3, ads=2, days=1)


def test_cli_rejects_bad_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sizes = ["--users", "5", "--ads", "5", "--days", "1"]
    out = ["--output", str(tmp_path / "x")]
    for argv in (
        sizes,  # neither --output nor --topic
        ["--users", "0", "--ads", "5", "--days", "1", *out],
        [*sizes, *out, "--duplicate-rate", "2"],
        [*sizes, *out, "--start", "01/10/2026"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        assert exit_info.value.code == 2
    assert not (tmp_path / "x").exists()
    capsys.readouterr()
