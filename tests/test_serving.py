"""The scoring service end to end: a tiny generated world, a model trained and
exported by ``trainer.fit --save``, Feast's SQLite online store, and the real
``python -m serving`` (uvicorn) on loopback, spoken to over HTTP.

Online equals offline: the served scores of (user, ad) at a request time
``T`` after every row equal the scores of the same checkpoint, run eagerly by
the trainer's own code, on the contract's point-in-time rows at ``T`` read
straight from the feature tables (per entity, the latest row with
``event_timestamp <= T``), to 1e-5.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from feast import FeatureStore

from benchmarks.bench_feast import REDIS, redis_store
from benchmarks.generated import generated_features
from features.examples import LABEL_COLUMNS
from features.feature_tables import EVENT_TIMESTAMP, FEATURE_TABLES, read_feature_table
from features.model_inputs import DENSE_NAMES, SPARSE_NAMES, sequence_time_buckets
from features.serving_artifacts import (
    CURRENT,
    GEM_MODEL,
    PROGRAM,
    VERSIONS,
    current_version,
    list_versions,
    load_manifest,
    student_model,
)
from features.vocab import DOMAINS, SURFACES
from launchers.jvm import free_loopback_port
from pipelines.feast import ops as feast_ops
from pipelines.sources.synthetic import GeneratorConfig
from trainer import fit as fit_command
from trainer.data.feature_output import (
    cut_at_fraction,
    read_examples,
    time_forward_split,
)
from trainer.data.inputs import make_batch
from trainer.distill.student import StudentConfig, VerticalStudent
from trainer.distill.teacher import load_teacher, teacher_forward
from trainer.export.checkpoints import write_checkpoint
from trainer.export.periodic import PeriodicExport

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[1]
CONFIG = GeneratorConfig(users=300, ads=60, days=3, seed=7)
MAX_SEQ_LEN = 32
SAMPLE = 24
STUDENT_DOMAIN = "facebook"


@dataclass(frozen=True)
class World:
    """The trained artifacts behind a running server."""

    trained: Trained
    url: str
    project: str

    @property
    def features(self) -> Path:
        return self.trained.features

    @property
    def eval(self) -> Path:
        return self.trained.eval

    @property
    def checkpoint(self) -> Path:
        return self.trained.checkpoint

    @property
    def artifacts(self) -> Path:
        return self.trained.artifacts

    @property
    def request_ms(self) -> int:
        return self.trained.request_ms


def _http(url: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    data = (
        raw if raw is not None else None if body is None else json.dumps(body).encode()
    )
    request = urllib.request.Request(
        url, data=data, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as error:
        text, status = error.read().decode(), error.code
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def _wait(predicate: Any, seconds: float) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError("timed out")


@dataclass(frozen=True)
class Trained:
    """The world's features, the GEM checkpoint, and the artifacts of GEM
    (``trainer.fit --save``) and of the facebook student (``trainer.distill``)."""

    root: Path
    features: Path
    eval: Path
    checkpoint: Path
    artifacts: Path
    request_ms: int


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    root = tmp_path_factory.mktemp("serving")
    generated_features(CONFIG, root / "gen", root / "f")
    cut = cut_at_fraction(root / "f", 0.8)
    time_forward_split(root / "f", cut, root / "train", root / "eval")
    argv = ["--train", str(root / "train"), "--eval", str(root / "eval")]
    argv += ["--metrics-out", str(root / "fit.json"), "--save", str(root / "model")]
    argv += ["--artifacts", str(root / "artifacts"), "--preset", "tiny"]
    argv += ["--max-seq-len", str(MAX_SEQ_LEN), "--batch-size", "256"]
    assert fit_command.main(argv) == 0
    gem_version = current_version(root / "artifacts" / GEM_MODEL)
    # The students read the teacher's embedding: the teacher's program (the
    # gem version trainer.fit wrote from the same checkpoint) rides along.
    distill = [
        sys.executable,
        "-m",
        "trainer.distill",
        "--teacher",
        str(root / "model"),
    ]
    distill += ["--examples", str(root / "train"), "--eval", str(root / "eval")]
    distill += ["--domains", STUDENT_DOMAIN, "--methods", "full"]
    distill += ["--metrics-out", str(root / "distill.json"), "--batch-size", "256"]
    distill += ["--artifacts", str(root / "artifacts")]
    done = subprocess.run(
        distill, cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((root / "distill.json").read_text())
    student = Path(report["domains"][STUDENT_DOMAIN]["artifact"])
    manifest = load_manifest(student)
    assert manifest.teacher_embedding_dim > 0
    assert manifest.source["teacher_version"] == gem_version
    assert current_version(root / "artifacts" / GEM_MODEL) == gem_version
    newest = max(
        int(pc.max(read_feature_table(root / "f", n)[EVENT_TIMESTAMP]).value)
        for n in FEATURE_TABLES
    )
    return Trained(
        root,
        root / "f",
        root / "eval",
        root / "model",
        root / "artifacts",
        newest + 3_600_000,
    )


@contextlib.contextmanager
def serve(trained: Trained, log: Path, *flags: str) -> Iterator[str]:
    """``python -m serving`` on the trained artifacts; its URL once every
    model folder serves a version."""
    port = free_loopback_port()
    command = [sys.executable, "-m", "serving", "--artifacts", str(trained.artifacts)]
    command += ["--port", str(port), "--poll-seconds", "0.5", *flags]
    server = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log.open("w")
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(
            lambda: all(m["version"] for m in _http(f"{url}/models")[1].values()),
            240,
        )
        yield url
    finally:
        server.terminate()
        server.wait(30)


@pytest.fixture(scope="module")
def world(trained: Trained) -> Iterator[World]:
    """The trained artifacts served from Feast's SQLite online store."""
    project = f"t_{uuid.uuid4().hex[:10]}"
    state = trained.root / "feast"
    store = FeatureStore(
        config=feast_ops.repo_config("local", state_dir=state, project=project)
    )
    feast_ops.apply(store, trained.features)
    _materialize(store)
    flags = ["--feast-state-dir", str(state), "--feast-project", project]
    with serve(trained, trained.root / "server.log", *flags) as url:
        yield World(trained, url, project)


