"""The Polars peer of the feature job writes what the reference computes.

test_build's small generated set, plus a file of rows that break each kind of rule and
copies of events (exact, another user, a tie on time and user that the digest
decides), through both; every output is compared as the Beam job's is
(:func:`tests.test_build._assert_same_as_reference`), dead letters included;
MovieLens 100k too, when the shared data is present.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks import polars_peer
from features import vocab
from features.feature_tables import LAYOUT_VERSION
from pipelines.core.event_files import InputFileError
from pipelines.core.reference import (
    ReferenceOutput,
    build_reference,
    read_event_input,
)
from pipelines.sources.synthetic import generate_dataset
from tests.test_build import (
    CONFIG,
    NOW,
    _assert_same_as_reference,
    dead_letters,
    without_time,
)


def _odd_rows(events: pa.Table) -> pa.Table:
    """Rows that break rules, and copies that dedupe must settle."""
    rows = events.to_pylist()
    ad = next(r for r in rows if r["action"] == "impression")
    organic = next(r for r in rows if r["content_id"] is not None)
    click = next(r for r in rows if r["action"] == "click")
    surfaces = vocab.SURFACES_BY_DOMAIN[organic["domain"]]
    elsewhere = next(
        s for s in vocab.SURFACES if s not in vocab.SURFACES_BY_DOMAIN[click["domain"]]
    )
    changes: list[dict[str, Any]] = [
        {"event_id": "bad-domain", "domain": "myspace"},
        {"event_id": "far-future", "event_time": ad["event_time"].replace(year=2100)},
        {"event_id": ""},
        {"event_id": "x" * 300},
        {"event_id": "no-advertiser", "advertiser_id": None},
        {"event_id": "ad-content", "content_id": 5},
        {"event_id": "old", "event_time": ad["event_time"].replace(year=1990)},
        {"event_id": "negative-user", "user_id": -3},
        {"event_id": "ad-impression-id", "impression_id": "i"},
        {},  # an exact copy
        {"user_id": ad["user_id"] + 1},  # a copy under another user
    ]
    odd = [ad | change for change in changes]
    odd += [
        organic | {"event_id": "organic-ad", "ad_id": 3},
        organic | {"event_id": "no-content", "content_id": None},
        click | {"event_id": "lost-click", "impression_id": None},
        click | {"event_id": "wrong-surface", "surface": elsewhere},
        # Two differing copies tied on time and user: the digest decides.
        organic | {"event_id": "tie", "surface": surfaces[0]},
        organic | {"event_id": "tie", "surface": surfaces[1]},
    ]
    return pa.Table.from_pylist(odd, schema=events.schema)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """test_build's generated set, with a file of :func:`_odd_rows`."""
    root = tmp_path_factory.mktemp("gen")
    data, _ = generate_dataset(CONFIG, root)
    pq.write_table(_odd_rows(data.events), root / "events" / "odd.parquet")
    return root


@pytest.fixture(scope="module")
def reference(dataset: Path) -> ReferenceOutput:
    events, origins, users, ads, contents = read_event_input(dataset, NOW)
    return build_reference(events, users, ads, contents, now_ms=NOW, origins=origins)


@pytest.fixture(scope="module")
def peer(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("peer")
    assert polars_peer.main(["--input", str(dataset), "--output", str(out)]) == 0
    return out


def test_outputs_equal_the_reference(peer: Path, reference: ReferenceOutput) -> None:
    _assert_same_as_reference(peer, reference)
    assert reference.counts["events_dead_lettered"] == 13
    assert reference.counts["duplicates_removed"] >= 3


def test_dead_letters_equal_the_reference(
    peer: Path, reference: ReferenceOutput
) -> None:
    letters = dead_letters(peer)
    assert len({letter.reason for letter in letters}) == len(letters)
    assert without_time(letters) == without_time(list(reference.letters))


def test_summary_says_the_layout_and_clock(peer: Path) -> None:
    summary = json.loads((peer / "summary.json").read_text())
    assert summary["now_ms"] == NOW
    assert summary["layout_version"] == LAYOUT_VERSION


def test_jsonl_input_is_left_to_the_reference(dataset: Path, tmp_path: Path) -> None:
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "a.jsonl").write_text("{}\n")
    with pytest.raises(InputFileError, match="Parquet events only"):
        polars_peer.read_input(tmp_path)
