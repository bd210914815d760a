"""Step 9 of ``make demo`` (:mod:`demos.end_to_end`): the scoring service on
the models the demo trained.

The trainer daemon exported its final checkpoint as the ``gem`` serving
version (its ``--artifacts``); ``trainer.distill`` exported each domain's
student. The server loads only what this step asks of it: GEM and one
domain's student, copied beside it into ``<output>/serving`` (each program
takes seconds to load). It reads the online store step 6 filled, answers a
few requests for the most active user of that domain, and is stopped on the
way out, also on Ctrl-C, SIGTERM or an error.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

DOMAIN = "facebook"
"""The domain whose student is served."""
CANDIDATES = 50
"""Candidate ads per request."""
TOP = 5
"""Ads printed per model."""
WARM, TIMED = 2, 3
"""Requests that warm each program up, then requests timed (the median shown)."""
READY_S = 300.0
"""How long the server may take to load its two programs (2 busy cores)."""


def serving_root(output: Path) -> Path:
    """Where the daemon exports GEM and this step serves from."""
    return output / "serving"


def serve_step(output: Path, events: pa.Table) -> dict[str, bool]:
    """Step 9: start ``python -m serving``, score, print, stop; the checks."""
    import pyarrow.parquet as pq

    from features.serving_artifacts import GEM_MODEL, VERSIONS, student_model

    root = serving_root(output)
    students = output / "distill" / "serving" / student_model(DOMAIN)
    failed = {"the server answered with GEM and the student": False}
    if not (root / GEM_MODEL / VERSIONS).is_dir() or not students.is_dir():
        print(f"  nothing to serve: no {root / GEM_MODEL} or {students}")
        return failed
    shutil.rmtree(root / students.name, ignore_errors=True)
    shutil.copytree(students, root / students.name)
    user, surface = _active_user(events, DOMAIN)
    ads = pq.read_table(output / "ads.parquet", columns=["ad_id"])
    candidates = ads.column("ad_id").to_pylist()[:CANDIDATES]
    log_path = output / "serving.log"
    started = time.monotonic()
    with _server(root, output / "feast", log_path) as (url, server):
        models = _wait_ready(url, server, (GEM_MODEL, students.name))
        if models is None:
            print(f"  the server did not come up; log: {log_path}")
            return failed
        print(
            f"  {url}: {', '.join(f'{m} {v}' for m, v in models.items())} "
            f"loaded in {time.monotonic() - started:.1f} s (log: {log_path})"
        )
        print(
            f"  user {user} on {DOMAIN}/{surface}, {len(candidates)} candidate ads; "
            f"top {TOP} by click probability (median latency of {TIMED} requests):"
        )
        answered = 0
        for model in ("student", "gem"):
            body = {"user_id": user, "domain": DOMAIN, "surface": surface}
            body |= {"ad_ids": candidates, "model": model}
            for _ in range(WARM):
                _score(url, body)
            timed = [_timed_score(url, body) for _ in range(TIMED)]
            latency_ms = sorted(ms for ms, _ in timed)[TIMED // 2]
            answer = timed[-1][1]
            if any(a is None for _, a in timed) or answer is None:
                print(f"    {model}: no answer")
                continue
            if len(answer["scores"]) != len(candidates):
                print(f"    {model}: no answer")
                continue
            answered += 1
            top = sorted(answer["scores"], key=lambda s: -s["click"])[:TOP]
            ranked = ", ".join(f"ad {s['ad_id']} {s['click']:.4f}" for s in top)
            cold = " (cold start)" if answer["cold_start"] else ""
            print(f"    {answer['model']:<18}{latency_ms:>6.1f} ms  {ranked}{cold}")
    print("  server stopped")
    return {"the server answered with GEM and the student": answered == 2}


def _active_user(events: pa.Table, domain: str) -> tuple[int, str]:
    """The user with the most events in ``domain``, and their usual surface."""
    import pyarrow.compute as pc

    mine = events.filter(pc.equal(events["domain"], domain))
    counts = mine.group_by(["user_id", "surface"]).aggregate([("user_id", "count")])
    best = pc.sort_indices(counts, [("user_id_count", "descending")])[0].as_py()
    return int(counts["user_id"][best].as_py()), str(counts["surface"][best].as_py())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def _server(
    root: Path, feast_state: Path, log_path: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``python -m serving`` on loopback, its log in ``log_path``; stopped
    (SIGTERM, then SIGKILL) however the block is left."""
    port = _free_port()
    command = [sys.executable, "-m", "serving", "--artifacts", str(root)]
    command += ["--port", str(port), "--threads", "2"]
    command += ["--feast-env", os.environ.get("GEM_FEAST_ENV", "local")]
    command += ["--feast-state-dir", str(feast_state)]
    with open(log_path, "w") as log_file:
        server = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            yield f"http://127.0.0.1:{port}", server
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _wait_ready(
    url: str, server: subprocess.Popen[bytes], names: tuple[str, ...]
) -> dict[str, str] | None:
    """Each of ``names``' version once all are loaded; None if the server
    exits or takes longer than :data:`READY_S`."""
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=5) as response:
                models = json.load(response)
            versions = {n: models.get(n, {}).get("version") for n in names}
            if all(versions.values()):
                return versions
        except (OSError, ValueError):
            pass  # not listening yet
        time.sleep(1.0)
    return None


def _score(url: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """The server's answer, None for an error status."""
    request = urllib.request.Request(
        f"{url}/score", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answer: dict[str, Any] = json.load(response)
            return answer
    except urllib.error.HTTPError as error:
        print(f"    {body['model']}: {error.code} {error.read().decode()[:200]}")
        return None


def _timed_score(url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """One request's wall time on the client (ms) and its answer."""
    started = time.perf_counter()
    answer = _score(url, body)
    return (time.perf_counter() - started) * 1e3, answer