@pytest.fixture(scope="module")
def redis_world(trained: Trained) -> Iterator[World]:
    """The trained artifacts served from Feast's Redis online store (the
    repository's prod configuration; its SQL registry on a SQLite file)."""
    project = f"t_{uuid.uuid4().hex[:10]}"
    state = trained.root / "feast-prod"
    store = redis_store(state, project)
    feast_ops.apply(store, trained.features)
    try:
        _materialize(store)
        flags = ["--feast-env", "prod", "--feast-project", project]
        flags += ["--feast-redis", REDIS]
        flags += [
            "--feast-registry-url",
            f"sqlite:///{state / f'registry-{project}.db'}",
        ]
        with serve(trained, trained.root / "server-redis.log", *flags) as url:
            yield World(trained, url, project)
    finally:
        store.teardown()  # the project's Redis keys


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.integration)])
def served(request: pytest.FixtureRequest) -> World:
    """The server on each online store."""
    name = "world" if request.param == "sqlite" else "redis_world"
    world: World = request.getfixturevalue(name)
    return world


def _materialize(store: FeatureStore) -> None:
    feast_ops.materialize(
        store,
        start=dt.datetime(1970, 1, 2, tzinfo=dt.UTC),
        end=dt.datetime(2100, 1, 1, tzinfo=dt.UTC),
        quiet=True,
    )


def _as_of(features: Path, name: str, t_ms: int) -> dict[int, dict[str, Any]]:
    """Per entity, the latest row of table ``name`` with timestamp <= t."""
    table = read_feature_table(features, name)
    table = table.filter(pc.less_equal(table[EVENT_TIMESTAMP].cast(pa.int64()), t_ms))
    rows: dict[int, dict[str, Any]] = {}
    for row in table.to_pylist():  # sorted by (entity, time): the last wins
        rows[row[FEATURE_TABLES[name].entity]] = row
    return rows


