"""The scoring service under load: ``python -m serving`` against Feast's own
feature server (``feast serve``) fetching the same features alone.

A generated world is trained (``trainer.fit --save``), a student distilled
(``trainer.distill --artifacts``), the features applied and materialized to
Feast's SQLite store (and Redis when it answers), and the real servers
started on loopback. Clients are threads, each with its own keep-alive
``http.client`` connection, sending pre-encoded bodies back to back for a
bounded time and request count. Per cell (store, model, candidates,
clients): QPS and p50 / p99 / p999 of the whole request; the peer's cell
times the same three reads the server makes (the user's views, the
candidates', their advertisers') as three ``/get-online-features`` calls.

Then a version swap under load (a new GEM version exported by ``python -m
trainer.export`` while the clients run, and a rollback by ``python -m
serving.versions``), and one request's milliseconds by stage in process.

    .venv/bin/python -m benchmarks.bench_serving [--seconds 3] [--stores sqlite,redis]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from benchmarks.machine import machine_and_load

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = (1, 50, 500)
CLIENTS = (1, 4, 16)
MAX_SEQ_LEN = 32
STUDENT_DOMAIN = "facebook"
SURFACE_INDEX = 0


# ---------------------------------------------------------------- pure helpers


def percentile(sorted_ms: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ascending values, nearest rank (the value
    a ``q`` share of requests stayed at or under)."""
    if not sorted_ms:
        return float("nan")
    rank = max(1, int(np.ceil(q * len(sorted_ms))))
    return float(sorted_ms[min(rank, len(sorted_ms)) - 1])