def _offline_examples(world: World, pairs: list[dict[str, Any]]) -> pa.Table:
    """Example rows (training schema, materialized windows) from the
    point-in-time feature rows at the request time."""
    t = world.request_ms
    tables = {n: _as_of(world.features, n, t) for n in FEATURE_TABLES}
    columns: dict[str, list[Any]] = {n: [] for n in (*SPARSE_NAMES, *DENSE_NAMES)}
    sequences: dict[str, list[list[int]]] = {}
    for pair in pairs:
        user, ad = pair["user_id"], pair["ad_id"]
        profile = tables["ad_profile"][ad]
        values = {
            "user_id": user,
            "ad_id": ad,
            "domain": DOMAINS.index(pair["domain"]) + 1,
            "surface": SURFACES.index(pair["surface"]) + 1,
            "hour_of_day": (t // 3_600_000) % 24 + 1,
            **{k: v for k, v in profile.items() if k in columns},
            **{
                k: v
                for k, v in tables["user_profile"].get(user, {}).items()
                if k in columns
            },
        }
        counters = {
            **tables["user_counters"].get(user, {}),
            **tables["ad_counters"].get(ad, {}),
            **tables["advertiser_counters"].get(profile["advertiser_id"], {}),
        }
        for name in SPARSE_NAMES:
            columns[name].append(values.get(name, 0))
        for name in DENSE_NAMES:
            columns[name].append(counters.get(name, 0.0))
        seq = tables["user_sequence"].get(user)
        times = np.asarray(seq["seq_event_time_ms"] if seq else [], dtype=np.int64)
        keep = np.flatnonzero(times < t)[-MAX_SEQ_LEN:]
        for name in ("seq_item_id", "seq_action", "seq_domain", "seq_surface"):
            sequences.setdefault(name, []).append(
                [int(seq[name][i]) for i in keep] if seq else []
            )
        sequences.setdefault("seq_category", []).append(
            [int(seq["seq_category"][i]) for i in keep] if seq else []
        )
        sequences.setdefault("seq_time_bucket", []).append(
            sequence_time_buckets(times[keep], t).tolist()
        )
    arrays = {
        n: pa.array(v, pa.int64()) for n, v in columns.items() if n in SPARSE_NAMES
    }
    arrays |= {
        n: pa.array(v, pa.float32()) for n, v in columns.items() if n in DENSE_NAMES
    }
    arrays |= {n: pa.array([0] * len(pairs), pa.int8()) for n in LABEL_COLUMNS}
    arrays |= {
        n: pa.array(v, pa.list_(pa.int64() if n == "seq_item_id" else pa.int32()))
        for n, v in sequences.items()
    }
    return pa.table(arrays)


def _sample(world: World, domain: str | None = None) -> list[dict[str, Any]]:
    examples = read_examples(world.eval).slice(0, 400)
    if domain is not None:
        examples = examples.filter(
            pc.equal(examples["domain"], DOMAINS.index(domain) + 1)
        )
    rng = np.random.default_rng(0)
    rows = examples.take(pa.array(rng.choice(examples.num_rows, SAMPLE, replace=False)))
    return [
        {
            "user_id": r["user_id"],
            "ad_id": r["ad_id"],
            "domain": DOMAINS[r["domain"] - 1],
            "surface": SURFACES[r["surface"] - 1],
        }
        for r in rows.to_pylist()
    ]


def test_served_scores_equal_the_checkpoints_offline_scores(served: World) -> None:
    world = served
    pairs = _sample(world)
    teacher = load_teacher(world.checkpoint)
    batch = make_batch(_offline_examples(world, pairs), None, max_seq_len=MAX_SEQ_LEN)
    with torch.no_grad():
        logits = teacher.model.model(batch)
    own = logits[torch.arange(len(pairs)), batch.domain]
    offline = torch.sigmoid(own).numpy()
    for i, pair in enumerate(pairs):
        status, body = _http(
            f"{world.url}/score",
            {
                **{k: pair[k] for k in ("user_id", "domain", "surface")},
                "ad_ids": [pair["ad_id"]],
                "request_time_ms": world.request_ms,
                "model": "gem",
            },
        )
        assert status == 200, body
        served = body["scores"][0]
        np.testing.assert_allclose(
            [served["click"], served["conversion"]], offline[i], atol=1e-5, rtol=0
        )
        assert body["feature_age_ms"] >= 3_600_000
    # Many candidates in one request score as they do alone.
    first = pairs[0]
    ads = [p["ad_id"] for p in pairs]
    status, body = _http(
        f"{world.url}/score",
        {
            **{k: first[k] for k in ("user_id", "domain", "surface")},
            "ad_ids": ads,
            "request_time_ms": world.request_ms,
            "model": "gem",
        },
    )
    assert status == 200
    alone = make_batch(
        _offline_examples(world, [{**first, "ad_id": a} for a in ads]),
        None,
        max_seq_len=MAX_SEQ_LEN,
    )
    with torch.no_grad():
        logits = teacher.model.model(alone)
    want = torch.sigmoid(logits[torch.arange(len(ads)), alone.domain]).numpy()
    got = np.asarray([[s["click"], s["conversion"]] for s in body["scores"]])
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def _student_offline(world: World, pairs: list[dict[str, Any]]) -> np.ndarray:
    """The served student's scores, run eagerly by the trainer's own code: the
    student rebuilt from its program's weights, the teacher's embedding from
    the checkpoint, both on the point-in-time rows."""
    model_dir = world.artifacts / student_model(STUDENT_DOMAIN)
    version = model_dir / VERSIONS / str(current_version(model_dir))
    raw = load_manifest(version).model_config["student"]
    config = StudentConfig(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    )
    student = VerticalStudent(config, torch.zeros(2))
    weights = torch.export.load(version / PROGRAM).state_dict
    student.load_state_dict({k.removeprefix("student."): v for k, v in weights.items()})
    student.eval()
    batch = make_batch(_offline_examples(world, pairs), None, max_seq_len=MAX_SEQ_LEN)
    teacher = load_teacher(world.checkpoint)
    _, embedding = next(teacher_forward(teacher, iter([batch])))
    with torch.no_grad():
        logits = student(batch, torch.from_numpy(embedding)).serving
    return torch.sigmoid(logits).numpy()


def test_the_default_model_is_the_domains_student_and_serves_as_offline(
    served: World,
) -> None:
    world = served
    pairs = _sample(world, STUDENT_DOMAIN)[:12]
    offline = _student_offline(world, pairs)
    served = []
    for pair in pairs:
        status, body = _http(
            f"{world.url}/score",
            {
                **{k: pair[k] for k in ("user_id", "domain", "surface")},
                "ad_ids": [pair["ad_id"]],
                "request_time_ms": world.request_ms,
            },
        )
        assert status == 200, body
        assert body["model"] == student_model(STUDENT_DOMAIN)
        served.append([body["scores"][0]["click"], body["scores"][0]["conversion"]])
    np.testing.assert_allclose(np.asarray(served), offline, atol=1e-5, rtol=0)
    assert len({round(float(v), 6) for v in offline[:, 0]}) > 1  # not a constant


def test_bad_requests_get_a_reason_and_are_counted(world: World) -> None:
    good = {"user_id": 1, "domain": "facebook", "surface": "feed", "ad_ids": [1, 2]}
    cases = [
        ({**good, "model": "gem", "user_id": 10**9}, 200, None),
        ({**good, "model": "gem", "ad_ids": [1, 10**9]}, 404, "unknown ads"),
        ({**good, "model": "gem", "ad_ids": list(range(501))}, 413, "candidates"),
        ({**good, "domain": "nowhere"}, 422, "domain"),
        ({**good, "ad_ids": "x"}, 422, "ad_ids"),
        (
            {**good, "domain": "instagram"},
            503,
            "no loadable version of student-instagram",
        ),
        ({**good, "model": "bert"}, 404, "unknown model"),
    ]
    for body, status, reason in cases:
        got, answer = _http(f"{world.url}/score", body)
        assert got == status, (body, answer)
        if reason is None:
            assert answer["cold_start"] is True
        else:
            assert reason in answer["error"]
            assert "\n" not in answer["error"]
    got, answer = _http(f"{world.url}/score", raw=b'{"user_id": 1,')
    assert got == 400
    assert answer["error"].startswith("malformed JSON")
    with urllib.request.urlopen(f"{world.url}/metrics", timeout=30) as response:
        metrics = response.read().decode()
    for line in (
        'serving_requests_total{reason="unknown ads",status="404"} 1.0',
        'serving_requests_total{reason="malformed JSON",status="400"} 1.0',
        'serving_requests_total{reason="no model yet",status="503"} 1.0',
        'serving_requests_total{reason="cold start",status="200"}',
        "serving_request_seconds_bucket",
        'serving_model_info{model="gem"',
        "serving_feature_age_seconds_count",
    ):
        assert line in metrics, line


def _versions(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "serving.versions", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _gem_version(url: str) -> str:
    status, body = _http(
        f"{url}/score",
        {"user_id": 1, "domain": "facebook", "surface": "feed", "ad_ids": [1]}
        | {"model": "gem"},
    )
    assert status == 200, body
    version: str = body["model_version"]
    return version


def test_a_pinned_server_keeps_its_version_and_a_rollback_swaps_back(
    world: World, tmp_path: Path
) -> None:
    model_dir = world.artifacts / GEM_MODEL
    older = current_version(model_dir)
    newer = write_checkpoint(world.checkpoint, world.artifacts).name
    assert older is not None
    assert newer > older
    _wait(lambda: _gem_version(world.url) == newer, 120)
    # A second server, pinned to the older version, on a copy of gem alone.
    pinned_root = tmp_path / "artifacts"
    shutil.copytree(model_dir, pinned_root / GEM_MODEL)
    trained = dataclasses.replace(world.trained, artifacts=pinned_root)
    state = world.trained.root / "feast"
    flags = ["--feast-state-dir", str(state), "--feast-project", world.project]
    flags += ["--pin", f"{GEM_MODEL}={older}"]
    with serve(trained, tmp_path / "pinned.log", *flags) as pinned:
        assert _http(f"{pinned}/models")[1][GEM_MODEL]["pinned"] == older
        assert _gem_version(pinned) == older
        # Its pointer moves on; the pinned server does not.
        write_checkpoint(world.checkpoint, pinned_root)
        time.sleep(2)
        assert _gem_version(pinned) == older
    # A rollback points current at the version before it; the server swaps.
    listed = _versions("--artifacts", str(world.artifacts))
    assert f"* {GEM_MODEL} {newer}" in listed
    assert f"  {GEM_MODEL} {older}" in listed
    assert _versions("--artifacts", str(world.artifacts), "--rollback", GEM_MODEL) == (
        f"{GEM_MODEL} current {older}\n"
    )
    assert current_version(model_dir) == older
    _wait(lambda: _gem_version(world.url) == older, 120)
    # And forward again, to a named version.
    _versions(
        "--artifacts", str(world.artifacts), "--rollback", GEM_MODEL, "--to", newer
    )
    _wait(lambda: _gem_version(world.url) == newer, 120)


def test_a_new_version_is_swapped_in_and_a_corrupt_one_refused(world: World) -> None:
    model_dir = world.artifacts / "gem"
    before = current_version(model_dir)
    fresh = write_checkpoint(world.checkpoint, world.artifacts).name
    assert fresh != before
    _wait(lambda: _http(f"{world.url}/models")[1]["gem"]["version"] == fresh, 120)
    # A copy with one flipped byte in its program, then pointed at.
    corrupt = model_dir / VERSIONS / "v9999999999999-s0"
    shutil.copytree(model_dir / VERSIONS / fresh, corrupt)
    data = bytearray((corrupt / PROGRAM).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (corrupt / PROGRAM).write_bytes(bytes(data))
    (model_dir / CURRENT).write_text(corrupt.name + "\n")
    refused = _wait(
        lambda: _http(f"{world.url}/models")[1]["gem"]["refused"].get(corrupt.name), 60
    )
    assert "SHA-256" in refused
    status, body = _http(
        f"{world.url}/score",
        {"user_id": 1, "domain": "facebook", "surface": "feed", "ad_ids": [1]}
        | {"model": "gem"},
    )
    assert status == 200
    assert body["model_version"] == fresh


def test_a_daemon_export_runs_when_due_one_at_a_time(
    trained: Trained, tmp_path: Path
) -> None:
    root = tmp_path / "artifacts"
    export = PeriodicExport(root, every_steps=10)
    assert export.checkpoint_written(trained.checkpoint, 5)
    assert not export.checkpoint_written(trained.checkpoint, 20)  # one at a time
    export.close()
    assert (export.exported, export.failed) == (1, 0)
    assert not export.checkpoint_written(trained.checkpoint, 14)  # 9 steps on
    assert export.due(15, time.monotonic())
    assert len(list_versions(root / GEM_MODEL)) == 1
    assert load_manifest(
        root / GEM_MODEL / VERSIONS / str(current_version(root / GEM_MODEL))
    )