@dataclass
class Cell:
    """One load cell's outcome."""

    target: str
    store: str
    model: str
    candidates: int
    clients: int
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """Requests, errors, QPS and latency percentiles (ms)."""
        ordered = sorted(self.latencies_ms)
        return {
            "target": self.target,
            "store": self.store,
            "model": self.model,
            "candidates": self.candidates,
            "clients": self.clients,
            "requests": len(ordered),
            "errors": self.errors,
            "qps": len(ordered) / self.seconds if self.seconds else 0.0,
            "p50_ms": percentile(ordered, 0.5),
            "p99_ms": percentile(ordered, 0.99),
            "p999_ms": percentile(ordered, 0.999),
        }


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """Server rows with the peer's p99 beside them: one markdown table.

    ``rows`` are :meth:`Cell.summary` dicts; a ``feast`` row is the peer of
    the server rows of the same store, candidates and clients."""
    peer = {
        (r["store"], r["candidates"], r["clients"]): r
        for r in rows
        if r["target"] == "feast"
    }
    lines = [
        "| store | model | cands | clients | requests | QPS | p50 ms | p99 ms "
        "| p999 ms | errors | feast p99 ms | p99 / feast |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["target"] == "feast":
            continue
        other = peer.get((r["store"], r["candidates"], r["clients"]))
        feast_p99 = f"{other['p99_ms']:.1f}" if other else "-"
        ratio = f"{r['p99_ms'] / other['p99_ms']:.2f}" if other else "-"
        lines.append(
            f"| {r['store']} | {r['model']} | {r['candidates']} | {r['clients']} "
            f"| {r['requests']:,} | {r['qps']:,.0f} | {r['p50_ms']:.1f} "
            f"| {r['p99_ms']:.1f} | {r['p999_ms']:.1f} | {r['errors']} "
            f"| {feast_p99} | {ratio} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- the client


@dataclass(frozen=True)
class Endpoint:
    """A loopback server and what one request is: ``calls`` (path, body)
    POSTed in order on one connection), cycled through."""

    port: int
    requests: list[list[tuple[str, bytes]]]


def load(
    endpoint: Endpoint,
    cell: Cell,
    seconds: float,
    max_requests: int,
    stop: threading.Event | None = None,
) -> Cell:
    """``cell.clients`` threads send requests back to back until ``seconds``
    pass, ``max_requests`` are sent or ``stop`` is set; latencies into ``cell``."""
    stop = stop or threading.Event()
    deadline = time.perf_counter() + seconds
    lock = threading.Lock()
    sent = [0]

    def client(offset: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=60)
        i = offset
        try:
            while time.perf_counter() < deadline and not stop.is_set():
                with lock:
                    if sent[0] >= max_requests:
                        return
                    sent[0] += 1
                calls = endpoint.requests[i % len(endpoint.requests)]
                i += 1
                started = time.perf_counter()
                ok = True
                for path, body in calls:
                    connection.request(
                        "POST", path, body, {"content-type": "application/json"}
                    )
                    response = connection.getresponse()
                    response.read()
                    ok = ok and response.status == 200
                elapsed = (time.perf_counter() - started) * 1000
                with lock:
                    if ok:
                        cell.latencies_ms.append(elapsed)
                    else:
                        cell.errors += 1
        finally:
            connection.close()

    started = time.perf_counter()
    threads = [
        threading.Thread(target=client, args=(k * 7919,)) for k in range(cell.clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cell.seconds = time.perf_counter() - started
    return cell


def _get(port: int, path: str) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


def _wait(predicate: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            value = predicate()
            if value:
                return value
        time.sleep(0.3)
    raise RuntimeError(f"timed out waiting for {what}")


# ---------------------------------------------------------------- the world


@dataclass(frozen=True)
class World:
    """What the servers serve: artifacts, the GEM checkpoint, the Feast
    state, and the ids requests name."""

    root: Path
    artifacts: Path
    checkpoint: Path
    features: Path
    request_ms: int
    users: list[int]
    ad_advertiser: dict[int, int]


def build_world(root: Path, users: int, ads: int, days: int) -> World:
    """Generate, train GEM (``tiny``), distill the student, export both."""
    from benchmarks.generated import generated_features
    from features.feature_tables import (
        EVENT_TIMESTAMP,
        FEATURE_TABLES,
        read_feature_table,
    )
    from pipelines.sources.synthetic import GeneratorConfig
    from trainer.data.feature_output import cut_at_fraction, time_forward_split

    features = root / "f"
    generated_features(
        GeneratorConfig(users=users, ads=ads, days=days, seed=7), root / "gen", features
    )
    time_forward_split(
        features, cut_at_fraction(features, 0.8), root / "train", root / "eval"
    )
    fit = [sys.executable, "-m", "trainer.fit", "--train", str(root / "train")]
    fit += ["--eval", str(root / "eval"), "--metrics-out", str(root / "fit.json")]
    fit += ["--save", str(root / "model"), "--artifacts", str(root / "artifacts")]
    fit += ["--preset", "tiny", "--max-seq-len", str(MAX_SEQ_LEN)]
    fit += ["--batch-size", "256"]
    distill = [
        sys.executable,
        "-m",
        "trainer.distill",
        "--teacher",
        str(root / "model"),
    ]
    distill += ["--examples", str(root / "train"), "--eval", str(root / "eval")]
    distill += ["--domains", STUDENT_DOMAIN, "--methods", "full", "--batch-size", "256"]
    distill += ["--metrics-out", str(root / "distill.json")]
    distill += ["--artifacts", str(root / "artifacts")]
    for command in (fit, distill):
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{command[2]} failed:\n{done.stderr[-3000:]}")
    newest = max(
        int(pc.max(read_feature_table(features, n)[EVENT_TIMESTAMP]).value)
        for n in FEATURE_TABLES
    )
    profiles = read_feature_table(features, "ad_profile").to_pylist()
    user_ids = read_feature_table(features, "user_profile")["user_id"].to_pylist()
    return World(
        root,
        root / "artifacts",
        root / "model",
        features,
        newest + 3_600_000,
        sorted(set(user_ids)),
        {r["ad_id"]: r["advertiser_id"] for r in profiles},
    )


@dataclass(frozen=True)
class Store:
    """One online store, materialized, and how each server reaches it."""

    name: str
    serving_flags: list[str]
    feast_yaml: Path
    teardown: Callable[[], None]


def open_store(world: World, name: str) -> Store:
    """Apply and materialize the world to ``sqlite`` or ``redis``; the
    flags of ``python -m serving`` and a yaml for ``feast serve`` on it."""
    import yaml
    from feast import FeatureStore

    from pipelines.feast import ops as feast_ops

    project = f"b_{uuid.uuid4().hex[:10]}"
    state = world.root / f"feast-{name}"
    state.mkdir(parents=True, exist_ok=True)
    base = "feature_store.yaml" if name == "sqlite" else "feature_store.prod.yaml"
    raw = yaml.safe_load((REPO / "feature_repo" / base).read_text())
    raw["project"], raw["batch_engine"] = project, {"type": "local"}
    if name == "sqlite":
        config = feast_ops.repo_config("local", state_dir=state, project=project)
        flags = ["--feast-state-dir", str(state)]
        raw["registry"]["path"] = str(state / "registry.db")
        raw["online_store"] = {"type": "sqlite", "path": str(state / "online_store.db")}
    else:
        redis = os.environ.get(feast_ops.REDIS_VAR, "127.0.0.1:6379")
        url = f"sqlite:///{state / 'registry.db'}"
        config = feast_ops.repo_config(
            "prod", project=project, registry_url=url, redis=redis
        )
        flags = ["--feast-env", "prod", "--feast-redis", redis]
        flags += ["--feast-registry-url", url]
        raw["registry"]["path"] = url
        raw["online_store"]["connection_string"] = redis
    store = FeatureStore(config=config)
    feast_ops.apply(store, world.features)
    feast_ops.materialize(
        store,
        start=dt.datetime(1970, 1, 2, tzinfo=dt.UTC),
        end=dt.datetime(2100, 1, 1, tzinfo=dt.UTC),
        quiet=True,
    )
    feast_yaml = state / "feature_store.yaml"
    feast_yaml.write_text(yaml.safe_dump(raw))
    return Store(name, [*flags, "--feast-project", project], feast_yaml, store.teardown)


@contextlib.contextmanager
def process(command: list[str], log: Path, ready: Callable[[], Any]) -> Iterator[None]:
    """A server process, yielded once ``ready``; terminated after."""
    server = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        _wait(ready, 300, " ".join(command[:4]))
        yield
    finally:
        server.terminate()
        server.wait(30)


def free_port() -> int:
    """A free loopback port."""
    from launchers.jvm import free_loopback_port

    return free_loopback_port()


@contextlib.contextmanager
def scoring_server(world: World, store: Store) -> Iterator[int]:
    """``python -m serving`` on the world; its port once every model serves."""
    port = free_port()
    command = [sys.executable, "-m", "serving", "--artifacts", str(world.artifacts)]
    command += ["--port", str(port), "--poll-seconds", "0.5", *store.serving_flags]

    def ready() -> bool:
        return all(m["version"] for m in _get(port, "/models")[1].values())

    with process(command, world.root / f"serving-{store.name}.log", ready):
        yield port


@contextlib.contextmanager
def feast_server(world: World, store: Store) -> Iterator[int]:
    """``feast serve`` on the same repository and store (one worker, as the
    scoring server; no worker recycling, which would add restarts)."""
    port = free_port()
    feast = Path(sys.executable).with_name("feast")
    command = [str(feast), "-c", str(REPO / "feature_repo")]
    command += ["-f", str(store.feast_yaml), "serve", "-p", str(port)]
    command += ["--no-access-log", "--workers", "1", "--max-requests", "0"]
    with process(
        command,
        world.root / f"feast-{store.name}.log",
        lambda: _get(port, "/health")[0] == 200,
    ):
        yield port


# ---------------------------------------------------------------- requests


def request_sets(world: World, candidates: int, n: int = 64) -> list[list[int]]:
    """``n`` candidate lists of ``candidates`` distinct ads (seeded)."""
    rng = np.random.default_rng(candidates)
    ads = np.asarray(sorted(world.ad_advertiser), dtype=np.int64)
    return [rng.choice(ads, size=candidates, replace=False).tolist() for _ in range(n)]


def score_bodies(
    world: World, model: str, candidates: int
) -> list[list[tuple[str, bytes]]]:
    """``POST /score`` bodies: users in turn, each with its candidate list."""
    from features.vocab import SURFACES

    return [
        [
            (
                "/score",
                json.dumps(
                    {
                        "user_id": world.users[i % len(world.users)],
                        "domain": STUDENT_DOMAIN,
                        "surface": SURFACES[SURFACE_INDEX],
                        "ad_ids": ads,
                        "request_time_ms": world.request_ms,
                        "model": model,
                    }
                ).encode(),
            )
        ]
        for i, ads in enumerate(request_sets(world, candidates))
    ]


def feast_bodies(world: World, candidates: int) -> list[list[tuple[str, bytes]]]:
    """The same requests as the three reads the scoring server makes."""
    from features.feature_tables import FEATURE_TABLES
    from serving.online import AD_VIEWS, ADVERTISER_VIEWS, USER_VIEWS

    def call(views: Sequence[str], key: str, ids: list[int]) -> tuple[str, bytes]:
        refs = [f"{v}:{f}" for v in views for f in FEATURE_TABLES[v].feature_names]
        body = {"features": refs, "entities": {key: ids}, "full_feature_names": True}
        return "/get-online-features", json.dumps(body).encode()

    return [
        [
            call(USER_VIEWS, "user_id", [world.users[i % len(world.users)]]),
            call(AD_VIEWS, "ad_id", ads),
            call(
                ADVERTISER_VIEWS,
                "advertiser_id",
                [world.ad_advertiser[a] for a in ads],
            ),
        ]
        for i, ads in enumerate(request_sets(world, candidates))
    ]


# ---------------------------------------------------------------- phases


def grid(
    world: World, store: Store, args: argparse.Namespace, models: Sequence[str]
) -> list[dict[str, Any]]:
    """Every (target, model, candidates, clients) cell on one store."""
    rows: list[dict[str, Any]] = []
    with scoring_server(world, store) as port, feast_server(world, store) as peer:
        for candidates in args.candidates:
            targets = [
                (m, Endpoint(port, score_bodies(world, m, candidates))) for m in models
            ]
            targets.append(("feast", Endpoint(peer, feast_bodies(world, candidates))))
            for name, endpoint in targets:
                warm = Cell(name, store.name, name, candidates, 2)
                load(endpoint, warm, min(1.0, args.seconds), 50)
                for clients in args.clients:
                    target = "feast" if name == "feast" else "serving"
                    cell = Cell(target, store.name, name, candidates, clients)
                    load(endpoint, cell, args.seconds, args.max_requests)
                    rows.append(cell.summary())
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def swap_under_load(
    world: World, store: Store, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """GEM at 50 candidates and 4 clients: steady, then while ``trainer.export``
    writes a new version (picked up live), then while ``serving.versions``
    rolls it back; errors and p99 of each window."""
    from features.serving_artifacts import GEM_MODEL

    rows = []
    with scoring_server(world, store) as port:
        endpoint = Endpoint(port, score_bodies(world, GEM_MODEL, 50))
        load(endpoint, Cell("warm", store.name, GEM_MODEL, 50, 4), 1.0, 100)
        steady = Cell("steady", store.name, GEM_MODEL, 50, 4)
        rows.append(load(endpoint, steady, args.swap_seconds, 10**9).summary())
        export = [sys.executable, "-m", "trainer.export"]
        export += ["--checkpoint", str(world.checkpoint)]
        export += ["--artifacts", str(world.artifacts)]
        rollback = [sys.executable, "-m", "serving.versions"]
        rollback += ["--artifacts", str(world.artifacts), "--rollback", GEM_MODEL]
        for name, command in (("export", export), ("rollback", rollback)):
            rows.append(
                swap_window(
                    port, endpoint, Cell(name, store.name, GEM_MODEL, 50, 4), command
                )
            )
            rows[-1]["p99_vs_steady"] = rows[-1]["p99_ms"] / rows[0]["p99_ms"]
            print(json.dumps(rows[-1]), flush=True)
    return rows


def swap_window(
    port: int, endpoint: Endpoint, cell: Cell, command: list[str]
) -> dict[str, Any]:
    """Load from 1 s before ``command`` (which changes GEM's ``current``)
    until 2 s after the server answers with the new version."""
    from features.serving_artifacts import GEM_MODEL

    def served() -> str:
        return str(_get(port, "/models")[1][GEM_MODEL]["version"])

    before, stop = served(), threading.Event()
    runner = threading.Thread(target=load, args=(endpoint, cell, 600.0, 10**9, stop))
    runner.start()
    time.sleep(1.0)
    started = time.monotonic()
    done = subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    written = time.monotonic()
    try:
        if done.returncode:
            raise RuntimeError(f"{command[2]} failed:\n{done.stderr[-2000:]}")
        after = _wait(lambda: (v := served()) != before and v, 180, "the new version")
        swapped = time.monotonic()
        time.sleep(2.0)
    finally:
        stop.set()
        runner.join()
    row = cell.summary()
    row.update(
        before=before,
        after=after,
        command_s=round(written - started, 1),
        pickup_s=round(swapped - written, 1),
    )
    return row


def stages(
    world: World, store: Store, model: str, candidates: int, n: int = 100
) -> dict[str, float]:
    """One request's milliseconds by stage (medians over ``n``), in this
    process on the server's own code: the three Feast reads, building the
    inputs, the exported program, and the whole request with its JSON."""
    import torch

    from serving.app import model_name, score
    from serving.inputs import request_inputs
    from serving.models import Models
    from serving.online import (
        AD_VIEWS,
        ADVERTISER_VIEWS,
        USER_VIEWS,
        FeastSettings,
        OnlineFeatures,
    )
    from serving.schema import ScoreRequest

    torch.set_num_threads(1)
    flags = dict(zip(store.serving_flags[::2], store.serving_flags[1::2], strict=True))
    online = OnlineFeatures(
        FeastSettings(
            env=flags.get("--feast-env", "local"),
            state_dir=Path(flags["--feast-state-dir"])
            if "--feast-state-dir" in flags
            else None,
            project=flags["--feast-project"],
            redis=flags.get("--feast-redis"),
            registry_url=flags.get("--feast-registry-url"),
        )
    )
    models = Models(world.artifacts)
    body = json.loads(score_bodies(world, model, candidates)[0][0][1])
    request = ScoreRequest(**body)
    loaded = models.get(model_name(request))
    assert loaded is not None
    ads = request.ad_ids
    times: dict[str, list[float]] = {}
    clock = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        times.setdefault(name, []).append((now - clock[0]) * 1000)
        clock[0] = now

    for _ in range(n):
        clock[0] = time.perf_counter()
        user = online.read(USER_VIEWS, "user_id", [request.user_id])
        lap("feast user views")
        rows = online.read(AD_VIEWS, "ad_id", ads)
        lap("feast ad views")
        ids = [int(r["ad_profile"]["advertiser_id"]) for r in rows.values]
        adv = online.read(ADVERTISER_VIEWS, "advertiser_id", ids)
        lap("feast advertiser views")
        inputs = request_inputs(
            user_id=request.user_id,
            user=user.values[0],
            ad_ids=ads,
            ads=rows.values,
            advertisers=adv.values,
            domain=request.domain,
            surface=request.surface,
            request_ms=world.request_ms,
            max_seq_len=loaded.manifest.max_seq_len,
        )
        lap("building inputs")
        loaded.score(inputs)
        lap("exported program")
        response = score(request, models, online, 500)
        lap("whole score()")
        response.model_dump_json()
        lap("response JSON")
    return {k: float(np.median(v)) for k, v in times.items()}


# ---------------------------------------------------------------- the run


def cached_world(args: argparse.Namespace) -> World:
    """The world under ``--work`` (built once, reused by later runs)."""
    root = args.work.resolve()
    saved = root / "world.json"
    if saved.exists():
        raw = json.loads(saved.read_text())
        return World(
            root,
            root / "artifacts",
            root / "model",
            root / "f",
            raw["request_ms"],
            raw["users"],
            {int(k): v for k, v in raw["ad_advertiser"].items()},
        )
    world = build_world(root, args.users, args.ads, args.days)
    saved.write_text(
        json.dumps(
            {
                "request_ms": world.request_ms,
                "users": world.users,
                "ad_advertiser": world.ad_advertiser,
            }
        )
    )
    return world


def redis_answers() -> bool:
    """Whether the Redis of ``scripts/services.sh`` is up."""
    import redis

    from pipelines.feast import ops as feast_ops

    host, _, port = os.environ.get(feast_ops.REDIS_VAR, "127.0.0.1:6379").partition(":")
    try:
        return bool(redis.Redis(host=host, port=int(port or 6379)).ping())
    except redis.RedisError:
        return False


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=None, help="world folder (kept)")
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--ads", type=int, default=600, help="at least 500")
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--stores", default="sqlite,redis")
    parser.add_argument("--models", default="student,gem")
    parser.add_argument("--candidates", default=",".join(map(str, CANDIDATES)))
    parser.add_argument("--clients", default=",".join(map(str, CLIENTS)))
    parser.add_argument("--seconds", type=float, default=3.0, help="per cell")
    parser.add_argument("--max-requests", type=int, default=3000, help="per cell")
    parser.add_argument(
        "--swap-seconds",
        type=float,
        default=10.0,
        help="the steady window before the swaps (0: no swap)",
    )
    parser.add_argument(
        "--stage-candidates", default="50", help="candidates of the breakdowns"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON report")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Build (or reuse) the world, run every cell, print the tables."""
    args = build_parser().parse_args(argv)
    args.candidates = [int(c) for c in args.candidates.split(",")]
    args.clients = [int(c) for c in args.clients.split(",")]
    args.stage_candidates = [int(c) for c in args.stage_candidates.split(",")]
    models = args.models.split(",")
    with contextlib.ExitStack() as stack:
        if args.work is None:
            args.work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        args.work.mkdir(parents=True, exist_ok=True)
        world = cached_world(args)
        report: dict[str, Any] = {"machine_before": machine_and_load()}
        report["rows"], report["swap"], report["stages"] = [], [], {}
        for name in args.stores.split(","):
            if name == "redis" and not redis_answers():
                print("redis: not running (scripts/services.sh start), skipped")
                continue
            store = open_store(world, name)
            try:
                report["rows"] += grid(world, store, args, models)
                for model in models:
                    for candidates in args.stage_candidates:
                        report["stages"][f"{name} {model} {candidates}"] = stages(
                            world, store, model, candidates
                        )
                if name == "sqlite" and args.swap_seconds > 0:
                    report["swap"] = swap_under_load(world, store, args)
            finally:
                if name == "redis":
                    store.teardown()
        report["machine_after"] = machine_and_load()
        print(markdown_table(report["rows"]))
        for row in report["swap"]:
            print(json.dumps(row))
        for key, value in report["stages"].items():
            print(key, {k: round(v, 2) for k, v in value.items()})
        print(report["machine_before"], report["machine_after"])
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
